"""URLGuard through a real httpx client: every loopback spelling, private and link-local range, and a
redirect to loopback is refused with a message, and the canary server they point at receives nothing.
Local mode keeps fetching anything."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from backend.monitor.samples import MetricsPoller
from backend.url_guard import MAX_RESPONSE_BYTES, UnsafeURLError, URLGuard, _pin, is_public_address
from tests.security_utils import NON_PUBLIC_URLS, Canary, loopback_spellings


@pytest.fixture(scope="module")
def canary():
    server = Canary()
    yield server
    server.close()


@pytest.fixture(scope="module")
def redirector(canary):
    server = Canary(location=f"{canary.url}/metrics")
    yield server
    server.close()


def public_guard(own_port: int, *allowed: str) -> URLGuard:
    return URLGuard(True, f"http://127.0.0.1:{own_port}", ("*", *allowed))


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("2001:4860:4860::8888", True),
        ("127.0.0.1", False),
        ("0.0.0.0", False),
        ("::1", False),
        ("::ffff:127.0.0.1", False),
        ("::ffff:8.8.8.8", True),
        ("2002:7f00:1::", False),  # 6to4 around 127.0.0.1
        ("64:ff9b::7f00:1", False),  # NAT64 around 127.0.0.1
        ("64:ff9b::808:808", True),  # NAT64 around a public address
        ("::127.0.0.1", False),  # IPv4-compatible (deprecated)
        ("::8.8.8.8", False),  # ... never public, whatever it embeds
        ("::ffff:0:7f00:1", False),  # IPv4-translated (SIIT) around 127.0.0.1
        ("::ffff:0:808:808", True),
        ("64:ff9b:1::7f00:1", False),  # local-use NAT64 (RFC 8215)
        ("64:ff9b:1::808:808", False),
        ("fec0::1", False),  # site-local (deprecated)
        ("169.254.169.254", False),
        ("fe80::1", False),
        ("10.0.0.1", False),
        ("100.64.0.1", False),
        ("224.0.0.1", False),
        ("240.0.0.1", False),
    ],
)
def test_public_addresses(address, public):
    assert is_public_address(address) is public


def test_every_loopback_spelling_is_refused_and_the_canary_hears_nothing(canary):
    guard = public_guard(canary.port + 1)  # the app's own port is another one
    with httpx.Client(transport=guard.transport()) as client:
        for url in loopback_spellings(canary.port):
            with pytest.raises(UnsafeURLError, match="loopback, private, link-local"):
                client.get(url)
    assert canary.hits == []


@pytest.mark.parametrize("url", NON_PUBLIC_URLS)
def test_private_and_link_local_ranges_are_refused_before_connecting(url):
    with pytest.raises(UnsafeURLError, match="loopback, private, link-local or reserved"):
        public_guard(7860).check(url)


def test_the_apps_own_paths_pass_other_paths_on_its_port_do_not(canary):
    guard = URLGuard(True, canary.url, ("*",))
    assert guard.check(f"{canary.url}/metrics") is None and guard.check(f"{canary.url}/v1/models") is None
    for url in (f"{canary.url}/gradio_api/info", f"{canary.url}/secret?x=metrics", f"{canary.url}/v1x"):
        with pytest.raises(UnsafeURLError):
            guard.check(url)
    with httpx.Client(transport=guard.transport()) as client:
        assert client.get(f"{canary.url}/metrics").status_code == 200
    assert canary.hits == ["/metrics"]
    canary.hits.clear()


def test_without_star_only_the_own_api_and_listed_prefixes_are_fetched(canary):
    guard = URLGuard(True, "http://127.0.0.1:7860", (f"{canary.url}/v1",))
    assert guard.check(f"{canary.url}/v1/models") is None  # listed by the owner: trusted as written
    with pytest.raises(UnsafeURLError, match="PLAYGROUND_ALLOWED_URLS"):
        guard.check("http://8.8.8.8/v1")
    with pytest.raises(UnsafeURLError):
        guard.check(f"{canary.url}/v1x")  # a prefix matches whole path segments only


def test_a_redirect_to_loopback_is_refused_and_not_followed(canary, redirector):
    guard = public_guard(7860, redirector.url)  # the owner lists the redirector; not its target
    client = httpx.Client(transport=guard.transport(), follow_redirects=True)
    with client, pytest.raises(UnsafeURLError, match="does not follow redirects"):
        client.get(f"{redirector.url}/metrics")
    poller = MetricsPoller(f"{redirector.url}/metrics", transport=guard.transport())
    assert "does not follow redirects" in poller.poll()["error"]
    assert len(redirector.hits) == 2 and canary.hits == []
    redirector.hits.clear()


def test_the_async_transport_refuses_the_same(canary):
    async def fetch(url: str) -> None:
        async with httpx.AsyncClient(transport=public_guard(7860).async_transport()) as client:
            await client.get(url)

    for url in loopback_spellings(canary.port)[:4]:
        with pytest.raises(UnsafeURLError):
            asyncio.run(fetch(url))
    assert canary.hits == []


@pytest.mark.parametrize("declare_length", [True, False])
def test_a_response_body_over_the_limit_is_cut_off(declare_length):
    """A server the owner listed answers 12 MiB: the read stops at MAX_RESPONSE_BYTES with a message,
    whether it said its length (refused before reading) or not (refused while reading)."""
    big = Canary(body_bytes=12 * 1024 * 1024, declare_length=declare_length)
    guard = public_guard(7860, big.url)
    try:
        too_large = pytest.raises(UnsafeURLError, match=f"reads at most {MAX_RESPONSE_BYTES:,} bytes")
        with httpx.Client(transport=guard.transport()) as client, too_large:
            client.get(f"{big.url}/metrics")
        poller = MetricsPoller(f"{big.url}/metrics", transport=guard.transport())
        assert "reads at most" in poller.poll()["error"]

        async def fetch() -> None:
            async with httpx.AsyncClient(transport=guard.async_transport()) as client:
                await client.get(f"{big.url}/metrics")

        with pytest.raises(UnsafeURLError, match="reads at most"):
            asyncio.run(fetch())
    finally:
        big.close()


def test_the_connection_goes_to_the_checked_address_under_the_original_name():
    request = httpx.Request("GET", "https://models.example.org/v1/models")
    _pin(request, "93.184.216.34")
    assert request.url.host == "93.184.216.34" and request.headers["host"] == "models.example.org"
    assert request.extensions["sni_hostname"] == "models.example.org"  # TLS checks the name, not the IP


def test_local_mode_fetches_anything(canary):
    guard = URLGuard(False, "http://127.0.0.1:7860")
    assert guard.transport() is None and guard.check(f"http://127.1:{canary.port}/x") is None
    poller = MetricsPoller(f"http://127.1:{canary.port}/metrics", transport=guard.transport())
    assert poller.poll().get("error") is None and canary.hits == ["/metrics"]
    canary.hits.clear()
