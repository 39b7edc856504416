"""RequestOutputCollector: the hand-over of one request's outputs from the stepping thread to asyncio.

Outputs are cumulative (each holds all text and tokens so far), so the collector keeps only the newest:
a consumer that reads slowly, or not at all, costs one output's memory, never a queue of every token.
An error is final: once put, later outputs are dropped. At most one wake-up is in flight per request.
"""

from __future__ import annotations

import asyncio
import threading

from backend.engine.outputs import RequestOutput


class RequestOutputCollector:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._item: RequestOutput | BaseException | None = None
        self._has_error = False
        self._wake_pending = False
        self._ready = asyncio.Event()

    def put(self, item: RequestOutput | BaseException) -> None:
        """Any thread. Raises RuntimeError when the consumer's event loop is closed."""
        with self._lock:
            if self._has_error:
                return
            self._item = item
            self._has_error = isinstance(item, BaseException)
            if self._wake_pending:
                return
            self._wake_pending = True
        try:
            self.loop.call_soon_threadsafe(self._wake)
        except RuntimeError:
            with self._lock:
                self._wake_pending = False
            raise

    def _wake(self) -> None:
        with self._lock:
            self._wake_pending = False
        self._ready.set()

    async def get(self) -> RequestOutput:
        """The newest output since the last get(); raises the error if one was put."""
        while True:
            with self._lock:
                item, self._item = self._item, None
                if self._has_error:
                    self._item = item  # an error stays, for any later get()
            if isinstance(item, BaseException):
                raise item
            if item is not None:
                return item
            self._ready.clear()
            await self._ready.wait()
