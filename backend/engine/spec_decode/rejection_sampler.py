"""RejectionSampler: which draft tokens a sequence keeps, so its output has the target model's distribution.

Given the target's logits at the sequence's last token and at each of its k drafts ([k + 1, vocab]),
draft i is accepted with probability min(1, p(d_i) / q(d_i)); at the first rejection the token is drawn
from norm(max(0, p - q)) and the rest are dropped; when all k are accepted, a bonus token is drawn from
the last row (Leviathan et al. 2023, "modified rejection sampling"; vLLM's rejection_sampler.py). Both
proposers here draft deterministically (n-gram lookup, the draft model's argmax), so q is a point mass on
d_i: accept with probability p(d_i), else draw from p with d_i removed. Greedy rows accept while the
draft equals the argmax, so greedy output is token for token what decoding without drafts gives.
p is the distribution the plain sampler would use at that position: penalties see the drafts before it,
then temperature, top-k / top-p / min-p.
"""

from __future__ import annotations

import torch

from backend.engine.sampler import apply_penalties, filter_logits
from backend.engine.sequence import Sequence


def race(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One draw from probs (the sampler's exponential race: argmax of p / Exp(1) noise)."""
    noise = torch.empty(probs.shape).exponential_(generator=generator)
    return int((probs / noise.to(probs.device)).argmax())


class RejectionSampler:
    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator  # the engine's, for sequences without their own seed

    def verify(self, logits: torch.Tensor, seq: Sequence, draft_ids: list[int]) -> list[int]:
        """The tokens seq gains: the accepted drafts, then one more (a correction or the bonus).

        logits: [len(draft_ids) + 1, vocab] fp32, row i scoring the token after draft i - 1."""
        params = seq.params
        if params.greedy and not params.needs_penalties:
            target = logits.argmax(-1).tolist()
            num_accepted = 0
            while num_accepted < len(draft_ids) and draft_ids[num_accepted] == target[num_accepted]:
                num_accepted += 1
            return [*draft_ids[:num_accepted], target[num_accepted]]
        generator = seq.generator or self.generator
        prompt, output = seq.token_ids[: seq.num_prompt_tokens], seq.output_token_ids
        for i in range(len(draft_ids) + 1):
            row = logits[i].clone()
            if params.needs_penalties:
                apply_penalties(row, params, prompt, output + draft_ids[:i])
            if params.greedy:
                probs = torch.zeros_like(row)
                probs[int(row.argmax())] = 1.0
            else:
                probs = filter_logits(row / params.temperature, params.top_k, params.top_p, params.min_p)
                probs = probs.softmax(-1)
            if i == len(draft_ids):
                return [*draft_ids, race(probs, generator)]  # every draft accepted: the bonus token
            draft = draft_ids[i]
            accept = float(probs[draft])
            if accept >= 1.0 or float(torch.rand((), generator=generator)) < accept:
                continue
            probs[draft] = 0.0  # norm(max(0, p - q)) with q a point mass on the draft
            return [*draft_ids[:i], race(probs, generator)]
        raise AssertionError("unreachable: the loop returns at the bonus row")
