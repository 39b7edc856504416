"""DraftModelProposer: a smaller model with the same tokenizer drafts k tokens greedily (vLLM's draft_model).

The draft runs in its own ModelRunner with its own paged KV pool and BlockManager (no prefix caching).
Each target sequence has a DraftState (the draft's view of it: tokens, computed count, block table).
Before drafting, the state is synced to the target's tokens: the draft's KV stays valid up to the first
token that differs (the first rejected draft), so a step costs one catch-up pass over the new tokens
plus k - 1 one-token decodes, batched over the sequences. When the draft's pool runs out, a sequence
simply gets fewer drafts; the target's output never depends on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import torch

from backend.engine.block_manager import BlockManager
from backend.engine.config import EngineConfig
from backend.engine.loader import load_model
from backend.engine.model_runner import ModelRunner
from backend.engine.sampler import Sampler
from backend.engine.scheduler import ScheduledSeq
from backend.engine.sequence import Sequence
from backend.engine.spec_decode.config import SpeculativeConfig
from backend.errors import UserError


class Target(Protocol):
    """What the draft model needs from the engine it drafts for (LLMEngine's parts)."""

    config: EngineConfig
    dtype: torch.dtype
    device: torch.device
    tokenizer: Any
    model_name: str
    max_model_len: int
    runner: ModelRunner
    sampler: Sampler


@dataclass(slots=True)
class DraftState:
    """The draft model's copy of one sequence, shaped like a Sequence for its runner and block manager."""

    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    num_synced: int = 0  # the target's token count at the last sync: tokens before it agree


def as_sequence(state: DraftState) -> Sequence:
    """The runner and the block manager read only these fields of a Sequence, which DraftState has."""
    return cast(Sequence, state)


class DraftModelProposer:
    def __init__(
        self, runner: ModelRunner, block_manager: BlockManager, vocab_size: int, max_len: int
    ) -> None:
        self.runner = runner
        self.block_manager = block_manager
        self.vocab_size = vocab_size  # the target's logits width: wider draft logits are cut to it
        self.max_len = max_len  # positions the draft can take (its rope table)
        self.states: dict[Sequence, DraftState] = {}

    @classmethod
    def load(cls, config: SpeculativeConfig, engine: Target, num_blocks: int) -> DraftModelProposer:
        assert config.model is not None
        cfg = engine.config
        loaded = load_model(config.model, engine.dtype, engine.device, cfg.trust_remote_code)
        if loaded.tokenizer.get_vocab() != engine.tokenizer.get_vocab():
            raise UserError(
                f"the draft model {config.model} has another tokenizer than {engine.model_name}; "
                "a draft model must share the target's tokenizer (same vocabulary)"
            )
        model = loaded.model
        limit = getattr(loaded.hf_config, "max_position_embeddings", None) or engine.max_model_len
        max_len = min(limit, engine.max_model_len)
        model.init_rope(max_len)
        runner = ModelRunner(model, num_blocks, cfg.block_size)
        block_manager = BlockManager(num_blocks, cfg.block_size, enable_prefix_caching=False)
        return cls(runner, block_manager, engine.runner.model.args.vocab_size, max_len)

    def propose(self, seqs: list[Sequence], max_tokens: list[int]) -> list[list[int]]:
        states = [self._sync(seq) for seq in seqs]
        caps = [min(cap, self.max_len - len(seq)) for seq, cap in zip(seqs, max_tokens, strict=True)]
        drafts: list[list[int]] = [[] for _ in seqs]
        index = {id(state): i for i, state in enumerate(states)}
        for _ in range(max(caps, default=0)):
            scheduled = []
            for i, state in enumerate(states):
                num_new = len(state.token_ids) - state.num_computed_tokens
                if len(drafts[i]) < caps[i] and self._reserve(state, num_new):
                    scheduled.append(ScheduledSeq(as_sequence(state), num_new))
            if not scheduled:
                break
            sampling, logits = self.runner.execute(scheduled)
            for item, token_id in zip(
                sampling, logits[:, : self.vocab_size].argmax(-1).tolist(), strict=True
            ):
                item.seq.num_computed_tokens += item.num_new_tokens
                item.seq.token_ids.append(token_id)
                drafts[index[id(item.seq)]].append(token_id)
        return drafts

    def _sync(self, seq: Sequence) -> DraftState:
        """The draft's state for seq, its KV kept up to the first token where it differs from seq's."""
        state = self.states.setdefault(seq, DraftState())
        common, limit = state.num_synced, min(state.num_computed_tokens, len(seq.token_ids))
        while common < limit and state.token_ids[common] == seq.token_ids[common]:
            common += 1
        state.num_computed_tokens = min(state.num_computed_tokens, common)
        state.token_ids = list(seq.token_ids)
        state.num_synced = len(seq.token_ids)
        self.block_manager.trim(as_sequence(state))
        return state

    def _reserve(self, state: DraftState, num_new: int) -> bool:
        needed = self.block_manager.blocks_needed(as_sequence(state), num_new)
        if not self.block_manager.can_allocate(needed):
            return False
        self.block_manager.allocate(as_sequence(state), needed)
        return True

    def free(self, seq: Sequence) -> None:
        state = self.states.pop(seq, None)
        if state is not None:
            self.block_manager.free(as_sequence(state))

    @property
    def num_used_blocks(self) -> int:
        return self.block_manager.num_used_blocks
