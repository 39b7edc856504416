"""StepRecorder: each engine step's wall time, batch (decode rows, prefill tokens) and the gap since the
previous step, recorded by wrapping an LLMEngine's step() and scheduler.schedule(), and their summary.

Each record also counts the process's minor page faults during the step (all threads: the engine's are
nearly all of them while it steps). Steps that schedule nothing (an idle engine polled by its loop) are
not recorded; a step's gap is the engine-thread time since the previous step ended (commands, delivery,
waiting), 0 for the first.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(slots=True)
class StepRecord:
    seconds: float
    gap_seconds: float  # engine-thread time since the previous step ended (commands, delivery, waiting)
    num_decode_rows: int
    num_prefill_tokens: int
    started: float = 0.0  # time.time() when the step began (to set steps beside request timestamps)
    minor_faults: int = 0  # the process's minor page faults during the step (first writes to fresh pages)


@dataclass(slots=True)
class StepRecorder:
    """Wraps an LLMEngine's step() and scheduler.schedule() to record each step's time and batch."""

    records: list[StepRecord] = field(default_factory=list)
    _last_end: float | None = None
    _batch: tuple[int, int] = (0, 0)

    def attach(self, engine) -> None:
        step, schedule = engine.step, engine.scheduler.schedule

        def recorded_schedule():
            scheduled = schedule()
            decodes = sum(1 for item in scheduled if item.seq.num_uncomputed_tokens == 1)
            prefill = sum(item.num_new_tokens for item in scheduled if item.seq.num_uncomputed_tokens > 1)
            self._batch = (decodes, prefill)
            return scheduled

        def recorded_step():
            start, started, faults = time.perf_counter(), time.time(), minor_faults()
            self._batch = (0, 0)
            outputs = step()
            end = time.perf_counter()
            if self._batch != (0, 0):
                gap = start - self._last_end if self._last_end is not None else 0.0
                faults = minor_faults() - faults
                self.records.append(StepRecord(end - start, gap, *self._batch, started, faults))
            self._last_end = end
            return outputs

        engine.scheduler.schedule = recorded_schedule
        engine.step = recorded_step

    def take(self) -> list[StepRecord]:
        records, self.records, self._last_end = self.records, [], None
        return records


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def voluntary_switches() -> int:
    """Voluntary context switches of every thread of this process so far (a sleeping OpenMP worker
    adds one per parallel region it is woken for)."""
    total = 0
    for task in os.listdir("/proc/self/task"):
        try:
            lines = Path(f"/proc/self/task/{task}/status").read_text().splitlines()
        except OSError:  # the thread ended
            continue
        total += sum(int(line.split()[1]) for line in lines if line.startswith("voluntary_ctxt_switches"))
    return total


def step_summary(records: list[StepRecord], seconds: float, switches: int) -> dict:
    """Steps/s, decode-only step time at the most common row count, mixed steps, gaps, switches/step."""
    decode = [r for r in records if r.num_prefill_tokens == 0]
    rows = statistics.mode(r.num_decode_rows for r in decode) if decode else 0
    same = [r.seconds for r in decode if r.num_decode_rows == rows]
    mixed = [r.seconds for r in records if r.num_prefill_tokens]
    return {
        "steps_per_s": len(records) / seconds,
        "busy": sum(r.seconds for r in records) / seconds,
        "decode_rows": rows,
        "decode_step_ms": statistics.median(same) * 1e3 if same else float("nan"),
        "mixed_step_ms": statistics.median(mixed) * 1e3 if mixed else float("nan"),
        "gap_ms": statistics.fmean(r.gap_seconds for r in records[1:]) * 1e3 if len(records) > 1 else 0.0,
        "switches_per_step": switches / max(1, len(records)),
    }
