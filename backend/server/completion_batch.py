"""The prompts of a /v1/completions request: one string or token-id list, or a batch of them.

Each prompt becomes one engine request with its own SamplingParams (max_tokens defaults to what its
context leaves), and the request's limits hold for the batch as a whole: every prompt is checked against
the context before any is admitted, a public server's max_tokens cap covers all choices together
(prompts times n), and the engine admits the batch at once or not at all (its waiting-queue limit).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from backend.server.protocol import CompletionRequest, prompt_batch, sampling_params


@dataclass(slots=True)
class CompletionPrompt:
    token_ids: list[int]
    params: Any  # SamplingParams
    text: str | None  # the prompt as text; None when it came as token ids


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text)["input_ids"])


def decode(tokenizer, token_ids: list[int]) -> str:
    return tokenizer.decode(token_ids)


async def completion_prompts(
    engine, req: CompletionRequest, structured, limit_max_tokens: Callable[..., Any]
) -> list[CompletionPrompt]:
    """Tokenize each prompt off the event loop and build its SamplingParams; raises OpenAIError (400)
    for the first prompt that does not fit."""
    prompts = prompt_batch(req.prompt)
    num_choices = len(prompts) * req.n
    out = []
    for prompt in prompts:
        if isinstance(prompt, list):
            ids, text = list(prompt), None
        else:  # a long prompt takes a while: tokenize off the event loop
            ids, text = await engine.run_in_tokenizer(encode, engine.tokenizer, prompt), prompt
        params = sampling_params(req, len(ids), engine.max_model_len, req.logprobs, structured)
        out.append(CompletionPrompt(ids, limit_max_tokens(req.max_tokens, params, num_choices), text))
    return out


async def echo_texts(engine, prompts: list[CompletionPrompt]) -> list[str]:
    """What echo repeats of each prompt: its text, or its token ids decoded (after the engine admitted
    them, so they are known to be in the vocabulary)."""
    return [
        p.text if p.text is not None else await engine.run_in_tokenizer(decode, engine.tokenizer, p.token_ids)
        for p in prompts
    ]
