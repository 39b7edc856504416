"""compute_threads: the serving engine gives a CPU thread up while another process takes a core and takes
it back once the machine is calm. The rule on a table, the hysteresis on a scripted load (the machine's
counters replaced, the name says so), and a real AsyncLLM beside real processes spinning cores (its
counters scoped to them, so that other load on the machine does not decide the test)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
import time

import psutil
import pytest

from backend.engine import AsyncLLM, SamplingParams
from backend.engine.compute_threads import ComputeThreads, CpuSample, ThreadPolicy, fitted_threads
from backend.engine.config import EngineConfig
from tests.engine_utils import prompts, tiny_model

POLICY = ThreadPolicy()


@pytest.mark.parametrize(
    ("current", "max_threads", "cores", "others", "expected"),
    [
        (2, 2, 2, 0.0, (2, False)),  # quiet: keep both
        (2, 2, 2, 0.49, (2, False)),  # half a core is not yet a core taken
        (2, 2, 2, 0.5, (1, False)),  # ... and from here it is
        (2, 2, 2, 1.9, (1, False)),  # never below one thread
        (1, 2, 2, 0.4, (1, False)),  # between the two thresholds: stay
        (1, 2, 2, 0.24, (1, True)),  # calm: a thread may come back (after calm_windows)
        (8, 8, 8, 2.6, (5, False)),  # three cores taken of eight
        (4, 4, 8, 2.0, (4, False)),  # the engine started on 4 of 8 cores: six free, it keeps its 4
        (3, 4, 8, 0.0, (3, True)),  # ... and never goes past the count it started with
        (4, 4, 8, 4.6, (3, False)),
    ],
)
def test_threads_fit_the_cores_others_leave(current, max_threads, cores, others, expected):
    assert fitted_threads(current, max_threads, cores, others, POLICY) == expected


class ScriptedLoad:
    """The machine's CPU counters on a script: each clock() call (one a step) advances time by a quarter
    second; `others` is how many cores other processes use meanwhile (this process uses one)."""

    def __init__(self) -> None:
        self.wall = self.busy = self.own = 0.0
        self.others = 0.0
        self.reads = 0

    def clock(self) -> float:
        step = 0.25
        self.wall += step
        self.own += step
        self.busy += step * (1 + self.others)
        return self.wall

    def read(self) -> CpuSample:
        self.reads += 1
        return CpuSample(self.wall, self.busy, self.own)

    def fitting(self, applied: list[int]) -> ComputeThreads:
        return ComputeThreads(2, 2, read=self.read, apply=applied.append, clock=self.clock)


def test_hysteresis_on_a_scripted_load():
    load, applied = ScriptedLoad(), []
    threads = load.fitting(applied)
    for _ in range(8):
        threads.before_step()
    assert threads.threads == 2 and applied == []
    assert load.reads == 1 + 4  # the counters are read once a window, not once a step
    load.others = 0.9  # a neighbour takes a core: the next full window gives a thread up
    threads.before_step()
    threads.before_step()
    assert threads.threads == 1 and applied == [1] and threads.others == pytest.approx(0.9)
    load.others = 0.35  # between the thresholds: stays down
    for _ in range(20):
        threads.before_step()
    assert applied == [1]
    load.others = 0.0  # calm: back after calm_windows full windows, not before
    for _ in range(2 * POLICY.calm_windows - 1):
        threads.before_step()
    assert applied == [1]
    threads.before_step()
    assert applied == [1, 2] and threads.threads == 2 and threads.num_changes == 2


def test_an_idle_gap_decides_nothing():
    load, applied = ScriptedLoad(), []
    threads = load.fitting(applied)
    load.others = 1.0
    load.wall += 60  # the engine sat idle for a minute while something else ran
    threads.before_step()
    assert applied == [] and threads.threads == 2


def test_a_set_omp_num_threads_is_kept(monkeypatch):
    import torch

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert ComputeThreads.for_serving(torch.device("cpu")) is None
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert ComputeThreads.for_serving(torch.device("meta")) is None  # not a CPU engine


def wait_for_threads(async_llm: AsyncLLM, wanted: int, timeout_s: float) -> list[int]:
    """The counts seen until the engine runs `wanted` threads."""
    seen, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen.append(async_llm.stats().compute_threads)
        if seen[-1] == wanted:
            return seen
        time.sleep(0.1)
    others = async_llm.compute_threads.others if async_llm.compute_threads else None
    raise AssertionError(
        f"compute threads never reached {wanted} in {timeout_s} s: {seen[-20:]}; other processes "
        f"used {others} cores in the last window"
    )


class NeighbourCounters:
    """The machine's counters as ComputeThreads reads them, but the "machine" is this process and the
    test's own neighbours (real processes, their real CPU seconds from the kernel): whatever else runs on
    the machine (the rest of a CI run, a compile beside it) neither delays nor fakes the change."""

    def __init__(self) -> None:
        self.neighbours: list[psutil.Process] = []
        self.gone_s = 0.0  # the CPU seconds of neighbours that have exited

    def read(self) -> CpuSample:
        own = psutil.Process().cpu_times()
        theirs = self.gone_s
        for process in self.neighbours:
            with contextlib.suppress(psutil.NoSuchProcess):
                times = process.cpu_times()
                theirs += times.user + times.system
        return CpuSample(time.monotonic(), own.user + own.system + theirs, own.user + own.system)

    def start(self, count: int) -> list[subprocess.Popen]:
        spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
        self.neighbours = [psutil.Process(p.pid) for p in spinners]
        return spinners

    def stop(self, spinners: list[subprocess.Popen]) -> None:
        self.gone_s = self.read().busy_s - self.read().own_s
        for p in spinners:
            p.kill()
            p.wait()
        self.neighbours = []


@pytest.mark.slow
def test_a_busy_neighbour_takes_a_thread_and_calm_gives_it_back(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    if len(__import__("os").sched_getaffinity(0)) < 2:
        pytest.fail("this test needs two cores: with one the engine has no thread to give up")
    async_llm = AsyncLLM.from_config(EngineConfig(tiny_model("llama")[0], dtype="float32", device="cpu"))
    fitting = async_llm.compute_threads
    assert fitting is not None and fitting.max_threads >= 2, "a CPU engine with free threads fits them"
    counters = NeighbourCounters()
    fitting._read = counters.read  # the engine is idle: nothing reads them until the client starts
    fitting._last = counters.read()
    stop = threading.Event()

    async def keep_busy() -> None:  # requests back to back, so the engine steps the whole time
        params = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)
        while not stop.is_set():
            async for _ in async_llm.generate(prompts(lengths=(8,), seed=1)[0], params):
                if stop.is_set():
                    break

    client = threading.Thread(target=lambda: asyncio.run(keep_busy()))
    client.start()
    try:
        wait_for_threads(async_llm, fitting.max_threads, 60)
        spinners = counters.start(2)  # two spinning processes: together over half a core on a busy box
        try:
            wait_for_threads(async_llm, fitting.max_threads - 1, 60)
            assert fitting.others >= POLICY.down_at
        finally:
            counters.stop(spinners)
        wait_for_threads(async_llm, fitting.max_threads, 60)
        assert fitting.num_changes >= 2
    finally:
        stop.set()
        client.join(timeout=30)
        async_llm.shutdown()
    assert not client.is_alive()


@pytest.mark.slow
def test_shared_cores_bench_prints_both_modes_and_their_ratio(capsys):
    from benchmarks import shared_cores

    argv = ["--model", tiny_model("llama")[0], "--tokens", "24", "--repeats", "1"]
    assert shared_cores.main(argv) == 0
    out = capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| 1 |")]
    assert [cells[1].strip() for cells in rows] == ["fixed", "fitted"], out
    for cells in rows:
        quiet, quiet_threads, busy, busy_threads = (float(c) for c in cells[2:])
        assert quiet > 0 and busy > 0 and quiet_threads >= 1 and busy_threads >= 1
    assert "quiet: fixed" in out and "busy: fixed" in out and "fitted / fixed" in out
