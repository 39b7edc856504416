"""AsyncLLM: a background thread steps the engine; asyncio callers stream outputs and abort requests.

All engine mutation happens on the stepping thread: add_request() and abort() only enqueue typed commands
(engine_commands.py), so a caller never waits for a model step. add_request() admits a request at once, on the
caller's thread: it validates the prompt and counts it against max_waiting_requests together with every
request accepted but not yet scheduled, so a burst cannot overfill the queue. Outputs travel back through one
RequestOutputCollector per request (newest output only). Whatever a request raises fails that request; if the
stepping thread itself stops, the engine is marked dead (``errored``) and every caller, waiting or new, gets
EngineDeadError at once.

Each step's outputs reach each event loop in one hand-over (one ``call_soon_threadsafe`` per loop per
step, as vLLM's output handler takes one EngineCoreOutputs batch per step), not one wake-up per request.
Given a loader instead of a loaded LLM, the stepping thread loads the model itself, so it is the only
thread of the process that runs OpenMP parallel regions: libgomp keeps a worker pool per thread that
ever ran one, and once its workers outnumber the CPUs every worker sleeps in the kernel between regions
instead of spinning (``gomp_throttled_spin_count_var``), so each of a step's few hundred regions waits
for a wake-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import queue
import threading
import uuid
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from backend.engine.compute_threads import ComputeThreads
from backend.engine.engine_commands import AbortRequest, AddRequest, EngineCommand, Shutdown
from backend.engine.exceptions import EngineDeadError, EngineGenerateError, EngineOverloadedError
from backend.engine.llm import LLM
from backend.engine.output_collector import RequestOutputCollector
from backend.engine.outputs import RequestOutput
from backend.engine.sampling_params import SamplingParams
from backend.engine.stats import EngineStats
from backend.worker_pool import WorkerPool, WorkerTimeout

if TYPE_CHECKING:
    from backend.engine.config import EngineConfig
    from backend.engine.load_phases import LoadPhases

log = logging.getLogger(__name__)
DEFAULT_MAX_WAITING_REQUESTS = 256
# Grammars compile on half the CPUs, as vLLM's StructuredOutputManager does ("CPU-bound ... we would never
# dominate CPU usage with just grammar compilation"); a short line waits for them, then 503.
GRAMMAR_WORKERS = max(1, ((os.cpu_count() or 1) + 1) // 2)
GRAMMAR_MAX_WAITING = 16
# llguidance compiles a grammar within our limits in ~20-600 ms on one core (docs/security.md); past this
# the request is refused, and its thread, which cannot be stopped, keeps its slot until it ends
GRAMMAR_TIMEOUT_S = 10.0
# Tokenizer calls waiting for its one thread; each is bounded in length first (server/limits.py), so this
# line is at most ~1 s of work on one core
TOKENIZER_MAX_WAITING = 64


class AsyncLLM:
    def __init__(
        self,
        llm: LLM | Callable[[], LLM],
        max_waiting_requests: int = DEFAULT_MAX_WAITING_REQUESTS,
        adapt_threads: bool = True,
    ) -> None:
        """llm: a loaded LLM, or a function that loads one on the stepping thread (from_config); its
        error, if any, is raised here. adapt_threads: fit a CPU engine's thread count to the cores other
        processes leave free (compute_threads.py); False keeps the count it starts with."""
        if max_waiting_requests < 0:
            raise ValueError(f"max_waiting_requests must be >= 0, got {max_waiting_requests}")
        self.max_waiting_requests = max_waiting_requests
        self._commands: queue.SimpleQueue[EngineCommand] = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards _collectors, _num_pending and _dead
        self._collectors: dict[str, RequestOutputCollector] = {}
        self._num_pending = 0  # accepted by add_request, not yet handed to the engine
        self._dead: EngineDeadError | None = None
        self._wakeup = threading.Event()
        self._adapt_threads = adapt_threads
        self.compute_threads: ComputeThreads | None = None  # set on the stepping thread once loaded
        # one thread, as vLLM: tokenizers are not safe to share between threads
        self._tokenizer_executor = ThreadPoolExecutor(1, thread_name_prefix="AsyncLLM-tokenizer")
        self._tokenizer_jobs = 0  # submitted to the tokenizer thread, not yet done (under _lock)
        self.grammar_pool = WorkerPool(
            "grammar compiler", GRAMMAR_WORKERS, GRAMMAR_MAX_WAITING, timeout_s=GRAMMAR_TIMEOUT_S
        )
        loaded: Future[LLM] = Future()
        self._thread = threading.Thread(
            target=self._run, args=(llm, loaded), name="AsyncLLM-engine", daemon=True
        )
        self._thread.start()
        self.llm = loaded.result()
        self.engine = self.llm.llm_engine

    @classmethod
    def from_config(
        cls,
        config: EngineConfig,
        phases: LoadPhases | None = None,
        max_waiting_requests: int = DEFAULT_MAX_WAITING_REQUESTS,
        adapt_threads: bool = True,
    ) -> AsyncLLM:
        """Load config's model on the stepping thread (see the module docstring) and serve it."""
        return cls(lambda: LLM(phases=phases, **asdict(config)), max_waiting_requests, adapt_threads)

    @property
    def tokenizer(self) -> Any:
        return self.llm.tokenizer

    @property
    def model_name(self) -> str:
        return self.llm.model_name

    @property
    def max_model_len(self) -> int:
        return self.llm.max_model_len

    @property
    def errored(self) -> bool:
        """True once the stepping thread has stopped (shut down or died): nothing more is served."""
        return self._dead is not None

    def stats(self) -> EngineStats:
        with self._lock:  # the stepping thread adds a request, then uncounts it under this lock
            stats = self.engine.stats()
            stats.num_requests_waiting += self._num_pending
        return stats

    async def run_in_tokenizer(self, function: Callable[..., Any], *args: Any) -> Any:
        """Run a tokenizer call (encode, chat template) off the event loop, on the tokenizer thread;
        EngineOverloadedError when TOKENIZER_MAX_WAITING calls already wait for it; EngineDeadError once
        the engine is shut down (a request that got the engine just before a relaunch stopped it)."""
        with self._lock:
            if self._dead is not None:
                raise self._dead
            if self._tokenizer_jobs > TOKENIZER_MAX_WAITING:
                raise EngineOverloadedError(
                    f"The server is overloaded: {self._tokenizer_jobs} requests wait for the tokenizer. "
                    "Retry later."
                )
            self._tokenizer_jobs += 1
        loop = asyncio.get_running_loop()
        try:
            future = self._tokenizer_executor.submit(functools.partial(function, *args))
        except RuntimeError:  # "cannot schedule new futures after shutdown": shut down since the check
            self._tokenizer_done(None)
            raise EngineDeadError("the engine was shut down") from None
        except BaseException:
            self._tokenizer_done(None)
            raise
        future.add_done_callback(self._tokenizer_done)  # counted until it ends, even if its caller left
        return await asyncio.wrap_future(future, loop=loop)

    def _tokenizer_done(self, _future: Future | None) -> None:
        with self._lock:
            self._tokenizer_jobs -= 1

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        prompt: str | None = None,
        max_waiting_requests: int | None = None,
    ) -> RequestOutputCollector:
        """Admit one tokenized request now, or raise: ValueError (bad input), EngineOverloadedError (more
        than max_waiting_requests, or the caller's stricter limit, already wait), EngineDeadError.
        Read its outputs with outputs(request_id, collector)."""
        (collector,) = self.add_requests(
            [(request_id, prompt_token_ids, params, prompt)], max_waiting_requests
        )
        return collector

    def add_requests(
        self, requests: list[tuple[str, list[int], SamplingParams, str | None]], max_waiting_requests=None
    ) -> list[RequestOutputCollector]:
        """Admit a batch of (request_id, prompt_token_ids, params, prompt) all at once or none of them
        (the errors of add_request): the whole batch must fit the waiting-queue limit, and every
        request's grammar must be compiled already."""
        ids = [self.engine.process_inputs(token_ids, params)[1] for _, token_ids, params, _ in requests]
        for _, _, params, _ in requests:
            if params.structured_outputs is not None and params.structured_outputs.compiled is None:
                raise ValueError(  # the engine thread must never compile: a caller's bug, said plainly
                    "structured outputs must be compiled before add_request: "
                    "await compile_structured_output()"
                )
        limit = self.max_waiting_requests
        if max_waiting_requests is not None:
            limit = min(limit, max_waiting_requests)
        if len(requests) > max(1, limit):  # it could never be admitted (a single request: a 503)
            raise ValueError(
                f"a batch of {len(requests)} prompts exceeds the waiting-queue limit of {limit}: "
                f"send at most {limit} prompts per request"
            )
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._dead is not None:
                raise self._dead
            seen: set[str] = set()
            for request_id, *_ in requests:
                if request_id in self._collectors or request_id in seen:
                    raise ValueError(f"request_id {request_id!r} is already in use")
                seen.add(request_id)
            waiting = self._num_pending + len(self.engine.scheduler.waiting)
            if waiting + len(requests) > limit:
                raise EngineOverloadedError(
                    f"The server is overloaded: {waiting} requests are waiting (the limit is {limit}). "
                    "Retry later."
                )
            collectors = [RequestOutputCollector(loop) for _ in requests]
            for (request_id, *_), collector in zip(requests, collectors, strict=True):
                self._collectors[request_id] = collector
            self._num_pending += len(requests)
        for (request_id, _, params, prompt), token_ids in zip(requests, ids, strict=True):
            self._send(AddRequest(request_id, prompt, token_ids, params))
        return collectors

    async def outputs(
        self, request_id: str, collector: RequestOutputCollector
    ) -> AsyncGenerator[RequestOutput, None]:
        """Cumulative outputs of an admitted request; the last has finished=True. Closing the iterator
        early aborts the request, which frees its KV blocks at once."""
        finished = False
        try:
            while not finished:
                out = await collector.get()
                finished = out.finished
                yield out
        finally:
            with self._lock:
                self._collectors.pop(request_id, None)
            if not finished:  # the consumer went away (or the request failed: then a no-op)
                self._send(AbortRequest(request_id))

    async def compile_structured_output(self, params: SamplingParams) -> None:
        """Compile the request's grammar on the grammar pool and attach it to the params, so that the
        engine thread never compiles. ValueError: over a limit, not compilable, or compiling took longer
        than the pool's time limit; WorkerPoolFull: the pool and its line are full (retry later)."""
        structured = params.structured_outputs
        if structured is None or structured.compiled is not None:
            return
        if self._dead is not None:  # the grammar pool is shut down with the engine
            raise self._dead
        try:
            structured.compiled = await self.grammar_pool.run(
                self.engine.structured_output.compile, structured
            )
        except WorkerTimeout:
            raise ValueError(
                f"structured_outputs.{structured.kind} took longer than {self.grammar_pool.timeout_s:g} s "
                "to compile (the limit); simplify it"
            ) from None

    async def generate(
        self, prompt: str | list[int], params: SamplingParams | None = None, request_id: str | None = None
    ) -> AsyncGenerator[RequestOutput, None]:
        """Stream cumulative outputs of one request; the last has finished=True."""
        params = params if params is not None else SamplingParams()
        request_id = request_id or f"req-{uuid.uuid4().hex}"
        if isinstance(prompt, str):
            text, ids = await self.run_in_tokenizer(self.engine.process_inputs, prompt, params)
        else:
            text, ids = None, prompt
        await self.compile_structured_output(params)
        collector = self.add_request(request_id, ids, params, prompt=text)
        stream = self.outputs(request_id, collector)
        try:
            async for out in stream:
                yield out
        finally:
            await stream.aclose()

    def abort(self, request_id: str) -> None:
        """Thread-safe: the request's stream ends with finish_reason "abort"."""
        self._send(AbortRequest(request_id))

    def shutdown(self) -> None:
        """Abort everything and stop the stepping thread (idempotent)."""
        self._send(Shutdown())
        self._thread.join()
        self._tokenizer_executor.shutdown(wait=False)
        self.grammar_pool.shutdown()

    def _send(self, command: EngineCommand) -> None:
        self._commands.put(command)
        self._wakeup.set()

    # ---- the stepping thread ----
    def _run(self, llm: LLM | Callable[[], LLM], loaded: Future[LLM]) -> None:
        try:
            self.llm = llm if isinstance(llm, LLM) else llm()
            self.engine = self.llm.llm_engine
        except BaseException as exc:  # the load failed: the constructor raises it
            loaded.set_exception(exc)
            return
        if self._adapt_threads:
            self.compute_threads = ComputeThreads.for_serving(self.engine.device)
        try:  # llguidance's view of the vocabulary holds the GIL ~0.3 s in one call: pay it while loading,
            self.engine.structured_output.tokenizer()  # not when a first grammar arrives amid streams
        except Exception:  # a vocabulary llguidance cannot read: the first grammar request will say so
            log.warning("llguidance cannot read this tokenizer; structured outputs will fail", exc_info=True)
        loaded.set_result(self.llm)
        reason = "the engine was shut down"
        try:
            self._serve()
        except BaseException as exc:  # the loop itself failed (a bug or a fatal error): the engine is dead
            log.exception("the engine's stepping thread stopped")
            reason = f"the engine's stepping thread stopped ({type(exc).__name__}: {exc}); relaunch it"
        with self._lock:
            self._dead = EngineDeadError(reason)
            left = list(self._collectors.values())
        for collector in left:  # nobody may wait for a thread that is gone
            with contextlib.suppress(RuntimeError):  # that caller's event loop is closed
                collector.put(self._dead)

    def _serve(self) -> None:
        while True:
            self._wakeup.wait()
            self._wakeup.clear()
            if not self._apply_commands():
                return
            while self.engine.has_unfinished_requests() and self._commands.empty():
                if self.compute_threads is not None:
                    self.compute_threads.before_step()
                    self.engine.counters.compute_threads = self.compute_threads.threads
                try:
                    outputs = self.engine.step()
                except Exception as exc:  # step() fails requests itself; this is a bug there: fail all
                    log.exception("engine step failed")
                    self._fail_all(exc)
                    break
                self._deliver_all([(out.request_id, _item(out)) for out in outputs])
            if not self._commands.empty():
                self._wakeup.set()

    def _apply_commands(self) -> bool:
        """Apply queued adds/aborts; False when asked to stop."""
        while not self._commands.empty():
            command: EngineCommand = self._commands.get()
            match command:
                case AddRequest():
                    self._add(command)
                case AbortRequest(request_id=request_id):
                    self._abort(request_id)
                case Shutdown():
                    for request_id in list(self.engine.requests):
                        self._abort(request_id)
                    return False
        return True

    def _abort(self, request_id: str) -> None:
        out = self.engine.abort_request(request_id)
        if out is not None:
            self._deliver(request_id, out)

    def _add(self, command: AddRequest) -> None:
        request_id = command.request_id
        try:
            # one critical section: admission (add_requests) counts a request as pending or as in the
            # scheduler's queue, never as both (a burst at the limit was refused one place too early)
            with self._lock:
                try:
                    self.engine.add_processed_request(
                        request_id, command.prompt, command.prompt_token_ids, command.params
                    )
                finally:
                    self._num_pending -= 1
        except ValueError as exc:  # the request's own fault
            self._deliver(request_id, exc)
        except Exception as exc:  # anything else while adding fails this request only
            log.exception("adding request %s failed", request_id)
            self.engine.abort_request(request_id)
            self._deliver(request_id, EngineGenerateError(f"adding the request failed: {_describe(exc)}"))

    def _fail_all(self, exc: Exception) -> None:
        for request_id in list(self.engine.requests):
            self.engine.abort_request(request_id)
            self._deliver(request_id, EngineGenerateError(f"engine step failed: {_describe(exc)}"))

    def _deliver(self, request_id: str, item: RequestOutput | BaseException) -> None:
        self._deliver_all([(request_id, item)])

    def _deliver_all(self, items: list[tuple[str, RequestOutput | BaseException]]) -> None:
        """Hand one step's outputs to their consumers: one call_soon_threadsafe per event loop."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[str, RequestOutputCollector, Any]]] = {}
        with self._lock:
            for request_id, item in items:
                collector = self._collectors.get(request_id)
                if collector is None:
                    continue
                if isinstance(item, BaseException) or item.finished:
                    del self._collectors[request_id]  # final: nothing more goes to it
                by_loop.setdefault(collector.loop, []).append((request_id, collector, item))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_hand_over, batch)
            except RuntimeError:  # that event loop is closed: nobody listens any more
                for request_id, _, _ in batch:
                    self.engine.abort_request(request_id)


def _item(out: RequestOutput) -> RequestOutput | BaseException:
    return EngineGenerateError(out.error) if out.error is not None else out


def _hand_over(batch: list[tuple[str, RequestOutputCollector, Any]]) -> None:
    """On the consumers' event loop: one step's outputs into their collectors."""
    for _, collector, item in batch:
        collector.put_nowait(item)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
