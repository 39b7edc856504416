"""Compare's quality columns: each target scored on the quality text (backend/quality) beside its speed and
memory, against one reference: perplexity, ln(PPL / PPL ref), KL divergence and top-1 agreement.

The reference comes first and gives whole log-softmax rows: `app.py compare` runs our engine in this
process on the compared model (fp32 by default, before any target starts, then releases it); the Compare
tab uses the embedded engine it is already running. Targets are servers, scored through vLLM's
`prompt_logprobs=20` while they are up (our server and vLLM answer it): their perplexity and top-1 are
exact, their KL a lower bound (the top 20 per position, backend/quality/scores.py). A server that gives no
prompt logprobs (llama.cpp's, SGLang's) gets no quality figures and a note saying why.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backend.quality.measure import Progress, load
from backend.quality.session import QualitySession
from backend.quality.sources import AsyncEngineSource, EngineSource, ServerSource
from backend.quality.specs import parse_spec
from backend.quality.text import make_chunks, read_text

if TYPE_CHECKING:
    from backend.bench.compare import CompareRow, CompareTarget, Comparison
    from backend.quality.sources import ScoreSource
    from backend.quality.statistics import QualityResult

# Four chunks of 256 tokens: 508 scored tokens (each with 128 or more of context), one short prefill each
# per target, within any model's context (tests' tiny models stop at 512). `app.py quality` scores the
# whole shipped text in llama.cpp's usual chunks of 512.
DEFAULT_CHUNKS, DEFAULT_CTX = 4, 256
EMBEDDED = "embedded"  # the Compare tab's name for the engine running in the app
REFERENCE_OPTIONS = "dtype=float32"  # app.py compare's default reference: the compared model in fp32


@dataclass(slots=True)
class TargetQuality:
    """One target's quality figures, or why it has none."""

    result: QualityResult | None
    note: str = ""  # why result is None, or how the figures were taken


class CompareQuality:
    """A QualitySession over a comparison: the reference first, then each target while it is up."""

    def __init__(self, tokenizer: Any, chunks: int, n_ctx: int, progress: Progress | None = None) -> None:
        text, source = read_text(None)
        self.chunks = make_chunks(tokenizer, text, source, n_ctx, chunks)
        self.session = QualitySession(self.chunks, num_sources=0, progress=progress)
        self.reference: QualityResult | None = None

    def add_reference(self, source: ScoreSource) -> QualityResult:
        self.session.counter.total += len(self.chunks.chunks)
        self.reference = self.session.add(source)
        return self.reference

    def add(self, source: ScoreSource) -> TargetQuality:
        """The source scored against the reference; a server without prompt logprobs gets a note."""
        assert self.reference is not None, "add_reference first"
        self.session.counter.total += len(self.chunks.chunks)
        try:
            return TargetQuality(self.session.add(source))
        except RuntimeError as exc:  # ServerSource: the server gave no usable prompt_logprobs
            return TargetQuality(None, str(exc))

    def score_target(self, target: CompareTarget) -> TargetQuality:
        return self.add(ServerSource(target.name, target.base_url, target.model))

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> CompareQuality:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def engine_reference(
    spec_text: str, chunks: int = DEFAULT_CHUNKS, n_ctx: int = DEFAULT_CTX, progress: Progress | None = None
) -> CompareQuality:
    """A CompareQuality whose reference is our engine in this process (`MODEL@OPTIONS`, as `app.py
    quality`'s specs); the engine is released before this returns, its rows kept on disk."""
    spec = parse_spec(spec_text)
    llm, info = load(spec, n_ctx, {})
    quality = CompareQuality(llm.tokenizer, chunks, n_ctx, progress)
    try:
        quality.add_reference(EngineSource(f"{spec.label} (reference, {info.dtype})", llm))
    except BaseException:
        quality.close()
        raise
    del llm
    gc.collect()  # the reference's weights go before the first target starts
    return quality


def score_running(
    comparison: Comparison,
    targets: list[CompareTarget],
    embedded: Any | None = None,  # the running AsyncLLM when a target is it (its name: "embedded")
    chunks: int = DEFAULT_CHUNKS,
    progress: Progress | None = None,
) -> None:
    """Quality columns for targets that are all running (the Compare tab): the reference is the embedded
    engine when it is among them (whole rows), else the first target (no KL then); each other target is
    scored through its server. Without a tokenizer (only URLs) the columns stay empty, with a note."""
    if embedded is None or EMBEDDED not in [t.name for t in targets]:
        embedded = None
    first = next((t for t in targets if t.name == EMBEDDED), targets[0]) if embedded else targets[0]
    tokenizer = embedded.tokenizer if embedded is not None else tokenizer_of(targets)
    if tokenizer is None:
        for target in targets:
            attach(comparison.rows(), target.name, TargetQuality(None, "no target names its tokenizer"))
        return
    with CompareQuality(tokenizer, chunks, DEFAULT_CTX, progress) as quality:
        source: ScoreSource = (
            AsyncEngineSource(EMBEDDED, embedded)
            if embedded is not None
            else ServerSource(first.name, first.base_url, first.model)
        )
        try:
            comparison.quality_reference = quality.add_reference(source)
        except RuntimeError as exc:  # the first target's server gives no prompt logprobs
            for target in targets:
                attach(comparison.rows(), target.name, TargetQuality(None, f"no reference: {exc}"))
            return
        attach(comparison.rows(), first.name, TargetQuality(comparison.quality_reference))
        for target in targets:
            if target is not first:
                attach(comparison.rows(), target.name, quality.score_target(target))


def tokenizer_of(targets: list[CompareTarget]) -> Any | None:
    from backend.bench.datasets import load_tokenizer

    name = next((t.tokenizer for t in targets if t.tokenizer), None)
    return load_tokenizer(name) if name else None


def default_reference_spec(model: str) -> str:
    return f"{model}@{REFERENCE_OPTIONS}"


def attach(rows: list[CompareRow], target: str, quality: TargetQuality) -> None:
    """The target's figures on each of its rows (one per concurrency: "NAME c=4")."""
    for row in rows:
        if row.target == target or row.target.startswith(f"{target} c="):
            row.quality, row.quality_note = quality.result, quality.note
