"""Job: one HTTP request's admitted engine requests (one per prompt) and how they reach the client.

A Job reads every prompt's stream (merged in arrival order), records each one's metrics, and gives back
the client's waiting places (fairness.py) as its prompts start: one place per prompt at its first output,
the rest when the Job ends or is dropped unstarted. Whatever is not finished when the Job ends (the
client left, an error) is aborted, which frees its KV blocks at once. ``run_job`` answers with the whole
body or an SSE stream, and aborts the work when a non-streaming client disconnects (vLLM's
``with_cancellation``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from backend.engine.exceptions import EngineDeadError, EngineGenerateError
from backend.server.errors import OpenAIError, error_body
from backend.server.fairness import WaitingTicket
from backend.server.metrics import ServerMetrics
from backend.server.responses import ResponseFormatter
from backend.server.streams import merge_streams


class Job:
    """One HTTP request's engine requests (one per prompt), with their metrics; those not finished when
    it ends are aborted."""

    def __init__(
        self,
        metrics: ServerMetrics,
        engine,
        streams: list,
        formatter: ResponseFormatter,
        include_usage: bool,
        ticket: WaitingTicket | None = None,
    ):
        self.engine = engine
        self.streams = streams  # (request_id, collector) per prompt
        self.formatter = formatter
        self.include_usage = include_usage
        self.recorders = [metrics.recorder(formatter.model) for _ in streams]
        self.finals: list = [None] * len(streams)  # each prompt's last output
        self.ticket = ticket  # one waiting place per prompt
        self.is_started = [False] * len(streams)
        if ticket is not None:  # a stream that never starts gives its places back when it is dropped
            ticket.hold_until_collected(self)

    def started(self, index: int | None = None) -> None:
        """Prompt ``index`` has its first output (None: the Job is over): its waiting place is given back."""
        if self.ticket is None:
            return
        if index is None:
            self.ticket.leave()
        elif not self.is_started[index]:
            self.is_started[index] = True
            self.ticket.leave(1)

    def abort(self) -> None:
        """Abort every prompt and give back the waiting places (a Job refused before it runs)."""
        for request_id, _ in self.streams:
            self.engine.abort(request_id)
        self.started()

    async def prompt_outputs(self, index: int) -> AsyncIterator:
        request_id, collector = self.streams[index]
        recorder, last, reason = self.recorders[index], None, "abort"
        stream = self.engine.outputs(request_id, collector)
        try:
            async for out in stream:
                self.started(index)
                recorder.on_output(out)
                last = self.finals[index] = out
                yield out
            if last is not None and last.finished:
                reason = last.outputs[0].finish_reason
        except EngineGenerateError:
            reason = "error"
            raise
        finally:
            self.started(index)
            await stream.aclose()  # closing the engine's stream early aborts the request, freeing its blocks
            recorder.on_finish(last, reason)

    async def outputs(self) -> AsyncIterator[tuple[int, object]]:
        """(prompt index, cumulative output) of every prompt, as they come."""
        merged = merge_streams([self.prompt_outputs(i) for i in range(len(self.streams))])
        try:
            async for item in merged:
                yield item
        finally:
            await merged.aclose()
            self.started()
            for (request_id, _), last in zip(self.streams, self.finals, strict=True):
                if last is None or not last.finished:
                    self.engine.abort(request_id)  # a no-op once its stream has aborted it

    async def collect(self) -> dict:
        async for _ in self.outputs():
            pass
        return self.formatter.response(self.finals)

    async def sse(self) -> AsyncIterator[str]:
        for first in self.formatter.first_chunks(self.include_usage):
            yield sse_event(first)
        try:
            async for index, out in self.outputs():
                for chunk in self.formatter.chunks(index, out, self.include_usage):
                    yield sse_event(chunk)
            if self.include_usage:
                yield sse_event(self.formatter.usage_chunk(self.finals))
        except EngineDeadError as exc:  # the status line is sent: tell the client in-band, as vLLM does
            yield sse_event(error_body(503, str(exc), "engine_dead"))
        except Exception as exc:  # boundary: the engine failed this request mid-stream
            yield sse_event(error_body(500, f"{type(exc).__name__}: {exc}"))
        yield "data: [DONE]\n\n"


def sse_event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def run_job(request: Request, job: Job, stream: bool) -> Response:
    if stream:
        return StreamingResponse(
            job.sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
    work = asyncio.ensure_future(job.collect())
    watcher = asyncio.ensure_future(_until_disconnected(request))
    await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if not work.done():  # the client left: cancelling the work aborts the request
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        return Response(status_code=499)
    watcher.cancel()
    try:
        return JSONResponse(work.result())
    except EngineGenerateError as exc:
        raise OpenAIError(500, f"The engine failed this request: {exc}", "engine_error") from None
    except EngineDeadError as exc:
        raise OpenAIError(503, str(exc), "engine_dead", headers={"Retry-After": "5"}) from None
