"""The decode-speed table of bench.versus_llamacpp: one row per (engine, batch size) with the median of its
rounds, their spread, and our engine's median over llama.cpp's at the same batch size against issue 30's
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


def ratio(ours: DecodeRow, peer: DecodeRow) -> float:
    """Our median tokens/s over llama.cpp's (above 1: we decode faster)."""
    if ours.batch_size != peer.batch_size:
        raise ValueError(f"compare rows of one batch size, got {ours.batch_size} and {peer.batch_size}")
    if not ours.samples or not peer.samples:
        raise ValueError("a row without timed rounds has no median")
    return ours.median / peer.median


def format_table(rows: list[DecodeRow]) -> list[str]:
    """The table's lines: rows grouped by batch size, ours with its ratio and the bar it must meet."""
    lines = [
        f"| {'engine':<9} | {'batch':>5} | {'tok/s (median)':>14} | {'spread (min-max)':>17} | "
        f"{'engine / llama.cpp':>18} | {'bar':>5} | {'meets':<5} |",
        f"|{'-' * 11}|{'-' * 6}:|{'-' * 15}:|{'-' * 18}:|{'-' * 19}:|{'-' * 6}:|{'-' * 7}|",
    ]
    for batch_size in sorted({row.batch_size for row in rows}):
        pair = {row.engine: row for row in rows if row.batch_size == batch_size}
        for name in (PEER, ENGINE):
            if name not in pair:
                continue
            row = pair[name]
            spread = f"{min(row.samples):.2f}-{max(row.samples):.2f}"
            shown, bar, meets = "", "", ""
            if name == ENGINE and PEER in pair:
                value = ratio(row, pair[PEER])
                shown = f"{value:.2f}x"
                if batch_size in BARS:
                    bar = f"{BARS[batch_size]:.1f}x"
                    meets = "yes" if value >= BARS[batch_size] else "no"
            lines.append(
                f"| {name:<9} | {batch_size:>5} | {row.median:>14.2f} | {spread:>17} | {shown:>18} | "
                f"{bar:>5} | {meets:<5} |"
            )
    return lines
