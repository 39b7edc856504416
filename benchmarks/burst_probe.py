"""BurstProbe: per-request timestamps of a served engine, from the HTTP request's arrival to the first
chunk with text on the socket, and every engine step beside them.

It wraps the ASGI app (arrival; the first SSE chunk whose choice has text, as vLLM's client times TTFT),
AsyncLLM.add_requests (admitted: tokenized and accepted on the event loop) and the engine's
add_processed_request (handed over on the stepping thread; the engine's own RequestMetrics then give the
first scheduled step and the first token). A request's arrival is tied to its id through a context
variable: the endpoint runs in the task the ASGI wrapper was awaited in. Steps come from a StepRecorder.
All times are time.time().
"""

from __future__ import annotations

import contextvars
import json
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks.step_recorder import StepRecord, StepRecorder

TIMED_PATHS = ("/v1/completions", "/v1/chat/completions")


@dataclass(slots=True)
class RequestTimes:
    arrived: float  # the HTTP request reached the app
    request_id: str | None = None
    admitted: float | None = None  # tokenized and accepted by AsyncLLM.add_requests (event loop)
    prompt_tokens: int = 0
    metrics: Any = None  # the engine's RequestMetrics: arrival_time (handed over), first_scheduled_time,
    # first_token_time (the end of the step that sampled it)
    first_chunk: float | None = None  # the first SSE chunk with text was handed to the socket

    @property
    def handed(self) -> float | None:
        return self.metrics.arrival_time if self.metrics is not None else None

    @property
    def first_scheduled(self) -> float | None:
        return self.metrics.first_scheduled_time if self.metrics is not None else None

    @property
    def first_token(self) -> float | None:
        return self.metrics.first_token_time if self.metrics is not None else None


_current: contextvars.ContextVar[RequestTimes | None] = contextvars.ContextVar("burst_probe", default=None)


def has_text(body: bytes) -> bool:
    """True when an SSE body holds a chunk whose first choice has text (completions or chat)."""
    for line in body.split(b"\n"):
        if not line.startswith(b"data: {"):
            continue
        choice = (json.loads(line[6:]).get("choices") or [{}])[0]
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            return True
    return False


@dataclass(slots=True)
class BurstProbe:
    requests: list[RequestTimes] = field(default_factory=list)
    recorder: StepRecorder = field(default_factory=StepRecorder)
    _metrics: dict[str, Any] = field(default_factory=dict)

    def wrap_app(self, app):
        """The ASGI app, timing each completion request's arrival and first chunk with text."""

        async def timed(scope, receive, send):
            if scope["type"] != "http" or scope["path"] not in TIMED_PATHS:
                return await app(scope, receive, send)
            times = RequestTimes(arrived=time.time())
            self.requests.append(times)
            token = _current.set(times)

            async def timed_send(message):
                body = message.get("body", b"") if message["type"] == "http.response.body" else b""
                if times.first_chunk is None and has_text(body):
                    times.first_chunk = time.time()
                await send(message)

            try:
                await app(scope, receive, timed_send)
            finally:
                _current.reset(token)

        return timed

    def attach(self, async_llm) -> None:
        """Hook AsyncLLM.add_requests (event loop; add_request goes through it) and the engine's
        add_processed_request (stepping thread)."""
        add_requests, engine = async_llm.add_requests, async_llm.engine
        add_processed = engine.add_processed_request

        def admitted(requests, *args, **kwargs):
            collectors = add_requests(requests, *args, **kwargs)
            times = _current.get()
            if times is not None and requests:  # a batched completion: timed by its first prompt
                request_id, prompt_token_ids = requests[0][0], requests[0][1]
                times.request_id, times.admitted = request_id, time.time()
                times.prompt_tokens = len(prompt_token_ids)
            return collectors

        def handed(request_id, *args, **kwargs):
            add_processed(request_id, *args, **kwargs)
            self._metrics[request_id] = engine.requests[request_id].metrics

        async_llm.add_requests = admitted
        engine.add_processed_request = handed
        self.recorder.attach(engine)

    def take(self) -> tuple[list[RequestTimes], list[StepRecord]]:
        """The requests seen so far (by arrival, with the engine's metrics) and the steps; then reset."""
        requests, self.requests = sorted(self.requests, key=lambda r: r.arrived), []
        for times in requests:
            times.metrics = self._metrics.get(times.request_id or "")
        self._metrics = {}
        return requests, self.recorder.take()
