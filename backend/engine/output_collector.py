"""RequestOutputCollector: the hand-over of one request's outputs from the stepping thread to asyncio.

Outputs are cumulative (each holds all text and tokens so far), so the collector keeps only the newest:
a consumer that reads slowly, or not at all, costs one output's memory, never a queue of every token, and
a streaming client that falls behind gets the tokens it missed in one chunk. An error is final: once
put, later outputs are dropped. The stepping thread hands a whole step's outputs to the event loop at
once (AsyncLLM), so ``put_nowait`` runs on the consumer's loop and needs no lock.
"""

from __future__ import annotations

import asyncio

from backend.engine.outputs import RequestOutput


class RequestOutputCollector:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._item: RequestOutput | BaseException | None = None
        self._ready = asyncio.Event()

    def put_nowait(self, item: RequestOutput | BaseException) -> None:
        """On the consumer's event loop: keep the newest output (an error stays once put)."""
        if isinstance(self._item, BaseException):
            return
        self._item = item
        self._ready.set()

    def put(self, item: RequestOutput | BaseException) -> None:
        """Any thread. Raises RuntimeError when the consumer's event loop is closed."""
        self.loop.call_soon_threadsafe(self.put_nowait, item)

    async def get(self) -> RequestOutput:
        """The newest output since the last get(); raises the error if one was put."""
        while True:
            item = self._item
            if isinstance(item, BaseException):
                raise item  # it stays, for any later get()
            if item is not None:
                self._item = None
                return item
            self._ready.clear()
            await self._ready.wait()
