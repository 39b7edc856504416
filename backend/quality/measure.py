"""A quality run: the reference scored chunk by chunk and kept (reference.py), then each model scored on
the same chunks and compared token by token (scores.py), summarized as llama.cpp does (statistics.py).

Models are loaded one at a time (the previous one is released first), so a run needs the memory of one
model plus one chunk's rows. Every model must tokenize the text to the reference's token ids.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from backend.errors import UserError
from backend.quality.config import QualityConfig
from backend.quality.reference import ReferenceScores
from backend.quality.scores import compare_chunk
from backend.quality.sources import EngineSource, ScoreSource
from backend.quality.specs import ModelSpec, parse_spec
from backend.quality.statistics import QualityResult, summarize
from backend.quality.text import TextChunks, make_chunks, read_text

Progress = Callable[[int, int, str], None]  # (chunks done, chunks in all, what runs now)


@dataclass(slots=True)
class ModelInfo:
    """How one scored model ran: what the engine says it loaded."""

    label: str
    model: str
    options: dict[str, Any]
    dtype: str
    kv_cache_dtype: str
    quantization: str | None  # the engine's description; None: dense weights
    weights_bytes: int
    seconds: float = 0.0  # loading and scoring


@dataclass(slots=True)
class QualityReport:
    text_source: str
    num_text_tokens: int
    n_ctx: int
    num_chunks: int
    tokens_per_chunk: int  # scored: n_ctx - 1 - n_ctx // 2
    reference: ModelInfo
    models: list[ModelInfo] = field(default_factory=list)
    results: list[QualityResult] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ChunkCounter:
    """Chunks done across the whole run, reported to a progress callback."""

    def __init__(self, progress: Progress | None) -> None:
        self.progress, self.done, self.total = progress, 0, 0

    def step(self, label: str) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total, label)


def score_reference(source: ScoreSource, chunks: TextChunks, counter: ChunkCounter) -> ReferenceScores:
    reference = ReferenceScores(source.label)
    try:
        for chunk in chunks.chunks:
            reference.add(source.score(chunk, chunks.first))
            counter.step(source.label)
    except BaseException:
        reference.close()
        raise
    return reference


def score_model(
    source: ScoreSource, chunks: TextChunks, reference: ReferenceScores, counter: ChunkCounter
) -> QualityResult:
    """The model's statistics against the reference, one chunk in memory at a time."""
    stats = []
    for index, chunk in enumerate(chunks.chunks):
        stats.append(compare_chunk(reference.chunk(index), source.score(chunk, chunks.first)))
        counter.step(source.label)
    return summarize(source.label, reference.label, stats)


def load(spec: ModelSpec, n_ctx: int, defaults: dict[str, Any]) -> tuple[Any, ModelInfo]:
    from backend.engine import LLM  # torch and the engine load only when a run starts

    kwargs = spec.engine_kwargs(n_ctx, defaults)
    llm = LLM(spec.model, **kwargs)
    stats = llm.stats()
    info = ModelInfo(
        label=spec.label,
        model=spec.model,
        options=spec.options,
        dtype=stats.dtype,
        kv_cache_dtype=llm.llm_engine.config.kv_cache_dtype,
        quantization=stats.quantization,
        weights_bytes=stats.weights_bytes,
    )
    return llm, info


def check_same_tokens(label: str, tokenizer: Any, text: str, chunks: TextChunks) -> None:
    mine = make_chunks(tokenizer, text, chunks.source, chunks.n_ctx, len(chunks.chunks))
    if mine.chunks != chunks.chunks:
        raise UserError(
            f"{label} tokenizes the text differently from the reference: perplexity and KL compare "
            "models with the same tokenizer"
        )


def run_quality(config: QualityConfig, progress: Progress | None = None) -> QualityReport:
    """Score config's models against its reference on the text; progress gets (done, total, label)."""
    reference_spec = parse_spec(config.reference_spec)
    specs = [parse_spec(text) for text in config.model_specs]
    text, source = read_text(config.text)
    common = {"dtype": config.dtype} if config.dtype else {}
    models = common | ({"kv_cache_dtype": config.kv_cache_dtype} if config.kv_cache_dtype else {})
    counter = ChunkCounter(progress)
    start = time.perf_counter()
    llm, info = load(reference_spec, config.ctx, common)
    chunks = make_chunks(llm.tokenizer, text, source, config.ctx, config.chunks)
    counter.total = len(chunks.chunks) * (1 + len(specs))
    report = QualityReport(
        source, chunks.num_tokens, chunks.n_ctx, len(chunks.chunks), chunks.tokens_per_chunk, info
    )
    with score_reference(EngineSource(reference_spec.label, llm), chunks, counter) as reference:
        info.seconds = time.perf_counter() - start
        del llm
        for spec in specs:
            gc.collect()  # the previous model's weights go before the next one loads
            start = time.perf_counter()
            llm, info = load(spec, config.ctx, models)
            check_same_tokens(spec.label, llm.tokenizer, text, chunks)
            report.results.append(score_model(EngineSource(spec.label, llm), chunks, reference, counter))
            info.seconds = time.perf_counter() - start
            report.models.append(info)
            del llm
    return report
