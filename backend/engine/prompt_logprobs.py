"""PromptLogprobs: one request's prompt logprobs, gathered from the logits rows of its prefill chunks.

The logits row of position i is the model's distribution over prompt token i + 1, so a prompt of P
tokens has P - 1 rows of prompt logprobs (positions 0 .. P - 2); the row of position P - 1 samples the
first output token and is not one of them (vLLM's prompt_logprobs: None for the first prompt token).
Chunks arrive in order. A sequence preempted mid-prefill recomputes from position 0 and the rows it has
already recorded are skipped, so no entry is doubled or lost. Such a sequence reads no prefix-cache
hits (as vLLM v1): a cached block holds KV, not the logits of its positions.
"""

from __future__ import annotations

from typing import Any

import torch

from backend.engine.outputs import Logprob

PromptLogprobsList = list[dict[int, Logprob] | None]


class TokenTexts:
    """tokenizer.decode([token_id]) of each token id, decoded once (vLLM's Logprob.decoded_token)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.texts: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self.texts.get(token_id)
        if text is None:
            text = self.texts[token_id] = self.tokenizer.decode([token_id])
        return text


class PromptLogprobs:
    def __init__(
        self, prompt_token_ids: list[int], top_n: int | None, keep_tensor: bool, vocab_size: int
    ) -> None:
        """top_n: logprobs per position besides the prompt token's own (-1: every token; None: no dicts,
        only the tensor); keep_tensor: keep the log-softmax rows for RequestOutput.prompt_logprobs_tensor."""
        self.prompt_token_ids = prompt_token_ids
        self.vocab_size = vocab_size
        self.top_n = top_n
        self.keep_tensor = keep_tensor
        self.entries: PromptLogprobsList | None = [None] if top_n is not None else None
        self.rows: list[torch.Tensor] = []  # [positions, vocab] float32 per chunk
        self.num_positions = 0  # rows recorded: positions 0 .. num_positions - 1
        self._tensor: torch.Tensor | None = None

    @property
    def num_rows(self) -> int:
        return len(self.prompt_token_ids) - 1

    @property
    def is_complete(self) -> bool:
        return self.num_positions >= self.num_rows

    def positions(self, start: int, end: int) -> range:
        """The positions of a chunk of tokens [start, end) whose rows are still to be recorded."""
        assert start <= self.num_positions or self.is_complete, "a prompt-logprobs chunk was skipped"
        first = max(start, self.num_positions)
        return range(first, max(first, min(end, self.num_rows)))

    def add(self, positions: range, logits: torch.Tensor, token_texts: TokenTexts) -> None:
        """Record the rows of positions (logits [len(positions), vocab] float32)."""
        assert positions.start == self.num_positions and len(positions) == logits.shape[0]
        logprobs = logits.float().log_softmax(-1)
        if self.keep_tensor:
            self.rows.append(logprobs)
        if self.entries is not None:
            targets = self.prompt_token_ids[positions.start + 1 : positions.stop + 1]
            self.entries.extend(position_logprobs(logprobs, targets, self.top_n or 0, token_texts))
        self.num_positions = positions.stop

    def tensor(self) -> torch.Tensor | None:
        """The rows recorded so far as one [positions, vocab] tensor (None when not asked for)."""
        if not self.keep_tensor:
            return None
        if self._tensor is None or self._tensor.shape[0] != self.num_positions:
            parts = self.rows or [torch.empty(0, self.vocab_size)]
            self._tensor = torch.cat(parts) if len(parts) > 1 else parts[0]
            self.rows = [self._tensor]
        return self._tensor


def position_logprobs(
    logprobs: torch.Tensor, targets: list[int], top_n: int, token_texts: TokenTexts
) -> PromptLogprobsList:
    """One dict per row: the target token's logprob and rank, plus the top_n most likely (-1: all)."""
    target = torch.tensor(targets, dtype=torch.long)
    chosen = logprobs.gather(1, target[:, None])  # [rows, 1]
    ranks = ((logprobs > chosen).sum(-1) + 1).tolist()
    k = logprobs.shape[1] if top_n == -1 else min(top_n, logprobs.shape[1])
    top_values, top_ids = torch.topk(logprobs, k, dim=-1) if k else (None, None)
    out: PromptLogprobsList = []
    for row, (token_id, value, rank) in enumerate(zip(targets, chosen[:, 0].tolist(), ranks, strict=True)):
        entries = {token_id: Logprob(value, rank, token_texts(token_id))}
        if top_values is not None and top_ids is not None:
            ids, values = top_ids[row].tolist(), top_values[row].tolist()
            for place, (tid, lp) in enumerate(zip(ids, values, strict=True), start=1):
                if tid not in entries:
                    entries[tid] = Logprob(lp, place, token_texts(tid))
        out.append(entries)
    return out
