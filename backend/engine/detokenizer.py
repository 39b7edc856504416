"""Incremental detokenization that never emits half of a multi-byte character.

Each new token decodes a small window (the previous token(s) plus the new one) and emits only the text
that the window adds; while the window ends in U+FFFD (an incomplete UTF-8 sequence) nothing is emitted.
A fast tokenizer does that in Rust (`tokenizers.decoders.DecodeStream`, the same algorithm, as vLLM's
FastIncrementalDetokenizer uses it): ~2 us a token against ~10-60 us through transformers' decode().
"""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []
        self.prefix_offset = 0  # window start
        self.read_offset = 0  # tokens before this are already in self.text
        self.text = ""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        # transformers' decode() may also tidy spaces before punctuation, which DecodeStream does not
        tidies = getattr(tokenizer, "clean_up_tokenization_spaces", False)
        self.backend = backend if isinstance(backend, Tokenizer) and not tidies else None
        self.stream = DecodeStream(skip_special_tokens=skip_special_tokens) if self.backend else None

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add_token(self, token_id: int) -> str:
        """Append one token; return the text it completes (maybe "")."""
        self.token_ids.append(token_id)
        if self.stream is None or self.backend is None:
            return self._emit(final=False)
        delta = self.stream.step(self.backend, token_id)
        if not delta:
            return ""
        self._advance(delta)
        return delta

    def flush(self) -> str:
        """At the end of a sequence: emit whatever is pending, even an incomplete character."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        if self.read_offset == len(self.token_ids):
            return ""
        prefix_text = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.token_ids[self.prefix_offset :])
        if len(new_text) <= len(prefix_text) or (new_text.endswith(REPLACEMENT_CHAR) and not final):
            return ""
        delta = new_text[len(prefix_text) :]
        self._advance(delta)
        return delta

    def _advance(self, delta: str) -> None:
        """delta emitted for the tokens up to now: the next window starts at the tokens it ended."""
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)
        self.text += delta
