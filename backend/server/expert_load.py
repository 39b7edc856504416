"""The expert-load picture of a mixture-of-experts engine: how many tokens each expert of each MoE layer
was routed in the last seconds, as a matrix layers x experts.

The engine counts cumulatively (EngineStats.expert_tokens_total: per MoE layer, per expert, every
token->expert assignment since it started; empty for a dense model). The load over a window is the
difference of two snapshots taken that far apart; ExpertLoadHistory keeps the snapshots of the last
``window_s`` seconds (one a sample, so a few dozen small lists). A snapshot whose counts went down, or
whose shape changed, comes from another engine (a relaunch): the history starts again from it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

WINDOW_S = 10.0  # the picture's window: long enough to span a few chat replies, short enough to follow load
MAX_SNAPSHOTS = 64  # at one sample a second, a 10 s window holds about 11


@dataclass(slots=True)
class ExpertSnapshot:
    timestamp: float  # time.time() when the stats were taken
    totals: list[list[int]]  # EngineStats.expert_tokens_total: [MoE layer][expert], cumulative


@dataclass(slots=True)
class ExpertLoad:
    """Tokens routed to each expert of each MoE layer between two snapshots."""

    tokens: list[list[int]]  # [MoE layer][expert]
    seconds: float  # the window the counts span

    @property
    def total(self) -> int:
        return sum(map(sum, self.tokens))

    def shares(self) -> list[list[float]]:
        """Each expert's share of its layer's assignments in the window (0 for a layer with none)."""
        return [[n / (sum(row) or 1) for n in row] for row in self.tokens]


def is_successor(before: list[list[int]], after: list[list[int]]) -> bool:
    """Whether ``after`` can follow ``before`` in one engine: the same layers and experts, no count down."""
    if [len(row) for row in before] != [len(row) for row in after]:
        return False
    return all(
        b <= a for row_b, row_a in zip(before, after, strict=True) for b, a in zip(row_b, row_a, strict=True)
    )


def expert_load(before: ExpertSnapshot, after: ExpertSnapshot) -> ExpertLoad:
    """The tokens routed between two snapshots of one engine (ValueError for two that cannot follow)."""
    if not is_successor(before.totals, after.totals) or after.timestamp < before.timestamp:
        raise ValueError(
            "the two expert snapshots are not of one engine in time order: they must have the same layers "
            "and experts, counts that never go down and a later timestamp second"
        )
    tokens = [
        [a - b for b, a in zip(row_b, row_a, strict=True)]
        for row_b, row_a in zip(before.totals, after.totals, strict=True)
    ]
    return ExpertLoad(tokens, after.timestamp - before.timestamp)


class ExpertLoadHistory:
    """The snapshots of the last window_s seconds; ``load()`` is the newest minus the oldest of them."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0 seconds, got {window_s}")
        self.window_s = window_s
        self.snapshots: deque[ExpertSnapshot] = deque(maxlen=MAX_SNAPSHOTS)

    def add(self, timestamp: float, totals: list[list[int]]) -> None:
        """Keep a snapshot; a dense model's (empty) one, or one from another engine, starts afresh."""
        last = self.snapshots[-1] if self.snapshots else None
        if not totals or last is None or not is_successor(last.totals, totals) or timestamp < last.timestamp:
            self.snapshots.clear()
        if totals:
            self.snapshots.append(ExpertSnapshot(timestamp, [list(row) for row in totals]))
        while len(self.snapshots) > 2 and self.snapshots[1].timestamp <= timestamp - self.window_s:
            self.snapshots.popleft()  # keep one snapshot at or before the window's start

    def load(self) -> ExpertLoad | None:
        """The load over (about) the last window_s seconds; None for a dense model or a single snapshot."""
        if len(self.snapshots) < 2:
            return None
        return expert_load(self.snapshots[0], self.snapshots[-1])
