"""Helpers for the SSRF and public-mode tests: a canary HTTP server that records every request it gets,
a redirector that points at it, and the URL spellings that reach loopback."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Canary:
    """An HTTP server on 127.0.0.1 that answers 200 (or redirects to ``location``) and records each hit.
    With ``body_bytes`` it answers that many bytes instead, with a Content-Length or (``declare_length``
    False) without one, the body ending when the connection closes."""

    def __init__(
        self, location: str | None = None, body_bytes: int | None = None, declare_length: bool = True
    ) -> None:
        self.hits: list[str] = []
        canary = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                canary.hits.append(self.path)
                if location is not None:
                    self.send_response(302)
                    self.send_header("Location", location)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if body_bytes is not None:
                    self.send_large(body_bytes)
                    return
                body = b"vllm:num_requests_running 0\n"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def send_large(self, size: int) -> None:
                self.send_response(200)
                if declare_length:
                    self.send_header("Content-Length", str(size))
                else:
                    self.close_connection = True
                self.end_headers()
                line = b"# " + b"x" * 1021 + b"\n"
                try:
                    for _ in range(size // len(line)):
                        self.wfile.write(line)
                except OSError:  # the client stopped reading: that is the point
                    pass

            do_POST = do_GET

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def loopback_spellings(port: int) -> list[str]:
    """URLs that all reach 127.0.0.1:port (or the host itself) however the address is written."""
    return [
        f"http://127.0.0.1:{port}/metrics",
        f"http://localhost:{port}/metrics",
        f"http://127.1:{port}/metrics",
        f"http://2130706433:{port}/metrics",
        f"http://0x7f.1:{port}/metrics",
        f"http://017700000001:{port}/metrics",
        f"http://[::ffff:127.0.0.1]:{port}/metrics",
        f"http://0.0.0.0:{port}/metrics",
    ]


NON_PUBLIC_URLS = [
    "http://169.254.169.254/latest/meta-data/",  # link-local: cloud metadata
    "http://[fe80::1]/metrics",  # IPv6 link-local
    "http://10.1.2.3:8000/metrics",  # private ranges
    "http://172.16.0.1/metrics",
    "http://192.168.1.1/metrics",
    "http://100.64.0.1/metrics",  # shared address space (CGNAT)
    "http://[fd00::1]/metrics",  # IPv6 unique local
    "http://[64:ff9b::7f00:1]/metrics",  # NAT64 wrapping of 127.0.0.1
    "http://[::127.0.0.1]/metrics",  # IPv4-compatible (deprecated) 127.0.0.1
    "http://[::ffff:0:7f00:1]/metrics",  # IPv4-translated (SIIT) 127.0.0.1
    "http://[64:ff9b:1::a00:1]/metrics",  # local-use NAT64 prefix around 10.0.0.1
    "http://[fec0::1]/metrics",  # site-local (deprecated)
]
