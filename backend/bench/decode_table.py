"""The decode-speed table of bench.versus_llamacpp: one row per (engine, batch size) with the median of its
rounds and their spread, and for our engine the median of its per-round ratios to llama.cpp at the same
batch size (each round ran both back to back, so a ratio compares like load with like) against issue 30's
bar (batch-1 decode at least llama.cpp's, 16-sequence aggregate decode at least 1.5x).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

ENGINE = "engine"
PEER = "llama.cpp"
# issue 30: "batch-1 decode >= llama.cpp, 16-sequence aggregate decode >= 1.5x llama.cpp"
BARS = {1: 1.0, 16: 1.5}


@dataclass(slots=True)
class DecodeRow:
    """One engine at one batch size: the aggregate decode tokens/s of each timed round."""

    engine: str  # ENGINE or PEER
    batch_size: int
    samples: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


def ratio(ours: DecodeRow, peer: DecodeRow) -> tuple[float, list[float]]:
    """(the median, each round's) ratio of our tokens/s over llama.cpp's in the same round (above 1: we decode
    faster). Rounds are paired: the two engines ran back to back in each, under the same neighbours' load."""
    if ours.batch_size != peer.batch_size:
        raise ValueError(f"compare rows of one batch size, got {ours.batch_size} and {peer.batch_size}")
    if not ours.samples or len(ours.samples) != len(peer.samples):
        raise ValueError(
            f"rows of paired rounds needed, got {len(ours.samples)} and {len(peer.samples)} rounds"
        )
    rounds = [a / b for a, b in zip(ours.samples, peer.samples, strict=True)]
    return statistics.median(rounds), rounds


def format_table(rows: list[DecodeRow]) -> list[str]:
    """The table's lines: rows grouped by batch size, ours with its ratio and the bar it must meet."""
    lines = [
        f"| {'engine':<9} | {'batch':>5} | {'tok/s (median)':>14} | {'spread (min-max)':>17} | "
        f"{'engine / llama.cpp':>18} | {'rounds (min-max)':>16} | {'bar':>5} | {'meets':<5} |",
        f"|{'-' * 11}|{'-' * 6}:|{'-' * 15}:|{'-' * 18}:|{'-' * 19}:|{'-' * 17}:|{'-' * 6}:|{'-' * 7}|",
    ]
    for batch_size in sorted({row.batch_size for row in rows}):
        pair = {row.engine: row for row in rows if row.batch_size == batch_size}
        for name in (PEER, ENGINE):
            if name not in pair:
                continue
            row = pair[name]
            spread = f"{min(row.samples):.2f}-{max(row.samples):.2f}"
            shown, rounds, bar, meets = "", "", "", ""
            if name == ENGINE and PEER in pair:
                value, each = ratio(row, pair[PEER])
                shown, rounds = f"{value:.2f}x", f"{min(each):.2f}-{max(each):.2f}"
                if batch_size in BARS:
                    bar = f"{BARS[batch_size]:.1f}x"
                    meets = "yes" if value >= BARS[batch_size] else "no"
            lines.append(
                f"| {name:<9} | {batch_size:>5} | {row.median:>14.2f} | {spread:>17} | {shown:>18} | "
                f"{rounds:>16} | {bar:>5} | {meets:<5} |"
            )
    return lines
