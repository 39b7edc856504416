"""merge_streams: the outputs of several engine requests (a batch of prompts in one /v1/completions
request) as one stream of (prompt index, output), in the order they arrive (vLLM's
merge_async_iterators). Closing the merged stream early closes every stream, which aborts the requests
not yet finished; an error in one ends the merged stream with that error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

_DONE = object()


async def merge_streams(streams: list[AsyncIterator[Any]]) -> AsyncGenerator[tuple[int, Any], None]:
    if len(streams) == 1:  # no task needed
        async for item in streams[0]:
            yield 0, item
        return
    queue: asyncio.Queue[tuple[int, Any, BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[Any]) -> None:
        try:
            async for item in stream:
                await queue.put((index, item, None))
        except Exception as exc:  # boundary: this request's error ends the merged stream
            await queue.put((index, None, exc))
        else:
            await queue.put((index, _DONE, None))

    tasks = [asyncio.ensure_future(pump(index, stream)) for index, stream in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item, error = await queue.get()
            if error is not None:
                raise error
            if item is _DONE:
                remaining -= 1
                continue
            yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
