"""The one embedded engine of this process, shared by every browser tab and by the /v1 server.

EngineHolder owns the AsyncLLM: launch, stop and relaunch are serialised by a lock, a failed load is
kept as an error message (the UI shows it and offers Launch again), and the live-chart history is
sampled here once for all viewers.

Invariant: a launch never takes down a serving engine before its replacement is ready. The old engine
keeps serving while the new one loads; if the load fails (bad path, absurd KV budget, bad config) the
old one simply goes on. On success the two are swapped at once and the old engine is retired in the
background: it finishes the requests it holds (up to DRAIN_TIMEOUT_S), then shuts down. A request that
still reaches it after that gets the engine's shut-down error, which the server answers with 503 and
Retry-After.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from backend.engine.config import EngineConfig
from backend.engine.load_phases import LoadPhase, LoadPhases
from backend.engine.stats import EngineStats
from backend.server.expert_load import ExpertLoad, ExpertLoadHistory

if TYPE_CHECKING:
    from backend.engine import AsyncLLM

HISTORY_SECONDS = 180  # live charts keep about three minutes of one-per-second samples
DRAIN_TIMEOUT_S = 60.0  # a retired engine finishes its requests for at most this long, then aborts them


class EngineState(StrEnum):
    STOPPED = "stopped"
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"  # the last launch failed and nothing serves


@dataclass(slots=True)
class EngineStatus:
    state: EngineState
    config: EngineConfig | None  # the serving engine's (while loading: the one being loaded)
    error: str  # why the last launch failed ("" when it did not); with state "ready" the old engine serves
    load_seconds: float  # time spent loading (so far, while loading)
    serving: EngineConfig | None = None  # the engine answering requests now, if any (also while loading)
    phase: str = ""  # while loading: the phase under way (load_phases.PHASES)
    phases: tuple[LoadPhase, ...] = ()  # the last load's phases so far, timed


def build_engine(config: EngineConfig, phases: LoadPhases) -> AsyncLLM:
    with phases.phase("import torch and the engine"):
        from backend.engine import AsyncLLM  # torch loads on the first launch, not at app start
    return AsyncLLM.from_config(config, phases)  # loaded on its stepping thread (async_llm.py)


class EngineHolder:
    """Launch / stop / relaunch the embedded engine safely from any thread."""

    def __init__(
        self,
        engine_factory: Callable[[EngineConfig, LoadPhases], AsyncLLM] = build_engine,
        drain_timeout_s: float = DRAIN_TIMEOUT_S,
    ) -> None:
        self._factory = engine_factory
        self._drain_timeout_s = drain_timeout_s
        self._lock = threading.Lock()
        self._engine: AsyncLLM | None = None
        self._state = EngineState.STOPPED
        self._config: EngineConfig | None = None  # the serving engine's
        self._loading: EngineConfig | None = None  # the one being loaded
        self._error = ""
        self._load_started = 0.0
        self._load_seconds = 0.0
        self._phases = LoadPhases()
        self._samples: deque[dict[str, Any]] = deque(maxlen=HISTORY_SECONDS)
        self._last_stats: EngineStats | None = None
        self._expert_load = ExpertLoadHistory()  # MoE models: the expert-load picture's snapshots

    def get(self) -> AsyncLLM | None:
        """The running engine, or None (the server answers 503, the chat says how to launch)."""
        return self._engine

    def status(self) -> EngineStatus:
        with self._lock:
            engine, loading = self._engine, self._state == EngineState.LOADING
            seconds = time.monotonic() - self._load_started if loading else self._load_seconds
            config = self._loading if loading else self._config
            state, error = self._state, self._error
            if engine is not None and engine.errored and not loading:  # its stepping thread has stopped
                state = EngineState.FAILED
                error = "the engine stopped after an internal error; launch it again"
            serving = self._config if engine is not None and not engine.errored else None
            phases = self._phases
            return EngineStatus(state, config, error, seconds, serving, phases.current, tuple(phases.done))

    def launch(
        self, config: EngineConfig, on_phase: Callable[[str, float], None] | None = None
    ) -> EngineStatus:
        """Load a new engine while the current one (if any) keeps serving, then swap them. Never raises for
        a failed load: the error is kept in the status and the current engine goes on serving. Raises
        RuntimeError if another launch is still loading. on_phase(name, fraction) hears each load phase."""
        with self._lock:
            if self._state == EngineState.LOADING:
                raise RuntimeError("another launch is still loading; wait for it to finish")
            self._state, self._loading, self._error = EngineState.LOADING, config, ""
            self._load_started = time.monotonic()
            self._phases = LoadPhases(on_phase)
        try:
            engine = self._factory(config, self._phases)
        except Exception as exc:  # any load failure (bad path, OOM, unsupported model) is shown, not raised
            with self._lock:
                self._state = EngineState.READY if self._engine is not None else EngineState.FAILED
                self._error, self._loading = f"{type(exc).__name__}: {exc}", None
                self._load_seconds = time.monotonic() - self._load_started
            return self.status()
        with self._lock:
            old, self._engine, self._config, self._loading = self._engine, engine, config, None
            self._state, self._load_seconds = EngineState.READY, time.monotonic() - self._load_started
            self._samples.clear()
            self._last_stats = None
            self._expert_load = ExpertLoadHistory()
        if old is not None:
            threading.Thread(target=retire, args=(old, self._drain_timeout_s), daemon=True).start()
        return self.status()

    def stop(self) -> EngineStatus:
        """Stop serving now: requests in flight end with finish_reason "abort"."""
        with self._lock:
            if self._state == EngineState.LOADING:
                raise RuntimeError("the engine is still loading; stop it once it is ready")
            old, self._engine = self._engine, None
            self._state, self._error = EngineState.STOPPED, ""
        if old is not None:
            old.shutdown()
        return self.status()

    def stats(self) -> EngineStats | None:
        """engine.stats() of the running engine, or None."""
        engine = self._engine
        if engine is None:
            return None
        stats = engine.stats()
        self._last_stats = stats
        return stats

    def samples(self, min_interval_s: float = 0.8) -> list[dict[str, Any]]:
        """Normalised samples (backend.monitor.samples keys) for the live charts, newest last.

        Every viewer calls this about once a second; a new sample is taken at most every min_interval_s,
        so many open tabs do not multiply the work or distort the rates."""
        from backend.monitor.samples import sample_from_stats

        with self._lock:
            engine = self._engine
            last = self._samples[-1] if self._samples else None
            if engine is not None and (last is None or time.time() - last["timestamp"] >= min_interval_s):
                stats = self._last_stats = engine.stats()
                self._samples.append(sample_from_stats(stats, last))
                self._expert_load.add(stats.timestamp, stats.expert_tokens_total)
            return list(self._samples)

    def expert_load(self) -> ExpertLoad | None:
        """Tokens routed per expert per MoE layer over the last seconds of samples (None: a dense model,
        or fewer than two samples yet)."""
        with self._lock:
            return self._expert_load.load()

    def last_stats(self) -> EngineStats | None:
        return self._last_stats

    def shutdown(self) -> None:
        """Stop the engine at process exit."""
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.shutdown()


def retire(engine: AsyncLLM, drain_timeout_s: float, poll_s: float = 0.1) -> None:
    """Let a replaced engine finish the requests it holds (new ones already go to its successor), then
    shut it down; whatever is left after drain_timeout_s ends with finish_reason "abort"."""
    deadline = time.monotonic() + drain_timeout_s
    while time.monotonic() < deadline:
        try:
            stats = engine.stats()
        except Exception:  # the engine died while draining: nothing left to wait for
            break
        if stats.num_requests_running + stats.num_requests_waiting == 0:
            break
        time.sleep(poll_s)
    engine.shutdown()
