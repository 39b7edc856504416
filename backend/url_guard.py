"""URLGuard: which URLs the app fetches on a visitor's behalf (Monitor, Benchmark), checked on every request.

Local mode fetches any http(s) URL. Public mode allows the app's own `/v1` and `/metrics`, the URL prefixes
the owner lists (PLAYGROUND_ALLOWED_URLS, trusted as written), and, when the owner lists `*`, any URL
whose host resolves only to public addresses: never loopback, private, link-local, shared (CGNAT),
multicast or reserved ones, however they are spelled (`127.1`, `2130706433`, `0x7f.1`,
`[::ffff:127.0.0.1]`, `[::ffff:0:127.0.0.1]`, 6to4, Teredo and NAT64 wrappings); IPv4-compatible
(`[::127.0.0.1]`), local-use NAT64 (64:ff9b:1::/48) and site-local (fec0::/10) addresses are never
public. The check runs inside the HTTP transport, so it covers every request a client makes; the
connection goes to the address that was checked (no second DNS lookup for a rebinding server to answer
differently), redirects are refused, not followed, and a response body larger than MAX_RESPONSE_BYTES
is cut off with an error while it is read.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from backend.errors import UserError

DEFAULT_PORTS = {"http": 80, "https": 443}
NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052: the well-known prefix wraps an IPv4 address
SIIT = ipaddress.ip_network("::ffff:0:0:0/96")  # RFC 2765: IPv4-translated addresses wrap one too
NEVER_PUBLIC = (
    ipaddress.ip_network("::/96"),  # IPv4-compatible (RFC 4291 2.5.5.1, deprecated): ::127.0.0.1
    ipaddress.ip_network("64:ff9b:1::/48"),  # local-use NAT64 (RFC 8215): maps to a private network
    ipaddress.ip_network("fec0::/10"),  # site-local (RFC 3879, deprecated)
)
OWN_PATHS = ("/metrics", "/v1")
# A /metrics page is ~100 kB, a benchmark reply a few kB: a larger body is not what we asked for
MAX_RESPONSE_BYTES = 8 * 1024 * 1024


class UnsafeURLError(UserError):
    """A URL public mode does not fetch; the message says why and what is allowed."""


def is_public_address(text: str) -> bool:
    """True for a globally routable unicast address; IPv4 wrapped in IPv6 is judged as the IPv4 inside."""
    address = ipaddress.ip_address(text.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address):
        if any(address in network for network in NEVER_PUBLIC):
            return False
        inner = address.ipv4_mapped or address.sixtofour or (address.teredo[1] if address.teredo else None)
        if inner is None and (address in NAT64 or address in SIIT):
            inner = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if inner is not None:
            return is_public_address(str(inner))
    return address.is_global and not address.is_multicast


def resolve(host: str, port: int) -> list[str]:
    """Every address the host resolves to (an IP literal in any spelling resolves to itself)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise UnsafeURLError(f"cannot resolve {host!r}: {exc}") from None
    return sorted({str(info[4][0]) for info in infos})


@dataclass(slots=True, frozen=True)
class URLGuard:
    is_public: bool = False
    own_origin: str = ""  # this app, e.g. http://127.0.0.1:7860
    allowed_urls: tuple[str, ...] = ()  # owner's URL prefixes; "*" = any URL on public addresses

    def is_own(self, url: httpx.URL) -> bool:
        own = httpx.URL(self.own_origin) if self.own_origin else None
        return (
            own is not None
            and _origin(url) == _origin(own)
            and not url.query
            and not url.fragment
            and any(url.path == p or url.path.startswith(p + "/") for p in OWN_PATHS)
        )

    def check(self, url: str | httpx.URL) -> str | None:
        """The address to connect to (None: as the URL says); UnsafeURLError when the URL is refused."""
        url = httpx.URL(url)
        if url.scheme not in DEFAULT_PORTS or not url.host:
            raise UnsafeURLError(f"only http:// and https:// URLs with a host are fetched, got {str(url)!r}")
        if not self.is_public or self.is_own(url) or self._is_listed(url):
            return None
        where = f"this app's /v1 and /metrics ({self.own_origin})"
        if "*" not in self.allowed_urls:
            listed = ", ".join(self.allowed_urls)
            raise UnsafeURLError(
                f"this public app only fetches {where}{' and ' + listed if listed else ''}; its owner can "
                f"list more in PLAYGROUND_ALLOWED_URLS. Refused: {str(url)!r}"
            )
        if url.userinfo:
            raise UnsafeURLError(f"URLs with a user name or password are not fetched: {str(url)!r}")
        addresses = resolve(url.host, url.port or DEFAULT_PORTS[url.scheme])
        private = [a for a in addresses if not is_public_address(a)]
        if private or not addresses:
            raise UnsafeURLError(
                f"{url.host} resolves to {', '.join(private) or 'nothing'}: a loopback, private, link-local "
                f"or reserved address, which this public app does not fetch (besides {where})"
            )
        return addresses[0]

    def _is_listed(self, url: httpx.URL) -> bool:
        for entry in self.allowed_urls:
            if entry == "*":
                continue
            allowed = httpx.URL(entry)
            prefix = allowed.path.rstrip("/")
            if _origin(url) == _origin(allowed) and (url.path == prefix or url.path.startswith(prefix + "/")):
                return True
        return False

    def checked_response(self, request: httpx.Request, response: httpx.Response) -> httpx.Response:
        if self.is_public and response.has_redirect_location:
            response.close()
            raise UnsafeURLError(
                f"{request.url} answered a redirect to {response.headers.get('location')!r}; "
                "this public app does not follow redirects"
            )
        return response

    def too_large(self, request: httpx.Request, size: int | str) -> UnsafeURLError:
        return UnsafeURLError(
            f"{request.url} sent a response body of {size} bytes; this public app reads at most "
            f"{MAX_RESPONSE_BYTES:,} bytes of one response"
        )

    def check_length(self, request: httpx.Request, response: httpx.Response) -> None:
        """A declared Content-Length over the limit is refused before any byte is read."""
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) > MAX_RESPONSE_BYTES:
            raise self.too_large(request, f"{int(length):,}")

    def transport(self) -> httpx.BaseTransport | None:
        """The checking transport in public mode; None (httpx's own, proxies from the environment) locally."""
        return GuardedTransport(self) if self.is_public else None

    def async_transport(self) -> httpx.AsyncBaseTransport | None:
        return AsyncGuardedTransport(self) if self.is_public else None


def _origin(url: httpx.URL) -> tuple[str, str, int]:
    return url.scheme, url.host.lower(), url.port or DEFAULT_PORTS.get(url.scheme, 0)


def _pin(request: httpx.Request, address: str | None) -> None:
    """Connect to the checked address; the Host header and TLS (SNI, certificate) keep the name."""
    if address is not None:
        request.extensions = {**request.extensions, "sni_hostname": request.url.host}
        request.url = request.url.copy_with(host=address)


class GuardedTransport(httpx.HTTPTransport):
    def __init__(self, guard: URLGuard) -> None:
        super().__init__()
        self.guard = guard

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        _pin(request, self.guard.check(request.url))
        response = self.guard.checked_response(request, super().handle_request(request))
        try:
            self.guard.check_length(request, response)
        except UnsafeURLError:
            response.close()
            raise
        response.stream = LimitedStream(response.stream, self.guard, request)
        return response


class AsyncGuardedTransport(httpx.AsyncHTTPTransport):
    def __init__(self, guard: URLGuard) -> None:
        super().__init__()
        self.guard = guard

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        _pin(request, await asyncio.to_thread(self.guard.check, request.url))  # DNS blocks
        response = await super().handle_async_request(request)
        if self.guard.is_public and response.has_redirect_location:
            await response.aclose()
        response = self.guard.checked_response(request, response)
        try:
            self.guard.check_length(request, response)
        except UnsafeURLError:
            await response.aclose()
            raise
        response.stream = AsyncLimitedStream(response.stream, self.guard, request)
        return response


class LimitedStream(httpx.SyncByteStream):
    """A response body that raises UnsafeURLError once it passes MAX_RESPONSE_BYTES."""

    def __init__(self, stream: Any, guard: URLGuard, request: httpx.Request) -> None:
        self.stream, self.guard, self.request = stream, guard, request

    def __iter__(self) -> Iterator[bytes]:
        seen = 0
        for chunk in self.stream:
            seen += len(chunk)
            if seen > MAX_RESPONSE_BYTES:
                raise self.guard.too_large(self.request, f"more than {MAX_RESPONSE_BYTES:,}")
            yield chunk

    def close(self) -> None:
        self.stream.close()


class AsyncLimitedStream(httpx.AsyncByteStream):
    def __init__(self, stream: Any, guard: URLGuard, request: httpx.Request) -> None:
        self.stream, self.guard, self.request = stream, guard, request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self.stream:
            seen += len(chunk)
            if seen > MAX_RESPONSE_BYTES:
                raise self.guard.too_large(self.request, f"more than {MAX_RESPONSE_BYTES:,}")
            yield chunk

    async def aclose(self) -> None:
        await self.stream.aclose()
