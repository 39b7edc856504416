"""Where the time of starting an engine goes: named phases, timed, announced as each one starts.

The loader and LLMEngine mark their phases on a LoadPhases passed down to them; EngineHolder hands its
listener to the UI's progress bar, and `python -m benchmarks.load_time` prints the table. PHASES lists
them in order, so a phase's index gives the progress fraction.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

PHASES = (
    "import torch and the engine",
    "load CPU kernels",
    "read config and tokenizer",
    "read weights",
    "build model and install weights",
    "allocate KV cache",
)


@dataclass(slots=True)
class LoadPhase:
    name: str
    seconds: float


@dataclass(slots=True)
class LoadPhases:
    """The phases of one engine start, in order; ``listener(name, fraction)`` hears each one begin."""

    listener: Callable[[str, float], None] | None = None
    done: list[LoadPhase] = field(default_factory=list)
    current: str = ""

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        assert name in PHASES, f"unknown load phase {name!r}"  # the progress bar orders them by PHASES
        self.current = name
        if self.listener is not None:
            self.listener(name, PHASES.index(name) / len(PHASES))
        started = time.perf_counter()
        try:
            yield
        finally:
            self.done.append(LoadPhase(name, time.perf_counter() - started))
            self.current = ""

    def seconds(self) -> float:
        return sum(p.seconds for p in self.done)
