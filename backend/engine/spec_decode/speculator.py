"""Speculator: the engine's speculative decoding, between its steps (vLLM's spec decode in the runner).

Before a step it asks the proposer for drafts for every decoding sequence that may speculate; the
scheduler then schedules each with its drafts, the runner scores them all in one forward pass (rows go
through the same paged attention as a prefill chunk), and verify() picks the tokens kept. A sequence
does not speculate when it has a grammar (structured outputs: the drafts would bypass its token mask;
it decodes one token per step as before) or when more than disable_by_batch_size sequences run.
"""

from __future__ import annotations

from typing import Protocol

import torch

from backend.engine.scheduler import ScheduledSeq
from backend.engine.sequence import Sequence
from backend.engine.spec_decode.config import SpeculativeConfig
from backend.engine.spec_decode.draft_model import DraftModelProposer, Target
from backend.engine.spec_decode.metrics import SpecDecodingStats
from backend.engine.spec_decode.ngram_proposer import NgramProposer
from backend.engine.spec_decode.rejection_sampler import RejectionSampler


class Proposer(Protocol):
    def propose(self, seqs: list[Sequence], max_tokens: list[int]) -> list[list[int]]:
        """Draft tokens for each sequence (at most max_tokens[i], maybe none)."""
        ...

    def free(self, seq: Sequence) -> None:
        """Forget a sequence that finished or was preempted (and free what it holds)."""
        ...

    @property
    def num_used_blocks(self) -> int:
        """KV blocks the proposer holds in its own pool (0 without a model)."""
        ...


def may_speculate(seq: Sequence) -> bool:
    """Decoding (one uncomputed token) and free of a grammar."""
    return seq.num_uncomputed_tokens == 1 and seq.grammar is None


class Speculator:
    def __init__(
        self, config: SpeculativeConfig, proposer: Proposer, generator: torch.Generator, max_model_len: int
    ) -> None:
        self.config = config
        self.proposer = proposer
        self.rejection_sampler = RejectionSampler(generator)
        self.max_model_len = max_model_len
        self.stats = SpecDecodingStats(config.num_speculative_tokens)

    def propose(self, running: list[Sequence]) -> None:
        """Set spec_token_ids of the running sequences for the coming step."""
        for seq in running:
            seq.spec_token_ids = []
        assert self.config.disable_by_batch_size is not None
        if len(running) > self.config.disable_by_batch_size:
            return
        seqs = [seq for seq in running if may_speculate(seq)]
        caps = [self.max_drafts(seq) for seq in seqs]
        seqs, caps = [s for s, c in zip(seqs, caps, strict=True) if c > 0], [c for c in caps if c > 0]
        if seqs:
            for seq, drafts in zip(seqs, self.proposer.propose(seqs, caps), strict=True):
                seq.spec_token_ids = drafts

    def max_drafts(self, seq: Sequence) -> int:
        """k, or fewer near max_tokens (one token of the budget is the bonus) or max_model_len."""
        max_tokens = seq.params.max_tokens or self.max_model_len
        remaining = max_tokens - seq.num_output_tokens - 1
        return max(0, min(self.config.num_speculative_tokens, remaining, self.max_model_len - len(seq)))

    def verify(self, item: ScheduledSeq, logits: torch.Tensor) -> list[int]:
        """The tokens item.seq gains this step; logits [1 + drafts, vocab]."""
        tokens = self.rejection_sampler.verify(logits, item.seq, item.spec_token_ids)
        self.stats.observe(len(item.spec_token_ids), len(tokens) - 1)
        return tokens

    def free(self, seq: Sequence) -> None:
        seq.spec_token_ids = []
        self.proposer.free(seq)


def make_speculator(engine: Target, num_blocks: int) -> Speculator | None:
    """The engine's Speculator from its speculative_config (None when unset); loads a draft model."""
    if engine.config.speculative_config is None:
        return None
    config = SpeculativeConfig.parse(engine.config.speculative_config)
    proposer: Proposer
    if config.method == "ngram":
        proposer = NgramProposer(config)
    else:
        proposer = DraftModelProposer.load(config, engine, num_blocks)
    return Speculator(config, proposer, engine.sampler.generator, engine.max_model_len)
