"""Where a model's distributions come from: the engine's own prompt logprobs (an `LLM` loaded here, or
the app's running `AsyncLLM`), or any OpenAI-compatible server's `prompt_logprobs` (vLLM's parameter).

Each source scores one chunk: it sends the chunk's token ids as the prompt with max_tokens=1 and returns
ChunkScores for positions first .. n_ctx - 2. An engine gives whole log-softmax rows
(`return_prompt_logprobs_tensor`), so every statistic is exact; a server gives each position's token and
its `top_k` most likely tokens (vLLM's `max_logprobs` default and OpenAI's cap are 20), so PPL and top-1
agreement are exact and the KL a lower bound (scores.py).
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import httpx
import torch

from backend.engine.sampling_params import SamplingParams
from backend.quality.scores import ChunkScores

SERVER_TOP_K = 20  # vLLM's default --max-logprobs and our server's bound on prompt_logprobs
REQUEST_TIMEOUT_S = 300.0  # one chunk's prefill on a slow CPU


def rows_params() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=1, return_prompt_logprobs_tensor=True)


class ScoreSource(Protocol):
    label: str

    def score(self, token_ids: list[int], first: int) -> ChunkScores:
        """The scores of positions first .. len(token_ids) - 2."""
        ...


class EngineSource:
    """An `LLM` (backend.engine) loaded in this process."""

    def __init__(self, label: str, llm: Any) -> None:
        self.label, self.llm = label, llm

    def score(self, token_ids: list[int], first: int) -> ChunkScores:
        out = self.llm.generate(token_ids, rows_params())[0]
        return ChunkScores.from_rows(out.prompt_logprobs_tensor[first:], token_ids[first + 1 :])


class AsyncEngineSource:
    """A running `AsyncLLM` (the app's embedded engine), called from a thread without an event loop."""

    def __init__(self, label: str, engine: Any) -> None:
        self.label, self.engine = label, engine

    def score(self, token_ids: list[int], first: int) -> ChunkScores:
        rows = asyncio.run(self._rows(token_ids))
        return ChunkScores.from_rows(rows[first:], token_ids[first + 1 :])

    async def _rows(self, token_ids: list[int]) -> Any:
        final = None
        async for out in self.engine.generate(token_ids, rows_params()):
            final = out
        assert final is not None and final.prompt_logprobs_tensor is not None
        return final.prompt_logprobs_tensor


class ServerSource:
    """An OpenAI-compatible server's /v1/completions with vLLM's `prompt_logprobs` (ours answers it too)."""

    def __init__(self, label: str, base_url: str, model: str, top_k: int = SERVER_TOP_K) -> None:
        self.label, self.base_url, self.model, self.top_k = label, base_url.rstrip("/"), model, top_k

    def score(self, token_ids: list[int], first: int) -> ChunkScores:
        body = {
            "model": self.model,
            "prompt": token_ids,
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": self.top_k,
        }
        try:
            response = httpx.post(f"{self.base_url}/completions", json=body, timeout=REQUEST_TIMEOUT_S)
            response.raise_for_status()
            entries = response.json()["choices"][0]["prompt_logprobs"]
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise RuntimeError(
                f"{self.label}: {self.base_url}/completions gave no prompt_logprobs ({exc}); the server must "
                "take vLLM's prompt_logprobs parameter"
            ) from None
        return server_scores(entries, token_ids, first, self.label)


def server_scores(entries: list, token_ids: list[int], first: int, label: str) -> ChunkScores:
    """ChunkScores from vLLM's prompt_logprobs list: entry i (i >= 1) is the distribution over token i,
    {"<id>": {"logprob", "rank", ...}}, holding the token itself and the top k."""
    if not isinstance(entries, list) or len(entries) != len(token_ids):
        raise RuntimeError(
            f"{label}: prompt_logprobs has {len(entries or [])} entries for {len(token_ids)} tokens"
        )
    token_logprobs, top_ids, tops = [], [], []
    for position in range(first, len(token_ids) - 1):
        entry = {int(k): v for k, v in entries[position + 1].items()}
        target = token_ids[position + 1]
        if target not in entry:
            raise RuntimeError(f"{label}: prompt_logprobs at position {position + 1} lacks the prompt token")
        token_logprobs.append(float(entry[target]["logprob"]))
        top_ids.append(min(entry, key=lambda tid: (entry[tid]["rank"], -entry[tid]["logprob"])))
        tops.append({tid: float(v["logprob"]) for tid, v in entry.items()})
    return ChunkScores(
        torch.tensor(token_logprobs, dtype=torch.float64),
        torch.tensor(top_ids, dtype=torch.long),
        top_logprobs=tops,
    )
