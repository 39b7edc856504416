"""Benchmark prompts: random, chat (from the bundled corpus), prefix-repetition, or a JSONL file.

Nothing is downloaded. With a tokenizer, `random` is vLLM's random dataset (`vllm bench serve
--dataset-name random`): runs of consecutive token ids (special tokens left out) from a random first id,
decoded to text and re-encoded until the text is exactly input_len tokens. Each prompt of a seed's stream
starts at a different id (a shuffled order of them), so no two prompts of one stream share a first KV block
and a slice of the stream (`skip_requests`) never repeats another slice's prompts. Without a tokenizer,
`random` is a run of corpus words and lengths count words (about 1.3 tokens each for English); the
benchmark reports the server's exact token counts either way.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

CORPUS_PATH = Path(__file__).parent / "data" / "shakespeare.txt"
DATASETS = ("random", "chat", "prefix-repetition")
CHAT_INSTRUCTIONS = (
    "Summarize the following passage in two sentences.",
    "Who is speaking in this scene, and what does each of them want?",
    "Rewrite this passage in plain modern English.",
    "Continue this scene with a few more lines in the same style.",
    "What is the mood of this passage? Quote the lines that show it.",
    "Explain the main argument made in this passage to a student.",
    "List the characters mentioned below and describe each in one line.",
    "Write a short title for this scene and explain your choice.",
)


@dataclass(slots=True)
class SampleRequest:
    """One benchmark request: a completion prompt or chat messages, and its max_tokens."""

    prompt: str | None
    messages: list[dict[str, str]] | None
    output_len: int


@cache
def corpus_text() -> str:
    return CORPUS_PATH.read_text(encoding="utf-8")


@cache
def corpus_words() -> tuple[str, ...]:
    return tuple(corpus_text().split())


def _length(rng: random.Random, mean: int, range_ratio: float) -> int:
    low, high = max(1, int(mean * (1 - range_ratio))), max(1, int(mean * (1 + range_ratio)))
    return rng.randint(low, high)


def _words(rng: random.Random, n: int, tokenizer=None) -> str:
    """A run of ``n`` corpus words (or exactly ``n`` tokens with a tokenizer) from a random start."""
    words = corpus_words()
    start = rng.randrange(len(words))
    picked = [words[(start + i) % len(words)] for i in range(n)]
    text = " ".join(picked)
    if tokenizer is None:
        return text
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:n]
    return tokenizer.decode(ids)


def _passage(rng: random.Random, n_words: int) -> str:
    """A passage of about ``n_words`` words starting at a line boundary, line breaks kept."""
    lines = corpus_text().splitlines()
    start = rng.randrange(len(lines))
    out, count = [], 0
    for i in range(len(lines)):
        line = lines[(start + i) % len(lines)]
        out.append(line)
        count += len(line.split())
        if count >= n_words:
            break
    return "\n".join(out).strip()


def random_requests(n, input_len, output_len, range_ratio, rng) -> Iterator[SampleRequest]:
    """Without a tokenizer: runs of corpus words, lengths in words."""
    for _ in range(n):
        prompt = _words(rng, _length(rng, input_len, range_ratio))
        yield SampleRequest(prompt, None, _length(rng, output_len, range_ratio))


def allowed_token_ids(tokenizer) -> list[int]:
    special = set(tokenizer.all_special_ids)
    return [i for i in range(tokenizer.vocab_size) if i not in special]


def fit_to_length(tokenizer, ids: list[int], length: int, rng: random.Random, allowed: list[int]) -> str:
    """Text that encodes to exactly ``length`` tokens: decode, re-encode, cut or pad with random ids, up
    to 10 times (vLLM's gen_prompt_decode_to_target_len; a pair of ids can re-encode as three)."""
    for _ in range(10):
        prompt = tokenizer.decode(ids)
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        if len(ids) == length:
            return prompt
        ids = ids[:length] + [rng.choice(allowed) for _ in range(length - len(ids))]
    return tokenizer.decode(ids)


def random_token_requests(n, input_len, output_len, range_ratio, rng, tokenizer) -> Iterator[SampleRequest]:
    """vLLM's random dataset: request i is consecutive allowed ids from the i-th of a shuffled order of
    first ids (each prompt begins differently)."""
    allowed = allowed_token_ids(tokenizer)
    firsts = list(range(len(allowed)))
    rng.shuffle(firsts)
    for i in range(n):
        length, first = _length(rng, input_len, range_ratio), firsts[i % len(firsts)]
        ids = [allowed[(first + j) % len(allowed)] for j in range(length)]
        prompt = fit_to_length(tokenizer, ids, length, rng, allowed)
        yield SampleRequest(prompt, None, _length(rng, output_len, range_ratio))


def chat_requests(n, input_len, output_len, range_ratio, rng) -> Iterator[SampleRequest]:
    for _ in range(n):
        instruction = rng.choice(CHAT_INSTRUCTIONS)
        content = f"{instruction}\n\n{_passage(rng, _length(rng, input_len, range_ratio))}"
        messages = [{"role": "user", "content": content}]
        yield SampleRequest(None, messages, _length(rng, output_len, range_ratio))


def prefix_repetition_requests(n, input_len, output_len, num_prefixes, prefix_len, rng, tokenizer=None):
    """``num_prefixes`` shared prefixes of ``prefix_len``, each followed by a random suffix."""
    prefix_len = min(prefix_len, input_len - 1)
    prefixes = [_words(rng, prefix_len, tokenizer) for _ in range(num_prefixes)]
    for i in range(n):
        suffix = _words(rng, input_len - prefix_len, tokenizer)
        yield SampleRequest(f"{prefixes[i % num_prefixes]} {suffix}", None, output_len)


def file_requests(path: str, n: int, output_len: int, rng: random.Random) -> list[SampleRequest]:
    """JSONL lines with "prompt" (str) or "messages" (chat), optionally "max_tokens"/"output_len"."""
    rows = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not valid JSON ({exc})") from None
        if not isinstance(row, dict) or not (
            isinstance(row.get("prompt"), str) or isinstance(row.get("messages"), list)
        ):
            raise ValueError(f'{path}:{number}: each line needs "prompt" (a string) or "messages" (a list)')
        out_len = int(row.get("max_tokens") or row.get("output_len") or output_len)
        rows.append(SampleRequest(row.get("prompt"), row.get("messages"), out_len))
    if not rows:
        raise ValueError(f"{path}: no requests found")
    return [rows[i % len(rows)] for i in range(n)] if n > len(rows) else rng.sample(rows, n)


def sample_requests(config) -> list[SampleRequest]:
    """The requests for a BenchConfig (same seed, same requests)."""
    return list(iter_requests(config))


def iter_requests(config) -> Iterator[SampleRequest]:
    """The same requests, built one at a time as the benchmark sends them (a file is read at once): the
    seed's stream without its first ``skip_requests``, each with ``config.salt`` before its text."""
    skip = config.skip_requests
    stream = itertools.islice(_stream(config, skip + config.num_prompts), skip, None)
    return (salted(req, config.salt) for req in stream) if config.salt else stream


def salted(req: SampleRequest, salt: str) -> SampleRequest:
    """``req`` with ``salt`` before its text: the prompt's, or the first message's for chat (after the
    chat template's own opening, which every request shares anyway)."""
    if req.messages is None:
        return SampleRequest(salt + (req.prompt or ""), None, req.output_len)
    first, *rest = req.messages
    return SampleRequest(None, [{**first, "content": salt + first["content"]}, *rest], req.output_len)


def _stream(config, n: int) -> Iterator[SampleRequest]:
    rng = random.Random(config.seed)
    tokenizer = load_tokenizer(config.tokenizer) if config.tokenizer else None
    inp, out, ratio = config.input_len, config.output_len, config.range_ratio
    if config.dataset == "random" and tokenizer is not None:
        return random_token_requests(n, inp, out, ratio, rng, tokenizer)
    if config.dataset == "random":
        return random_requests(n, inp, out, ratio, rng)
    if config.dataset == "chat":
        return chat_requests(n, inp, out, ratio, rng)
    if config.dataset == "prefix-repetition":
        return prefix_repetition_requests(n, inp, out, config.num_prefixes, config.prefix_len, rng, tokenizer)
    if config.dataset.endswith(".jsonl"):
        return iter(file_requests(config.dataset, n, out, rng))
    raise ValueError(f"unknown dataset {config.dataset!r}: use one of {', '.join(DATASETS)} or a FILE.jsonl")


@cache
def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    from backend.default_model import split_gguf_path

    folder, gguf_file = split_gguf_path(name)
    return AutoTokenizer.from_pretrained(folder, **({"gguf_file": gguf_file} if gguf_file else {}))
