"""Structured outputs: grammars compiled once per request shape, a token bitmask per step, matchers advanced.

The grammar library is llguidance (vLLM's ``guidance`` backend; README, "Structured outputs", says why).
``compile()`` turns a StructuredOutputsParams into a validated matcher and caches it by its canonical
form; the server calls it on a bounded worker pool (AsyncLLM) before the request reaches the engine, and
the compiled matcher travels with the request (``StructuredOutputsParams.compiled``), so the engine thread
only copies it (microseconds), however many other grammars have churned through the cache meanwhile.
Every grammar is checked against GrammarLimits first and compiled under llguidance's parser limits.
Each sequence owns a copy that consumes every token it appends. Preemption recomputes KV from the
sequence's tokens, which the matcher has already consumed, so its state stays right without a rollback.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import OrderedDict
from typing import Any

import llguidance
import llguidance.hf
import torch

from backend.engine.grammar_limits import check_structured_outputs, json_options, parser_limits
from backend.engine.sampling_params import StructuredOutputsParams

CACHE_SIZE = 256  # distinct grammars kept compiled; each matcher template is a few hundred KiB at most


class Grammar:
    """One sequence's grammar state (vLLM's StructuredOutputGrammar)."""

    __slots__ = ("matcher",)

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self.matcher = matcher

    def accept_token(self, token_id: int) -> bool:
        return self.matcher.consume_token(token_id)

    def rollback(self, num_tokens: int) -> None:
        self.matcher.rollback(num_tokens)

    def is_terminated(self) -> bool:
        """True once the grammar is complete and admits no further token (the sequence stops)."""
        return self.matcher.is_stopped()


def grammar_source(params: StructuredOutputsParams) -> str:
    """The llguidance grammar for the request; raises ValueError for a malformed input."""
    if params.regex is not None:
        return llguidance.LLMatcher.grammar_from_regex(params.regex)
    if params.choice is not None:
        alternatives = " | ".join(json.dumps(c) for c in params.choice)
        return llguidance.LLMatcher.grammar_from_lark(f"start: {alternatives}")
    if params.grammar is not None:
        try:
            return llguidance.grammar_from("grammar", params.grammar)
        except ValueError as exc:
            raise ValueError(f"structured_outputs.grammar is not a valid EBNF/Lark grammar: {exc}") from None
    schema: Any = {"type": "object"} if params.json_object else params.json
    if schema is True:
        schema = {}
    options = json_options(params.disable_any_whitespace, params.whitespace_pattern)
    if params.disable_additional_properties:
        schema = _no_additional_properties(schema)
    return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=options)


def _no_additional_properties(schema: Any) -> Any:
    if isinstance(schema, dict):
        out = {k: _no_additional_properties(v) for k, v in schema.items()}
        if out.get("type") == "object" and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_no_additional_properties(v) for v in schema]
    return schema


def cache_key(params: StructuredOutputsParams) -> str:
    return json.dumps(
        [params.kind, getattr(params, params.kind), params.disable_any_whitespace,
         params.disable_additional_properties, params.whitespace_pattern],
        sort_keys=True,
    )  # fmt: skip


class StructuredOutputManager:
    """Compiles and caches grammars (thread-safe) and masks a batch of logits (engine thread)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_id: int | None) -> None:
        self.hf_tokenizer = tokenizer
        self.vocab_size = vocab_size  # width of the logits, which may exceed the tokenizer's
        self.eos_token_id = eos_token_id
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._cache: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()
        self._executor: llguidance.LLExecutor | None = None
        # byte value -> its 8 bits, lowest first: unpacks the little-endian int32 bitmask byte by byte
        self._byte_bits = ((torch.arange(256).unsqueeze(-1) >> torch.arange(8)) & 1).bool()  # [256, 8]

    def tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the vocabulary, built on first use (~0.5 s for a 49k vocabulary)."""
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = llguidance.hf.from_tokenizer(
                    self.hf_tokenizer, n_vocab=self.vocab_size, eos_token=self.eos_token_id
                )
            return self._tokenizer

    def compile(self, params: StructuredOutputsParams) -> llguidance.LLMatcher:
        """The fresh matcher for these params, compiled once and cached; ValueError names the problem
        (a limit exceeded, or a grammar that does not compile)."""
        key = cache_key(params)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        check_structured_outputs(params)
        tokenizer = self.tokenizer()
        source = grammar_source(params)
        matcher = llguidance.LLMatcher(tokenizer, source, log_level=0, limits=parser_limits())
        if matcher.is_error():
            raise ValueError(f"structured_outputs.{params.kind} cannot be compiled: {matcher.get_error()}")
        with self._lock:
            self._cache[key] = matcher
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return matcher

    def grammar(self, params: StructuredOutputsParams) -> Grammar:
        """A new per-sequence grammar: a copy of the matcher compiled for the request (the offline LLM,
        which has no front end, compiles it here on first use)."""
        template = params.compiled if params.compiled is not None else self.compile(params)
        return Grammar(template.deep_copy())

    def apply_bitmask(self, logits: torch.Tensor, grammars: list[Grammar | None]) -> torch.Tensor:
        """logits [n, vocab] with -inf on every token a row's grammar forbids (a new tensor: the
        model's output is an inference tensor); the same tensor when no row has a grammar."""
        rows = [i for i, g in enumerate(grammars) if g is not None]
        if not rows:
            return logits
        words = (self.vocab_size + 31) // 32
        bitmask = torch.full((len(grammars), words), -1, dtype=torch.int32)  # -1: every token allowed
        matchers = [(g.matcher, row) for row, g in enumerate(grammars) if g is not None]
        if len(matchers) == 1:
            row = rows[0]
            matchers[0][0].unsafe_compute_mask_ptr(bitmask[row].data_ptr(), words * 4)
        else:
            if self._executor is None:
                self._executor = llguidance.LLExecutor()
            self._executor.unsafe_compute_mask_ptr(matchers, bitmask.data_ptr(), words * 4, len(grammars))
        assert sys.byteorder == "little"  # llguidance writes token t as bit t % 32 of word t // 32
        allowed = self._byte_bits[bitmask.view(torch.uint8).long()]  # [n, words * 4, 8]
        allowed = allowed.view(len(grammars), -1)[:, : logits.shape[1]]
        return logits.masked_fill(~allowed.to(logits.device), float("-inf"))
