"""Sampler: penalties, temperature, top-k / top-p / min-p, seeded sampling and top-N logprobs.

Greedy rows take the argmax. Random rows sample with the exponential-race trick (argmax of p / Exp(1)
noise), with the request's own torch.Generator when it has a seed, so a seeded request is reproducible
whatever else is in the batch. Logprobs are those of the raw model output, as in vLLM.
"""

from __future__ import annotations

import torch

from backend.engine import cpu_kernels
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Sequence


def apply_penalties(
    logits: torch.Tensor, params: SamplingParams, prompt: list[int], output: list[int]
) -> None:
    """In place on one row: repetition (prompt and output tokens), then frequency and presence (output),
    then the request's logit bias."""
    device = logits.device
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(prompt) | set(output)), dtype=torch.long, device=device)
        values = logits[seen]
        rp = params.repetition_penalty
        logits[seen] = torch.where(values > 0, values / rp, values * rp)
    if output and (params.frequency_penalty or params.presence_penalty):
        counts = torch.bincount(torch.tensor(output, device=device), minlength=logits.shape[0]).to(
            logits.dtype
        )
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(logits.dtype)
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias), dtype=torch.long, device=device)
        logits[ids] += torch.tensor(list(params.logit_bias.values()), dtype=logits.dtype, device=device)


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """One row, already divided by the temperature: -inf outside the kept set."""
    if top_k > 0 and top_k < logits.shape[0]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the tokens before it already reach top_p (the first token is always kept)
        drop = probs.cumsum(-1) - probs >= top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    if min_p > 0.0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < min_p * probs.max(), float("-inf"))
    return logits


class Sampler:
    def __init__(self, seed: int, use_kernel: bool = False) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.use_kernel = use_kernel  # greedy rows by cpu_kernels.argmax (the engine has its CPU kernels)

    def argmax(self, logits: torch.Tensor) -> list[int]:
        """logits.argmax(-1) as a list: cpu_kernels' argmax where it serves (torch's runs at scalar speed on
        the CPU: 64 rows of a 49152-token vocabulary take it about 4 ms of one core, the kernel under 1 ms,
        the time to read them)."""
        on_cpu = logits.device.type == "cpu" and logits.dtype == torch.float32
        if self.use_kernel and on_cpu and logits.dim() == 2 and logits.is_contiguous():
            return cpu_kernels.argmax(logits)
        return logits.argmax(-1).tolist()

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> tuple[list[int], torch.Tensor | None]:
        """Next token per row of logits [n, vocab] (fp32), one row per sequence, and the raw
        log-probabilities [n, vocab] when any sequence asked for logprobs."""
        params = [seq.params for seq in seqs]
        logprobs = logits.log_softmax(-1) if any(p.logprobs is not None for p in params) else None
        if all(p.greedy and not p.needs_penalties for p in params):
            return self.argmax(logits), logprobs
        tokens: list[int | None] = [None] * len(seqs)
        plain = [i for i, seq in enumerate(seqs) if is_plain_random(seq)]
        if len(plain) > 1:  # one batched draw instead of a few ops per row (64 rows: 4 ops, not 320)
            self._sample_plain(logits, seqs, plain, tokens)
        logits = logits.clone()
        for i, p in enumerate(params):
            if tokens[i] is not None:
                continue
            row = logits[i]
            if p.needs_penalties:
                seq = seqs[i]
                apply_penalties(row, p, seq.token_ids[: seq.num_prompt_tokens], seq.output_token_ids)
            if p.greedy:
                tokens[i] = int(row.argmax())
                continue
            row = filter_logits(row / p.temperature, p.top_k, p.top_p, p.min_p)
            probs = row.softmax(-1)
            noise = torch.empty(probs.shape).exponential_(generator=seqs[i].generator or self.generator)
            tokens[i] = int((probs / noise.to(probs.device)).argmax())
        return tokens, logprobs  # type: ignore[return-value]  # every row is set above

    def _sample_plain(self, logits: torch.Tensor, seqs: list[Sequence], rows: list[int], tokens: list):
        """Rows that only scale by a temperature and draw from the engine's generator, in one batch."""
        index = torch.tensor(rows, device=logits.device)
        temperature = torch.tensor([seqs[i].params.temperature for i in rows], device=logits.device)
        probs = (logits[index] / temperature[:, None]).softmax(-1)
        noise = torch.empty(probs.shape).exponential_(generator=self.generator).to(probs.device)
        for i, token in zip(rows, (probs / noise).argmax(-1).tolist(), strict=True):
            tokens[i] = token


def is_plain_random(seq: Sequence) -> bool:
    """Random sampling with nothing per-row but the temperature: no seed, penalties or top-k/p/min-p."""
    p = seq.params
    return (
        not p.greedy
        and seq.generator is None
        and not p.needs_penalties
        and p.top_k <= 0
        and p.top_p >= 1.0
        and p.min_p <= 0.0
    )
