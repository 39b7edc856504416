"""ComputeThreads: a serving engine's CPU thread count, fitted to the cores that other processes leave free.

Every kernel of a step is an OpenMP parallel region that ends at a barrier, so a step runs at the pace of
its slowest thread. When another process takes one of the engine's cores (a browser rendering the Chat
reply, a benchmark client, a second engine), the thread sharing that core is descheduled for whole
scheduler slices and every barrier waits for it: on two cores one busy neighbour held a 256-token Chat
reply to 22-27 tok/s with two threads, against 145-158 with one (README, "shared machine"). So while
serving, the stepping thread samples how much CPU the rest of the machine uses and gives up a thread per
core the others occupy, and takes it back once they have been calm for a few windows.

What counts as "others": the machine's busy time (/proc/stat: everything but idle and iowait, steal
included, since a vCPU the hypervisor runs elsewhere stalls a barrier the same way) less this process's
own CPU time (all its threads, so the server's own Python threads never push the engine down).

Only the serving engine (AsyncLLM) adapts: offline runs and benchmarks keep the count they start with.
An OMP_NUM_THREADS set by the user is a decision and is kept. The count moves between 1 and the count the
engine started with (its captured step was built for that many, never more). The result is thread-count
independent for our kernels and torch's bf16 GEMMs; torch's fp32 GEMM can differ in the last bits for
some shapes (the order of its K-split), as results already do between batch compositions.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil
import torch

from backend.engine.cpu_quota import quota_cpus, threads_within_quota

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ThreadPolicy:
    """When to give a thread up and when to take it back (others' load in cores, over one window)."""

    down_at: float = 0.5  # others use at least this much of a core: that core is taken
    up_below: float = 0.25  # ... at most this much: the core is free again
    window_s: float = 0.5  # a load sample covers at least this long
    calm_windows: int = 3  # windows in a row that must be calm before a thread comes back
    stale_s: float = 5.0  # a window this long spans an idle engine: it starts afresh, deciding nothing


def fitted_threads(
    current: int, max_threads: int, cores: int, others: float, policy: ThreadPolicy
) -> tuple[int, bool]:
    """(threads to run now, whether this window was calm enough to take one back).

    A thread goes at once when others take a core; coming back is the caller's to delay (calm_windows)."""
    taken_down = math.floor(others + 1 - policy.down_at)  # cores the others occupy, by the "give up" rule
    taken_up = math.floor(others + 1 - policy.up_below)  # ... by the stricter "take back" rule
    down = max(1, min(max_threads, cores - taken_down))
    if down < current:
        return down, False
    up = max(1, min(max_threads, cores - taken_up))
    return current, up > current


@dataclass(frozen=True, slots=True)
class CpuSample:
    wall_s: float
    busy_s: float  # the machine's busy CPU seconds so far (all cores)
    own_s: float  # this process's CPU seconds so far (all threads)


def read_cpu() -> CpuSample:
    times = psutil.cpu_times()
    busy = sum(times) - times.idle - getattr(times, "iowait", 0.0)
    # guest time is already inside user time on Linux; counting it twice would invent a neighbour
    busy -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    own = psutil.Process().cpu_times()
    return CpuSample(time.monotonic(), busy, own.user + own.system)  # the clock ComputeThreads reads


class ComputeThreads:
    """Call before_step() on the stepping thread before each step (torch's thread count is per thread)."""

    def __init__(
        self,
        max_threads: int,
        cores: int,
        policy: ThreadPolicy | None = None,
        read: Callable[[], CpuSample] = read_cpu,
        apply: Callable[[int], None] = torch.set_num_threads,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_threads, self.cores = max_threads, cores
        self.policy = policy or ThreadPolicy()
        self.threads = max_threads
        self.others = 0.0  # the last window's load from other processes, in cores
        self.num_changes = 0
        self._read, self._apply, self._clock = read, apply, clock
        self._last = read()
        self._calm = 0

    @classmethod
    def for_serving(cls, device: torch.device) -> ComputeThreads | None:
        """One for a CPU engine with more than one thread whose count the user left to it; else None."""
        if device.type != "cpu" or os.environ.get("OMP_NUM_THREADS"):
            return None
        threads = torch.get_num_threads()
        cores = threads_within_quota(len(os.sched_getaffinity(0)), quota_cpus())  # a container's limit
        return cls(threads, cores) if threads > 1 else None

    def before_step(self) -> None:
        if self._clock() - self._last.wall_s < self.policy.window_s:
            return  # the clock alone: reading the counters costs ~60 us, 1% of a batch-1 step
        now = self._read()
        elapsed = now.wall_s - self._last.wall_s
        others = ((now.busy_s - self._last.busy_s) - (now.own_s - self._last.own_s)) / elapsed
        self._last = now
        if elapsed > self.policy.stale_s:  # the engine sat idle: that window says nothing about now
            return
        self.others = max(0.0, others)
        wanted, calm = fitted_threads(self.threads, self.max_threads, self.cores, self.others, self.policy)
        self._calm = self._calm + 1 if calm else 0
        if calm and self._calm >= self.policy.calm_windows:
            wanted, self._calm = self.threads + 1, 0
        if wanted != self.threads:
            log.info(
                "compute threads %d -> %d: other processes use %.1f of this machine's %d cores",
                self.threads,
                wanted,
                self.others,
                self.cores,
            )
            self._apply(wanted)
            self.threads = wanted
            self.num_changes += 1
