"""Limits on Gradio's upload route for a public app: bytes per request and files per client per hour.

Gradio serves POST <root>/gradio_api/upload whatever components a page has, and writes every file it gets
into its cache: anyone could fill the disk one small file at a time. This raw ASGI middleware reads an
upload body (at most ``max_file_bytes`` plus the multipart headers; 413 beyond), counts its files (each
multipart part that carries a filename) and refuses with 429 + Retry-After once the client has sent
``max_files`` in the last hour. Gradio's own ``max_file_size`` bounds each file as well, and its
``delete_cache`` removes uploads after an hour (ui/app.py).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backend.server.fairness import client_id
from backend.server.middleware import send_error

UPLOAD_PATH_SUFFIX = "/gradio_api/upload"
MULTIPART_OVERHEAD = 64 * 1024  # part headers and boundaries around the file bytes
WINDOW_S = 3600.0
MAX_CLIENTS_TRACKED = 10_000  # the oldest client's counts are dropped beyond this (bounded memory)


class UploadLimitMiddleware:
    def __init__(self, app: ASGIApp, max_file_bytes: int, max_files: int, forwarded_hops: int = 0) -> None:
        self.app = app
        self.max_body_bytes = max_file_bytes + MULTIPART_OVERHEAD
        self.max_files = max_files
        self.forwarded_hops = forwarded_hops
        self._sent: OrderedDict[str, deque[float]] = OrderedDict()  # client -> times of its recent files

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or scope.get("method") != "POST" or not path.endswith(UPLOAD_PATH_SUFFIX):
            await self.app(scope, receive, send)
            return
        body = await self._read(receive)
        if body is None:
            limit = self.max_body_bytes - MULTIPART_OVERHEAD
            await send_error(
                send, 413, f"An upload may be at most {limit:,} bytes on this public app.", "upload_too_large"
            )
            return
        client = self._client(scope)
        files = max(1, body.count(b'filename="'))
        wait_s = self._admit(client, files, time.monotonic())
        if wait_s is not None:
            message = (
                f"This public app takes at most {self.max_files} uploaded files per client per hour; "
                f"retry in {wait_s:.0f} s."
            )
            await send_error(send, 429, message, "too_many_uploads", [(b"retry-after", b"%d" % wait_s)])
            return
        await self.app(
            scope, _replay({"type": "http.request", "body": body, "more_body": False}, receive), send
        )

    async def _read(self, receive: Receive) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(chunks)
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                return None
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _client(self, scope: Scope) -> str:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        peer = scope.get("client")
        return client_id(peer[0] if peer else None, headers, self.forwarded_hops)

    def _admit(self, client: str, files: int, now: float) -> float | None:
        """None when the client may send ``files`` more now (and they are counted), else seconds to wait."""
        sent = self._sent.setdefault(client, deque())
        self._sent.move_to_end(client)
        while sent and now - sent[0] > WINDOW_S:
            sent.popleft()
        if len(sent) + files > self.max_files:
            return max(1.0, WINDOW_S - (now - sent[0])) if sent else WINDOW_S
        sent.extend([now] * files)
        while len(self._sent) > MAX_CLIENTS_TRACKED:
            self._sent.popitem(last=False)
        return None


def _replay(message: Message, receive: Receive) -> Receive:
    pending = [message]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay
