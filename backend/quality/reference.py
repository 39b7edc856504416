"""ReferenceScores: the reference model's ChunkScores, kept while the other models run.

Whole rows are kept exactly (float32, no llama.cpp-style 16-bit compression), one file per chunk in a
temporary folder, so memory holds one chunk at a time: 4 x vocab x (n_ctx/2 - 1) bytes a chunk (50 MB for
a 49k vocabulary at n_ctx 512; the default model's 8 chunks take 400 MB of disk). The rows are read back
memory-mapped. The folder is removed on close().
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from backend.quality.scores import ChunkScores


class ReferenceScores:
    def __init__(self, label: str) -> None:
        self.label = label
        self._folder = tempfile.TemporaryDirectory(prefix="quality-reference-")
        self._chunks: list[ChunkScores] = []  # rows moved to files
        self._files: list[Path | None] = []

    def __len__(self) -> int:
        return len(self._chunks)

    @property
    def has_rows(self) -> bool:
        return any(file is not None for file in self._files)

    def add(self, scores: ChunkScores) -> None:
        file = None
        if scores.rows is not None:
            file = Path(self._folder.name) / f"chunk-{len(self._chunks)}.pt"
            torch.save(scores.rows.contiguous(), file)
        self._chunks.append(replace(scores, rows=None))
        self._files.append(file)

    def chunk(self, index: int) -> ChunkScores:
        """The index-th chunk's scores, its rows (if any) read back memory-mapped."""
        file = self._files[index]
        rows = torch.load(file, mmap=True) if file is not None else None
        return replace(self._chunks[index], rows=rows)

    def close(self) -> None:
        self._folder.cleanup()

    def __enter__(self) -> ReferenceScores:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
