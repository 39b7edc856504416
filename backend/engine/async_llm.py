"""AsyncLLM: a background thread steps the engine; asyncio callers stream outputs and abort requests.

All engine mutation happens on the stepping thread: generate() and abort() only enqueue commands, so a
caller never waits for a model step. Outputs travel back through one asyncio.Queue per request.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import uuid
from collections.abc import AsyncIterator
from typing import Any

from backend.engine.llm import LLM
from backend.engine.outputs import RequestOutput
from backend.engine.sampling_params import SamplingParams


class AsyncLLM:
    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        self.engine = llm.llm_engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._wakeup = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="AsyncLLM-engine", daemon=True)
        self._thread.start()

    @property
    def tokenizer(self) -> Any:
        return self.llm.tokenizer

    @property
    def model_name(self) -> str:
        return self.llm.model_name

    @property
    def max_model_len(self) -> int:
        return self.llm.max_model_len

    def stats(self) -> dict:
        return self.engine.stats()

    async def generate(
        self, prompt: str | list[int], params: SamplingParams | None = None, request_id: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """Stream cumulative outputs of one request; the last has finished=True."""
        if self._stopped:
            raise RuntimeError("AsyncLLM has been shut down")
        params = params if params is not None else SamplingParams()
        request_id = request_id or f"req-{uuid.uuid4().hex}"
        if request_id in self._streams:
            raise ValueError(f"request_id {request_id!r} is already in use")
        text, token_ids = self.engine.process_inputs(prompt, params)
        outputs: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = (asyncio.get_running_loop(), outputs)
        self._send(("add", request_id, text, token_ids, params))
        finished = False
        try:
            while not finished:
                out = await outputs.get()
                if isinstance(out, BaseException):
                    finished = True
                    raise out
                finished = out.finished
                yield out
        finally:
            self._streams.pop(request_id, None)
            if not finished:  # the consumer went away: free the request's blocks
                self._send(("abort", request_id))

    def abort(self, request_id: str) -> None:
        """Thread-safe: the request's stream ends with finish_reason "abort"."""
        self._send(("abort", request_id))

    def shutdown(self) -> None:
        """Abort everything and stop the stepping thread (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        self._send(("stop",))
        self._thread.join()

    def _send(self, command: tuple) -> None:
        self._commands.put(command)
        self._wakeup.set()

    def _run(self) -> None:
        while True:
            self._wakeup.wait()
            self._wakeup.clear()
            if not self._apply_commands():
                return
            while self.engine.has_unfinished_requests() and self._commands.empty():
                try:
                    outputs = self.engine.step()
                except Exception as exc:  # keep serving: fail the requests in flight, free their blocks
                    self._fail_all(exc)
                    break
                for out in outputs:
                    self._deliver(out.request_id, out)
            if not self._commands.empty():
                self._wakeup.set()

    def _apply_commands(self) -> bool:
        """Apply queued adds/aborts; False when asked to stop."""
        while not self._commands.empty():
            command = self._commands.get()
            if command[0] == "add":
                _, request_id, text, token_ids, params = command
                try:
                    self.engine.add_processed_request(request_id, text, token_ids, params)
                except ValueError as exc:
                    self._deliver(request_id, exc)
            elif command[0] == "abort":
                out = self.engine.abort_request(command[1])
                if out is not None:
                    self._deliver(command[1], out)
            else:
                for request_id in list(self.engine.requests):
                    self._deliver(request_id, self.engine.abort_request(request_id))
                return False
        return True

    def _fail_all(self, exc: Exception) -> None:
        for request_id in list(self.engine.requests):
            self.engine.abort_request(request_id)
            self._deliver(request_id, RuntimeError(f"engine step failed: {type(exc).__name__}: {exc}"))

    def _deliver(self, request_id: str, item: RequestOutput | BaseException) -> None:
        stream = self._streams.get(request_id)
        if stream is None:
            return
        loop, outputs = stream
        try:
            loop.call_soon_threadsafe(outputs.put_nowait, item)
        except RuntimeError:  # the caller's event loop is closed: nobody listens any more
            self.engine.abort_request(request_id)
