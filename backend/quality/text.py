"""The scored text and its chunks, as llama.cpp's `llama-perplexity` cuts them.

The text is tokenized once, whole, with the tokenizer's special tokens (llama.cpp's `common_tokenize(ctx,
prompt, true)`: a BOS where the model wants one), then cut into `len(tokens) // n_ctx` chunks of n_ctx
tokens (the tail is dropped). Each chunk is evaluated from an empty cache with its first token replaced by
BOS where the tokenizer adds one, and only the second half is scored: the logits rows of positions
`first = n_ctx // 2` .. n_ctx - 2, each predicting the next token (`n_ctx - 1 - first` tokens a chunk), so
that every scored token has at least n_ctx / 2 tokens of context (tools/perplexity/perplexity.cpp,
`const int first = n_ctx/2;`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.errors import UserError

DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_TEXT = DATA_DIR / "quality_text.txt"
# The shipped text's provenance (data/README.md), carried into every report.
DEFAULT_TEXT_SOURCE = "backend/quality/data/quality_text.txt (written for this project, CC0 1.0)"
MIN_CTX = 8  # a chunk's scored half must hold a few tokens; llama.cpp takes any n_ctx


@dataclass(slots=True)
class TextChunks:
    """The token chunks every model is scored on; all models must tokenize the text to the same ids."""

    source: str  # where the text came from (the shipped file's provenance, or the user's path)
    num_tokens: int  # of the whole text
    n_ctx: int
    chunks: list[list[int]]  # each n_ctx token ids, the first replaced by BOS where the tokenizer adds one

    @property
    def first(self) -> int:
        """The first scored position of each chunk (llama.cpp's `first = n_ctx/2`)."""
        return self.n_ctx // 2

    @property
    def tokens_per_chunk(self) -> int:
        return self.n_ctx - 1 - self.first

    @property
    def num_scored(self) -> int:
        return len(self.chunks) * self.tokens_per_chunk


def shipped_text() -> str:
    """The shipped text without its header (the leading '#' lines stating its source and licence, and the
    blank line after them)."""
    lines = DEFAULT_TEXT.read_text(encoding="utf-8").splitlines(keepends=True)
    start = 0
    while start < len(lines) and lines[start].startswith("#"):
        start += 1
    while start < len(lines) and not lines[start].strip():
        start += 1
    return "".join(lines[start:])


def read_text(path: str | None) -> tuple[str, str]:
    """(text, source): the shipped text by default, else the user's UTF-8 file (scored whole)."""
    if path is None:
        return shipped_text(), DEFAULT_TEXT_SOURCE
    file = Path(path).expanduser()
    if not file.is_file():
        raise UserError(
            f"--text {path!r} is not a file: give a UTF-8 text file, or leave it out for the shipped one"
        )
    try:
        return file.read_text(encoding="utf-8"), str(file)
    except UnicodeDecodeError:
        raise UserError(f"--text {path!r} is not UTF-8 text") from None


def make_chunks(
    tokenizer: Any, text: str, source: str, n_ctx: int, max_chunks: int | None = None
) -> TextChunks:
    """The text's chunks for this tokenizer; UserError when the text is shorter than two chunks
    (llama.cpp: "you need at least 2*n_ctx tokens")."""
    if n_ctx < MIN_CTX:
        raise UserError(f"ctx must be at least {MIN_CTX} tokens, got {n_ctx}")
    tokens = list(tokenizer(text, add_special_tokens=True)["input_ids"])
    if len(tokens) < 2 * n_ctx:
        raise UserError(
            f"the text tokenizes to {len(tokens)} tokens, but ctx {n_ctx} needs at least {2 * n_ctx} "
            f"(two chunks): use a smaller --ctx or a longer --text"
        )
    count = len(tokens) // n_ctx
    if max_chunks is not None:
        count = min(count, max_chunks)
    bos = bos_token_id(tokenizer)
    chunks = []
    for i in range(count):
        chunk = tokens[i * n_ctx : (i + 1) * n_ctx]
        if bos is not None:
            chunk[0] = bos
        chunks.append(chunk)
    return TextChunks(source, len(tokens), n_ctx, chunks)


def bos_token_id(tokenizer: Any) -> int | None:
    """The BOS id when the tokenizer puts one before a text (llama.cpp's `llama_vocab_get_add_bos`)."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return None
    with_special = tokenizer("a", add_special_tokens=True)["input_ids"]
    return bos if with_special and with_special[0] == bos else None
