"""Parallel sampling (SamplingParams.n): the prompt is prefilled once and its KV blocks are shared.

vLLM v1 fans a request with n > 1 out into n child requests ("{i}_{request id}"; child i of a seeded
request samples with seed + i) and fans their outputs back in (its ParentRequest). Here the children are
the request's n Sequences and Request.output() fans them in. Only the first sample is scheduled at first;
in the step that finishes its prefill, its siblings fork its block table (every prompt block gains a
reference, so the prompt's KV is computed and stored once, as in the PagedAttention paper) and sample
their first token from the same logits row, each with its own generator. A sample that later writes into
the shared last, partial block copies it first (BlockManager's copy-on-write). A sibling that finds no
room in max_num_seqs (n greater than max_num_seqs) starts out like a preempted sequence: no blocks, its
tokens recomputed when it is admitted.
"""

from __future__ import annotations

import torch

from backend.engine.scheduler import ScheduledSeq, Scheduler


def fork_samples(
    sampling: list[ScheduledSeq], logits: torch.Tensor, scheduler: Scheduler
) -> tuple[list[ScheduledSeq], torch.Tensor]:
    """Fork the waiting siblings of every sequence whose prefill finished this step. Returns the rows to
    sample (sampling's, each parent followed by its siblings) and their logits [rows, vocab], a
    sibling's row a copy of its parent's."""
    if not any(item.seq.forks for item in sampling):
        return sampling, logits
    items: list[ScheduledSeq] = []
    rows: list[int] = []
    row = queue_place = 0
    for item in sampling:
        num_rows = 1 + len(item.spec_token_ids)
        items.append(item)
        rows.extend(range(row, row + num_rows))
        for child in item.seq.forks:
            queue_place += scheduler.add_fork(item.seq, child, queue_place)
            items.append(ScheduledSeq(child, 0))
            rows.append(row + num_rows - 1)
        item.seq.forks = []
        row += num_rows
    return items, logits[torch.tensor(rows, device=logits.device)]
