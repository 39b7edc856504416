"""Input limits checked before any heavy work, reusable by every endpoint that takes text or tokens.

Tokenizing costs time in proportion to the text, on one shared tokenizer thread, so a prompt's length is
bounded before it is tokenized: no prompt longer than ``token_limit × the tokenizer's longest token`` in
characters can fit (each token covers at most that many characters), and none is tokenized. After
tokenizing, the count is checked against the context and, on a public app, against its input cap
(``max_input_tokens``). A batch of prompts (or a conversation's messages) is checked as a whole.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from backend.engine.grammar_limits import check_schema
from backend.errors import UserError

MEASURE_CHUNK = 2048  # vocabulary entries read per call when measuring the longest token
MAX_TOOLS = 128  # OpenAI's API refuses more tools ("array too long ... maximum length 128")

_LONGEST: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()  # per live tokenizer


class LimitExceeded(UserError):
    """A request over one of the input limits (HTTP 400); ``param`` and ``code`` as OpenAI's errors."""

    def __init__(self, message: str, param: str | None = None, code: str = "limit_exceeded") -> None:
        super().__init__(message)
        self.param, self.code = param, code


def known_longest_token_chars(tokenizer: Any) -> int | None:
    """longest_token_chars when already measured for this tokenizer (no work), else None."""
    try:
        return _LONGEST.get(tokenizer)
    except TypeError:
        return None


def longest_token_chars(tokenizer: Any) -> int:
    """Characters in the tokenizer's longest vocabulary entry (special tokens included): no token
    covers more of a text. Computed once per tokenizer (~30 ms for 50k entries, in slices)."""
    try:
        return _LONGEST[tokenizer]
    except (KeyError, TypeError):
        pass
    longest, size = 1, len(tokenizer)
    for start in range(0, size, MEASURE_CHUNK):  # in slices: one call over the whole vocabulary held the
        ids = list(range(start, min(size, start + MEASURE_CHUNK)))  # GIL ~30 ms, stalling every stream
        longest = max(longest, *(len(t) for t in tokenizer.convert_ids_to_tokens(ids) if t is not None))
    with contextlib.suppress(TypeError):  # a tokenizer that cannot be weakly referenced: measured each time
        _LONGEST[tokenizer] = longest
    return longest


@dataclass(slots=True, frozen=True)
class InputLimits:
    max_model_len: int
    longest_token_chars: int
    max_input_tokens: int | None = (
        None  # a public app's cap (PLAYGROUND_MAX_INPUT_TOKENS, --max-input-tokens)
    )

    @property
    def token_limit(self) -> int:
        """Most input tokens a request may have: room for one output token, and within the cap."""
        room = self.max_model_len - 1
        return room if self.max_input_tokens is None else min(room, self.max_input_tokens)

    @property
    def char_limit(self) -> int:
        return self.token_limit * self.longest_token_chars

    def check_text(self, texts: str | Sequence[str], param: str = "prompt") -> None:
        """Before tokenizing: the texts together (a batch, a conversation) within char_limit."""
        total = len(texts) if isinstance(texts, str) else sum(len(t) for t in texts)
        if total > self.char_limit:
            raise LimitExceeded(
                f"The input is {total:,} characters long; at most {self.char_limit:,} are tokenized here "
                f"({self.token_limit:,} input tokens × {self.longest_token_chars} characters, this "
                f"tokenizer's longest token){self._why()}. Please reduce the length of the input.",
                param,
                "context_length_exceeded",
            )

    def check_tokens(self, num_tokens: int, param: str = "prompt") -> None:
        """After tokenizing (or for token ids): the count within the cap. The context itself is
        checked with max_tokens (protocol.sampling_params), in OpenAI's words."""
        if self.max_input_tokens is not None and num_tokens > self.max_input_tokens:
            raise LimitExceeded(
                f"The input is {num_tokens:,} tokens; this server accepts at most {self.max_input_tokens:,} "
                "input tokens per request (its input limit).",
                param,
                "context_length_exceeded",
            )

    def check_count(self, count: int, what: str, param: str) -> None:
        """More items (messages, prompts) than input tokens cannot fit: each renders at least one."""
        if count > self.token_limit:
            raise LimitExceeded(
                f"{count:,} {what} cannot fit in {self.token_limit:,} input tokens{self._why()} (each "
                f"takes at least one); send at most {self.token_limit:,}.",
                param,
            )

    def _why(self) -> str:
        cap = self.max_input_tokens is not None and self.max_input_tokens < self.max_model_len - 1
        return " (this server's input limit)" if cap else f" (a context of {self.max_model_len:,} tokens)"


async def engine_input_limits(engine: Any, max_input_tokens: int | None = None) -> InputLimits:
    """The limits for an AsyncLLM (its tokenizer measured once, on the tokenizer thread)."""
    tokenizer = engine.tokenizer
    longest = known_longest_token_chars(tokenizer)
    if longest is None:
        longest = await engine.run_in_tokenizer(longest_token_chars, tokenizer)
    return InputLimits(engine.max_model_len, longest, max_input_tokens)


def check_tools(tools: Sequence[Any] | None) -> None:
    """At most MAX_TOOLS tools, each one's parameter schema within the grammar limits."""
    if not tools:
        return
    if len(tools) > MAX_TOOLS:
        raise LimitExceeded(f"{len(tools)} tools were given; the limit is {MAX_TOOLS} (max_tools)", "tools")
    for i, tool in enumerate(tools):
        try:
            check_schema(tool.function.parameters, f"tools[{i}].function.parameters")
        except ValueError as exc:
            raise LimitExceeded(str(exc), "tools") from None
