"""The prompts of a /v1/completions request: one string or token-id list, or a batch of them.

Each prompt becomes one engine request with its own SamplingParams (max_tokens defaults to what its
context leaves), and the request's limits hold for the batch as a whole: the number of prompts, their
text together before any is tokenized and their tokens together against a public server's input cap
(limits.InputLimits), every prompt against the context before any is admitted, a public server's
max_tokens cap over all choices together (prompts times n), the client's waiting share (one place per
prompt) and the engine's waiting queue (the batch is admitted at once or not at all).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from backend.server.limits import InputLimits
from backend.server.protocol import CompletionRequest, prompt_batch, sampling_params


@dataclass(slots=True)
class CompletionPrompt:
    token_ids: list[int]
    params: Any  # SamplingParams
    text: str | None  # the prompt as text; None when it came as token ids


def encode_batch(tokenizer, texts: list[str]) -> list[list[int]]:
    return [list(ids) for ids in tokenizer(texts)["input_ids"]]


def decode_batch(tokenizer, token_ids: list[list[int]]) -> list[str]:
    return [tokenizer.decode(ids) for ids in token_ids]


async def tokenize_prompts(engine, prompts: list[str | list[int]], limits: InputLimits) -> list[list[int]]:
    """Each prompt's token ids: the texts bounded together first, then tokenized in one call off the event
    loop; the batch's tokens together within the input cap. LimitExceeded (400) otherwise."""
    limits.check_count(len(prompts), "prompts", "prompt")
    texts = [p for p in prompts if isinstance(p, str)]
    limits.check_text(texts)
    encoded = iter(await engine.run_in_tokenizer(encode_batch, engine.tokenizer, texts) if texts else [])
    token_ids = [next(encoded) if isinstance(p, str) else list(p) for p in prompts]
    limits.check_tokens(sum(len(ids) for ids in token_ids))
    return token_ids


async def completion_prompts(
    engine, req: CompletionRequest, structured, limits: InputLimits, limit_max_tokens: Callable[..., Any]
) -> list[CompletionPrompt]:
    """The batch's prompts with their SamplingParams; raises OpenAIError or LimitExceeded (400) for the
    first limit the batch or one of its prompts exceeds."""
    prompts = prompt_batch(req.prompt)
    token_ids = await tokenize_prompts(engine, prompts, limits)
    num_choices = len(prompts) * req.n
    out = []
    for prompt, ids in zip(prompts, token_ids, strict=True):
        params = sampling_params(req, len(ids), engine.max_model_len, req.logprobs, structured)
        text = prompt if isinstance(prompt, str) else None
        out.append(CompletionPrompt(ids, limit_max_tokens(req.max_tokens, params, num_choices), text))
    return out


async def echo_texts(engine, prompts: list[CompletionPrompt]) -> list[str]:
    """What echo repeats of each prompt: its text, or its token ids decoded (after the engine admitted
    them, so they are known to be in the vocabulary), in one call off the event loop."""
    to_decode = [p.token_ids for p in prompts if p.text is None]
    decoded = iter(
        await engine.run_in_tokenizer(decode_batch, engine.tokenizer, to_decode) if to_decode else []
    )
    return [p.text if p.text is not None else next(decoded) for p in prompts]
