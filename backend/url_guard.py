"""URLGuard: which URLs the app fetches on a visitor's behalf (Monitor, Benchmark), checked on every request.

Local mode fetches any http(s) URL. Public mode allows the app's own `/v1` and `/metrics`, the URL prefixes
the owner lists (PLAYGROUND_ALLOWED_URLS, trusted as written), and, when the owner lists `*`, any URL
whose host resolves only to public addresses: never loopback, private, link-local, shared (CGNAT),
multicast or reserved ones, however they are spelled (`127.1`, `2130706433`, `0x7f.1`,
`[::ffff:127.0.0.1]`, 6to4/NAT64 wrappings). The check runs inside the HTTP transport, so it covers
every request a client makes; the connection goes to the address that was checked (no second DNS
lookup for a rebinding server to answer differently), and redirects are refused, not followed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass

import httpx

from backend.errors import UserError

DEFAULT_PORTS = {"http": 80, "https": 443}
NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052: the well-known prefix wraps an IPv4 address
OWN_PATHS = ("/metrics", "/v1")


class UnsafeURLError(UserError):
    """A URL public mode does not fetch; the message says why and what is allowed."""


def is_public_address(text: str) -> bool:
    """True for a globally routable unicast address; IPv4 wrapped in IPv6 is judged as the IPv4 inside."""
    address = ipaddress.ip_address(text.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address):
        inner = address.ipv4_mapped or address.sixtofour or (address.teredo[1] if address.teredo else None)
        if inner is None and address in NAT64:
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
        return self.guard.checked_response(request, super().handle_request(request))


class AsyncGuardedTransport(httpx.AsyncHTTPTransport):
    def __init__(self, guard: URLGuard) -> None:
        super().__init__()
        self.guard = guard

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        _pin(request, await asyncio.to_thread(self.guard.check, request.url))  # DNS blocks
        response = await super().handle_async_request(request)
        if self.guard.is_public and response.has_redirect_location:
            await response.aclose()
        return self.guard.checked_response(request, response)
