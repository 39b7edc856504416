"""SamplingParams: how one request is decoded (vLLM's names and defaults), with StructuredOutputsParams."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)
# torch.Generator.manual_seed takes a 64-bit integer; vLLM bounds seed to int64 the same way
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
# below this a temperature overflows the logits to inf/NaN; vLLM raises it to this value (_MAX_TEMP)
MIN_TEMPERATURE = 1e-2
# OpenAI and TGI (--max-stop-sequences) allow 4 stop strings; a generous bound keeps the per-token
# stop check cheap, so one request cannot slow the batch
MAX_STOP_STRINGS = 64
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 1024
MAX_LOGIT_BIAS = 1024  # token ids one request may bias


@dataclass(slots=True)
class StructuredOutputsParams:
    """Constrain the output to exactly one of: a JSON schema, any JSON object, a regex, one of some
    strings, or a grammar (EBNF/GBNF or Lark). vLLM's ``structured_outputs`` request field."""

    json: str | dict[str, Any] | bool | None = None  # a schema (or its JSON text); True: any JSON
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    # the compiled matcher, set off the engine thread (AsyncLLM.compile_structured_output) so that the
    # engine thread only copies it; never read from a request body (init=False)
    compiled: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        given = [name for name in self.kinds() if getattr(self, name) not in (None, False)]
        _check(
            len(given) == 1,
            "structured_outputs takes exactly one of json, regex, choice, grammar, json_object; "
            f"got {', '.join(given) or 'none'}",
        )
        if isinstance(self.json, str):
            try:
                self.json = json.loads(self.json)
            except ValueError as exc:
                raise ValueError(f"structured_outputs.json is not valid JSON: {exc}") from None
        _check(
            self.json is None or isinstance(self.json, dict | bool),
            "structured_outputs.json must be a JSON schema object",
        )
        _check(
            self.choice is None or (bool(self.choice) and all(isinstance(c, str) for c in self.choice)),
            "structured_outputs.choice must be a non-empty list of strings",
        )

    @staticmethod
    def kinds() -> tuple[str, ...]:
        return ("json", "regex", "choice", "grammar", "json_object")

    @property
    def kind(self) -> str:
        return next(name for name in self.kinds() if getattr(self, name) not in (None, False))


@dataclass(slots=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: off
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16  # None: up to max_model_len
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None  # top-N logprobs per generated token (plus the sampled one)
    # top-N logprobs of each prompt token (plus the token itself); -1: the whole vocabulary (vLLM)
    prompt_logprobs: int | None = None
    # ours, not vLLM's: RequestOutput.prompt_logprobs_tensor gets the prompt's log-softmax rows as one
    # float32 tensor [prompt_len - 1, vocab] (docs/serving.md), the form a perplexity or KL tool reads
    return_prompt_logprobs_tensor: bool = False
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None
    # OpenAI's logit_bias: token id -> a bias in [-100, 100] added to its logit before sampling (the
    # logprobs stay the raw model's, as in vLLM)
    logit_bias: dict[int, float] | None = None
    stop_strings: list[str] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        _check(_is_int(self.n) and self.n >= 1, f"n must be an integer >= 1, got {self.n!r}")
        _check(
            _is_real(self.temperature) and self.temperature >= 0.0,
            f"temperature must be >= 0, got {self.temperature}",
        )
        _check(_is_real(self.top_p) and 0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}")
        _check(
            _is_int(self.top_k) and self.top_k >= -1,
            f"top_k must be -1 or 0 (off) or an integer >= 1, got {self.top_k!r}",
        )
        _check(
            _is_real(self.min_p) and 0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}"
        )
        _check(
            self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 1),
            f"max_tokens must be an integer >= 1 (or None), got {self.max_tokens!r}",
        )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(_is_real(value) and -2.0 <= value <= 2.0, f"{name} must be in [-2, 2], got {value}")
        _check(
            _is_real(self.repetition_penalty) and self.repetition_penalty > 0.0,
            f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty}",
        )
        _check(
            self.logprobs is None or (_is_int(self.logprobs) and 0 <= self.logprobs <= 20),
            f"logprobs must be None or an integer in [0, 20], got {self.logprobs!r}",
        )
        _check(
            self.prompt_logprobs is None or (_is_int(self.prompt_logprobs) and self.prompt_logprobs >= -1),
            "prompt_logprobs must be None, -1 (the whole vocabulary) or an integer >= 0, "
            f"got {self.prompt_logprobs!r}",
        )
        _check(
            isinstance(self.return_prompt_logprobs_tensor, bool),
            "return_prompt_logprobs_tensor must be True or False, "
            f"got {self.return_prompt_logprobs_tensor!r}",
        )
        _check(
            self.seed is None or (_is_int(self.seed) and SEED_MIN <= self.seed <= SEED_MAX),
            f"seed must be None or an integer in [{SEED_MIN}, {SEED_MAX}], got {self.seed!r}",
        )
        _check(
            self.structured_outputs is None or isinstance(self.structured_outputs, StructuredOutputsParams),
            "structured_outputs must be a StructuredOutputsParams",
        )
        _check(
            self.logit_bias is None
            or (
                isinstance(self.logit_bias, dict)
                and len(self.logit_bias) <= MAX_LOGIT_BIAS
                and all(
                    _is_int(k) and k >= 0 and _is_real(v) and -100 <= v <= 100
                    for k, v in self.logit_bias.items()
                )
            ),
            f"logit_bias must map at most {MAX_LOGIT_BIAS} token ids (integers >= 0) to biases in "
            "[-100, 100]",
        )
        self.stop_strings = _stop_strings(self.stop)
        self.stop_token_ids = list(self.stop_token_ids or [])
        _check(
            len(self.stop_token_ids) <= MAX_STOP_TOKEN_IDS and all(map(_is_int, self.stop_token_ids)),
            f"stop_token_ids must be at most {MAX_STOP_TOKEN_IDS} integers",
        )
        if self.top_k == 0:
            self.top_k = -1
        if 0.0 < self.temperature < MIN_TEMPERATURE:
            log.warning(
                "temperature %s is below %s (inf/NaN logits); using %s",
                self.temperature,
                MIN_TEMPERATURE,
                MIN_TEMPERATURE,
            )
            self.temperature = MIN_TEMPERATURE

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_prompt_logits(self) -> bool:
        """The prefill must keep the logits of every prompt row, not only the last."""
        return self.prompt_logprobs is not None or self.return_prompt_logprobs_tensor

    @property
    def needs_penalties(self) -> bool:
        """The logits change per row before sampling (sampler.apply_penalties): penalties or a logit bias."""
        penalised = (
            self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0
        )
        return penalised or bool(self.logit_bias)


def _stop_strings(stop: str | list[str] | None) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    _check(all(isinstance(s, str) and s for s in stops), "stop must be non-empty strings")
    _check(
        len(stops) <= MAX_STOP_STRINGS,
        f"stop may hold at most {MAX_STOP_STRINGS} strings, got {len(stops)}",
    )
    longest = max(map(len, stops), default=0)
    _check(
        longest <= MAX_STOP_STRING_CHARS,
        f"each stop string may be at most {MAX_STOP_STRING_CHARS} characters, got one of {longest}",
    )
    return stops


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    """A finite int or float: NaN and infinities never reach torch."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
