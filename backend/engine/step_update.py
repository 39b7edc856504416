"""StepUpdate: a step's logits -> the tokens each sequence gains (vLLM's Scheduler.update_from_output).

Plain rows get their structured-output token masks and are sampled together (when that fails, each row
alone, so the failure is pinned on its own request); the rows of a sequence that carried drafts go to
the speculator, which keeps the accepted drafts and one more token, and the KV of rejected drafts is
given back. Every token is appended through append(): logprobs, detokenization, stop checks, metrics.
An exception here is recorded against its request in `failed` (request id -> why) and the others go on.
"""

from __future__ import annotations

from typing import Any, Protocol

from backend.engine.block_manager import BlockManager
from backend.engine.exceptions import describe
from backend.engine.fault_injection import FaultInjector, check_fault
from backend.engine.output_processor import append_token, token_logprobs
from backend.engine.prompt_logprobs import TokenTexts
from backend.engine.sampler import Sampler
from backend.engine.scheduler import ScheduledSeq, Scheduler
from backend.engine.sequence import Sequence
from backend.engine.spec_decode.speculator import Speculator
from backend.engine.stats import EngineCounters
from backend.engine.structured_output import StructuredOutputManager


class UpdateSource(Protocol):
    """The engine's parts StepUpdate reads, each time it runs (a test or a bench may swap one)."""

    scheduler: Scheduler
    block_manager: BlockManager
    sampler: Sampler
    speculator: Speculator | None
    tokenizer: Any
    eos_token_ids: list[int]
    max_model_len: int
    counters: EngineCounters
    structured_output: StructuredOutputManager
    fault_injector: FaultInjector | None
    token_texts: TokenTexts


class StepUpdate:
    def __init__(self, engine: UpdateSource) -> None:
        self.engine = engine

    def record_prompt_logprobs(self, scheduled: list[ScheduledSeq], logits, failed: dict[str, str]) -> None:
        """Hand each prefill chunk's prompt rows (logits [rows, vocab], in scheduled order) to its
        sequence's PromptLogprobs."""
        row = 0
        for item in scheduled:
            positions = item.prompt_logprob_positions
            if not positions:
                continue
            rows = logits[row : row + len(positions)]
            row += len(positions)
            try:
                assert item.seq.prompt_logprobs is not None
                item.seq.prompt_logprobs.add(positions, rows, self.engine.token_texts)
            except Exception as exc:  # this request's own rows (its top-N, its tokens)
                failed[item.seq.request_id] = f"computing prompt logprobs failed: {describe(exc)}"
        assert row == logits.shape[0], "every prompt row belongs to a sequence"

    def update_from_output(
        self, sampling: list[ScheduledSeq], logits, failed: dict[str, str], now: float
    ) -> dict[str, None]:
        """Give every sequence that samples its tokens from the step's logits (rows in sampling's order);
        returns the ids of the requests that gained some, in order."""
        touched: dict[str, None] = {}
        if any(item.spec_token_ids for item in sampling):
            sampling, logits = self.verify(sampling, logits, failed, touched, now)
        seqs = [item.seq for item in sampling]
        logits = self.engine.structured_output.apply_bitmask(logits, [seq.grammar for seq in seqs])
        tokens, logprobs = self.sample(logits, seqs, failed)
        for row, (seq, token_id) in enumerate(zip(seqs, tokens, strict=True)):
            if token_id is None or seq.request_id in failed:
                continue
            try:
                self.append(seq, token_id, None if logprobs is None else logprobs[row], now)
            except Exception as exc:  # detokenizing or a stop check of this sequence failed
                failed[seq.request_id] = f"processing the output failed: {describe(exc)}"
                continue
            touched[seq.request_id] = None
        return touched

    def verify(
        self,
        sampling: list[ScheduledSeq],
        logits,
        failed: dict[str, str],
        touched: dict[str, None],
        now: float,
    ) -> tuple[list[ScheduledSeq], Any]:
        """Verify the drafts of the sequences that carried some; returns the others and their logits."""
        assert self.engine.speculator is not None
        plain: list[ScheduledSeq] = []
        plain_rows: list[int] = []
        row = 0
        for item in sampling:  # every item samples: 1 + drafts rows (num_computed_tokens moved on)
            num_rows = 1 + len(item.spec_token_ids)
            rows = logits[row : row + num_rows]
            if not item.spec_token_ids:
                plain.append(item)
                plain_rows.append(row)
            else:
                try:
                    check_fault(self.engine.fault_injector, "sample", [item.seq])
                    tokens = self.engine.speculator.verify(item, rows)
                    self.accept(item, tokens, rows, now)
                    touched[item.seq.request_id] = None
                except Exception as exc:  # this sequence's sampling or output processing
                    failed[item.seq.request_id] = f"verifying draft tokens failed: {describe(exc)}"
            row += num_rows
        return plain, logits[plain_rows]

    def accept(self, item: ScheduledSeq, tokens: list[int], logits, now: float) -> None:
        """Append the verified tokens; the KV of the accepted drafts stays, that of the rejected goes."""
        seq, num_accepted = item.seq, len(tokens) - 1
        seq.num_computed_tokens += item.num_new_tokens - len(item.spec_token_ids) + num_accepted
        logprobs = logits.log_softmax(-1) if seq.logprobs is not None else None
        for i, token_id in enumerate(tokens):
            self.append(seq, token_id, None if logprobs is None else logprobs[i], now)
            if seq.is_finished:
                return
        self.engine.block_manager.cache_full_blocks(
            seq
        )  # only now: a block is hashed once its tokens are known
        self.engine.scheduler.rollback(seq)

    def sample(self, logits, seqs: list[Sequence], failed: dict[str, str]) -> tuple[list, Any]:
        """Tokens per row (None where that row failed) and the logprob rows (or None)."""
        try:
            check_fault(self.engine.fault_injector, "sample", seqs)
            return self.engine.sampler.sample(logits, seqs)
        except Exception:  # find the rows at fault: sample each alone
            tokens: list[int | None] = []
            rows: list = []
            for i, seq in enumerate(seqs):
                try:
                    check_fault(self.engine.fault_injector, "sample", [seq])
                    (token,), logprobs = self.engine.sampler.sample(logits[i : i + 1], [seq])
                    tokens.append(token)
                    rows.append(None if logprobs is None else logprobs[0])
                except Exception as exc:  # this row's own parameters or state
                    failed[seq.request_id] = f"sampling failed: {describe(exc)}"
                    tokens.append(None)
                    rows.append(None)
            return tokens, rows

    def append(self, seq: Sequence, token_id: int, logprobs_row, now: float) -> None:
        """Append one sampled token to seq: logprobs, detokenization, stop checks, metrics."""
        if seq.num_output_tokens == 0 and seq.index == 0:
            self.engine.counters.prompt_tokens += seq.num_prompt_tokens
        if seq.logprobs is not None:
            seq.logprobs.append(
                token_logprobs(logprobs_row, token_id, seq.params.logprobs or 0, self.engine.tokenizer)
            )
        append_token(seq, token_id, self.engine.eos_token_ids, self.engine.max_model_len)
        if seq.finish_reason is not None:
            self.engine.scheduler.finish(seq)
        metrics = seq.metrics
        metrics.first_token_time = metrics.first_token_time or now
        metrics.last_token_time = now
        self.engine.counters.generation_tokens += 1
