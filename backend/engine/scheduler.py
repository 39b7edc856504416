"""Scheduler: picks, each step, which sequences run and how many tokens each computes.

One token budget (max_num_batched_tokens) per step is shared by running sequences first (a decode costs
one token, an unfinished prefill as many as fit), then waiting ones in arrival order, so long prompts are
chunked and never stall running decodes. When the KV pool runs out, the most recently admitted running
sequence is preempted: its blocks are freed and it goes back to the front of the queue, to be recomputed.
A decoding sequence with draft tokens (speculative decoding) asks for 1 + drafts tokens, the drafts cut
to what the budget leaves; their KV slots are reserved like any other and given back by rollback().
The first sample of a request with n > 1 is admitted only when its n - 1 siblings fit in max_num_seqs
too (they join the running set when its prefill is done, parallel_sampling.py); every sample's tokens
count against the budget. A prefill that records prompt logprobs marks the positions whose logits rows
it keeps (ScheduledSeq.prompt_logprob_positions) and is never served prefix-cache hits.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from backend.engine.block_manager import BlockManager
from backend.engine.sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int  # including the draft tokens
    spec_token_ids: list[int] = field(default_factory=list)  # drafts verified this step (after the tokens)
    # prompt positions whose logits rows this step keeps for prompt logprobs (prompt_logprobs.py)
    prompt_logprob_positions: range = range(0)

    @property
    def samples(self) -> bool:
        """True when this step computes the sequence's last known token, so its logits give the next one."""
        num_known = self.num_new_tokens - len(self.spec_token_ids)
        return self.seq.num_computed_tokens + num_known == len(self.seq.token_ids)

    @property
    def num_logits(self) -> int:
        """Rows of logits this sequence gets: one per draft plus the bonus token (0 mid-prefill)."""
        return 1 + len(self.spec_token_ids) if self.samples else 0


def scheduled_seq(seq: Sequence, num_new_tokens: int, drafts: list[int] | None = None) -> ScheduledSeq:
    """seq computes num_new_tokens (drafts included) this step; a prefill that records prompt logprobs
    names the positions whose logits rows it keeps."""
    positions = range(0)
    if seq.needs_prompt_logits:
        assert seq.prompt_logprobs is not None
        start = seq.num_computed_tokens
        positions = seq.prompt_logprobs.positions(start, start + num_new_tokens)
    return ScheduledSeq(seq, num_new_tokens, drafts or [], positions)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        on_free: Callable[[Sequence], None] | None = None,
    ) -> None:
        self.block_manager = block_manager
        self.on_free = on_free  # called when a sequence gives back its blocks (the draft model's too)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> list[ScheduledSeq]:
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledSeq] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_uncomputed_tokens, budget)
            drafts = seq.spec_token_ids[: budget - num_new] if seq.num_uncomputed_tokens == 1 else []
            if not self._reserve(seq, num_new + len(drafts)):
                preempted = True
                if seq.status == SequenceStatus.WAITING:  # it was itself preempted
                    break
                continue  # a later sequence made room; retry this one
            scheduled.append(scheduled_seq(seq, num_new + len(drafts), drafts))
            budget -= num_new + len(drafts)
            i += 1

        num_seqs = len(self.running) + sum(len(seq.forks) for seq in self.running)
        while not preempted and self.waiting and budget > 0:
            seq = self.waiting[0]
            if num_seqs + min(1 + len(seq.forks), self.max_num_seqs) > self.max_num_seqs:
                break  # its samples could not all run
            hits = 0 if seq.needs_prompt_logits else self.block_manager.match_prefix(seq)
            self.block_manager.free_skipped_blocks(seq)  # a long cached prefix: only its window stays
            num_new = min(seq.num_uncomputed_tokens, budget)
            needed = self.block_manager.blocks_needed(seq, num_new)
            if not self.block_manager.can_allocate(needed):
                self.block_manager.free(seq)  # give back the prefix blocks; try again next step
                break
            if not seq.needs_prompt_logits:
                self.block_manager.record_prefix_lookup(len(seq.token_ids), hits)
            self.block_manager.allocate(seq, needed)
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled.append(scheduled_seq(seq, num_new))
            budget -= num_new
            num_seqs += 1 + len(seq.forks)
        return scheduled

    def _reserve(self, seq: Sequence, num_new: int) -> bool:
        """Allocate the blocks seq needs; preempt the lowest-priority running sequence if short."""
        self.block_manager.free_skipped_blocks(seq)  # first the blocks its window has left behind
        needed = self.block_manager.blocks_needed(seq, num_new)
        if self.block_manager.can_allocate(needed):
            self.block_manager.allocate(seq, needed)
            return True
        self._preempt(self.running.pop())
        return False

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.spec_token_ids = []
        if self.on_free is not None:
            self.on_free(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def add_fork(self, parent: Sequence, child: Sequence, place: int) -> int:
        """child, a sibling sample of parent (whose prefill just finished), runs on parent's blocks; without
        room in max_num_seqs it waits at the queue's front (place-th, from 0) like a preempted sequence.
        Returns the queue places taken."""
        if len(self.running) < self.max_num_seqs:
            self.block_manager.fork(parent, child)
            child.status = SequenceStatus.RUNNING
            self.running.append(child)
            return 0
        child.status = SequenceStatus.WAITING
        self.waiting.insert(place, child)
        return 1

    def rollback(self, seq: Sequence) -> None:
        """After verification: give back the blocks that hold only rejected draft tokens (never cached)."""
        self.block_manager.trim(seq)
        seq.spec_token_ids = []

    def finish(self, seq: Sequence) -> None:
        """Remove a finished or aborted sequence wherever it is and free its blocks at once."""
        if seq.status == SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status == SequenceStatus.WAITING:
            self.waiting.remove(seq)
        seq.forks = []  # siblings still waiting for this one's prefill are finished by their request
        self.block_manager.free(seq)
        if self.on_free is not None:
            self.on_free(seq)
        seq.status = SequenceStatus.FINISHED
