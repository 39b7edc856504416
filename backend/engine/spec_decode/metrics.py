"""SpecDecodingStats: what speculation did, counted like vLLM's (vllm/v1/spec_decode/metrics.py).

num_drafts counts verifications (one per sequence per step that carried drafts), num_draft_tokens the
tokens proposed in them, num_accepted_tokens those the target kept, and num_accepted_tokens_per_pos[i]
how often the draft at position i was kept. Acceptance rate = accepted / draft tokens; mean accepted
length = 1 + accepted / drafts (tokens gained per verification, the bonus token included), as vLLM logs.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SpecDecodingStats:
    num_spec_tokens: int  # k: the length of num_accepted_tokens_per_pos
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.num_accepted_tokens_per_pos:
            self.num_accepted_tokens_per_pos = [0] * self.num_spec_tokens

    def observe(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        assert 0 <= num_accepted_tokens <= num_draft_tokens <= self.num_spec_tokens
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for position in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[position] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0
