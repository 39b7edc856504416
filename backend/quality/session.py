"""QualitySession: sources scored one at a time as they become available (Compare starts its engines one
after the other), the first being the reference; each later one compared with it at once.

The reference's own result is against itself (KL 0 with whole rows, top-1 100%), so a table can show
its perplexity in the same columns.
"""

from __future__ import annotations

from backend.quality.measure import ChunkCounter, Progress, score_model, score_reference
from backend.quality.reference import ReferenceScores
from backend.quality.scores import compare_chunk
from backend.quality.sources import ScoreSource
from backend.quality.statistics import QualityResult, summarize
from backend.quality.text import TextChunks


class QualitySession:
    def __init__(self, chunks: TextChunks, num_sources: int, progress: Progress | None = None) -> None:
        self.chunks = chunks
        self.counter = ChunkCounter(progress)
        self.counter.total = len(chunks.chunks) * num_sources
        self.reference: ReferenceScores | None = None

    def add(self, source: ScoreSource) -> QualityResult:
        """Score the source; the first one becomes the reference."""
        if self.reference is None:
            self.reference = score_reference(source, self.chunks, self.counter)
            reference = self.reference
            stats = [compare_chunk(reference.chunk(i), reference.chunk(i)) for i in range(len(reference))]
            return summarize(source.label, source.label, stats)
        return score_model(source, self.chunks, self.reference, self.counter)

    def close(self) -> None:
        if self.reference is not None:
            self.reference.close()

    def __enter__(self) -> QualitySession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
