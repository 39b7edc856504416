"""SpeculativeConfig: vLLM's `speculative_config` (a JSON object on the CLI, a dict for `LLM(...)`).

Only the keys the embedded engine runs are accepted; an unknown key or method is an error that names the
allowed ones, never silently ignored. No torch here: EngineConfig (read by every --help) validates with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from backend.errors import UserError

METHODS = ("ngram", "draft_model")
MAX_SPECULATIVE_TOKENS = 16  # like the exporter's limit (export/base.py); more never pays on a CPU
# vLLM's default when neither bound is given (vllm/config/speculative.py: "arbitrarily chosen")
DEFAULT_PROMPT_LOOKUP = 5
# Batch size above which no drafts are proposed (vLLM's disable_by_batch_size). Measured with
# `python -m benchmarks.speculative` (README, "Speculative decoding"): on the 2-core CPU, n-gram
# speculation made the copy workload 2.08x faster at batch 1 but 0.77x at batch 4, because a verification
# row costs nearly as much as a decode there (the quantized GEMV is compute bound); so only a lone
# sequence speculates by default. On a GPU, where extra rows are nearly free, raise it.
DEFAULT_DISABLE_BY_BATCH_SIZE = 1


@dataclass(slots=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int | None = None  # ngram: shortest suffix n-gram to look up
    prompt_lookup_max: int | None = None  # ngram: longest (tried first)
    model: str | None = None  # draft_model: a smaller model with the same tokenizer
    disable_by_batch_size: int | None = None  # more running sequences than this: no drafts

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise UserError(
                f"speculative_config.method must be one of {', '.join(METHODS)}, got {self.method!r}"
            )
        k = self.num_speculative_tokens
        if not _is_int(k) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise UserError(
                f"speculative_config.num_speculative_tokens must be an integer in "
                f"[1, {MAX_SPECULATIVE_TOKENS}], got {k!r}"
            )
        if self.method == "ngram":
            self._check_ngram()
        elif not isinstance(self.model, str) or not self.model:
            raise UserError('speculative_config with method "draft_model" needs "model": a draft model path')
        if self.disable_by_batch_size is None:
            self.disable_by_batch_size = DEFAULT_DISABLE_BY_BATCH_SIZE
        if not _is_int(self.disable_by_batch_size) or self.disable_by_batch_size < 1:
            raise UserError(
                "speculative_config.disable_by_batch_size must be an integer >= 1, "
                f"got {self.disable_by_batch_size!r}"
            )

    def _check_ngram(self) -> None:
        if self.model is not None:
            raise UserError('speculative_config "model" is for method "draft_model"; ngram needs none')
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        low = high if low is None else low
        high = low if high is None else high
        low = DEFAULT_PROMPT_LOOKUP if low is None else low
        high = DEFAULT_PROMPT_LOOKUP if high is None else high
        if not (_is_int(low) and _is_int(high) and 1 <= low <= high):
            raise UserError(
                "speculative_config needs integers 1 <= prompt_lookup_min <= prompt_lookup_max, "
                f"got {self.prompt_lookup_min!r} and {self.prompt_lookup_max!r}"
            )
        self.prompt_lookup_min, self.prompt_lookup_max = low, high

    @classmethod
    def parse(cls, value: str | dict[str, Any]) -> SpeculativeConfig:
        """From the JSON text of `--speculative-config` or the dict of `LLM(speculative_config=...)`."""
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise UserError(f"speculative_config is not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise UserError(f"speculative_config must be a JSON object, got {type(value).__name__}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise UserError(
                f"unknown speculative_config key(s) {', '.join(unknown)}; allowed: {', '.join(names)}"
            )
        missing = [name for name in ("method", "num_speculative_tokens") if name not in value]
        if missing:
            raise UserError(f"speculative_config needs {' and '.join(missing)}")
        return cls(**value)


def canonical_json(value: str | dict[str, Any]) -> str:
    """The config's JSON text as given, validated (sorted keys, no spaces): what EngineConfig stores."""
    SpeculativeConfig.parse(value)
    data = json.loads(value) if isinstance(value, str) else value
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
