"""Raw ASGI middlewares: API-key check and request-body size limit.

Raw ASGI rather than BaseHTTPMiddleware so that streaming responses and client-disconnect
notifications pass through untouched.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backend.server.errors import error_bytes


async def send_error(send: Send, status: int, message: str, code: str, headers: list | None = None) -> None:
    body = error_bytes(status, message, code)
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": raw + (headers or [])})
    await send({"type": "http.response.body", "body": body})


class ApiKeyMiddleware:
    """HTTP paths need ``Authorization: Bearer <key>``: every path but /health, or, with ``key_prefixes``,
    only the paths under them (e.g. /v1 and /metrics beside a mounted UI)."""

    def __init__(self, app: ASGIApp, api_key: str, key_prefixes: tuple[str, ...] | None = None):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.key_prefixes = key_prefixes

    def needs_key(self, path: str) -> bool:
        if self.key_prefixes is None:
            return path != "/health"
        return any(path == p or path.startswith(p.rstrip("/") + "/") for p in self.key_prefixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.needs_key(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers", [])).get(b"authorization", b"")
        if not hmac.compare_digest(given, self.expected):
            reason = "Missing API key" if not given else "Incorrect API key provided"
            await send_error(
                send,
                401,
                f"{reason}: send it as 'Authorization: Bearer <key>'.",
                "invalid_api_key",
                [(b"www-authenticate", b"Bearer")],
            )
            return
        await self.app(scope, receive, send)


class BodySizeLimitMiddleware:
    """Refuses request bodies over ``max_body_bytes`` with 413, whether or not Content-Length is sent.

    The body is read here (up to the limit) and replayed to the app; later receive() calls go to the
    server, so the app still hears about client disconnects.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int):
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers", [])).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            await self._refuse(send, int(length))
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message], receive), send)
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                await self._refuse(send, size)
                return
            if not message.get("more_body", False):
                break
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([body], receive), send)

    async def _refuse(self, send: Send, size: int) -> None:
        message = f"Request body too large: {size} bytes; the limit is {self.max_body_bytes} bytes."
        await send_error(send, 413, message, "request_too_large")


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
