"""Sequence: one completion being generated, with its tokens, KV blocks and decoding state.

A request with SamplingParams(n > 1) has n sequences (vLLM v1's child requests, ids "{index}_{request
id}"). Only the first is scheduled at first: it prefills the prompt once, and its siblings wait in its
``forks`` (status WAITING_FOR_FORK) until that prefill is done; then they share its KV blocks
(parallel_sampling.py).
"""

from __future__ import annotations

from enum import Enum, auto
from typing import TYPE_CHECKING

import torch

from backend.engine.detokenizer import IncrementalDetokenizer
from backend.engine.outputs import Logprob, RequestMetrics
from backend.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from backend.engine.prompt_logprobs import PromptLogprobs
    from backend.engine.structured_output import Grammar


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()
    WAITING_FOR_FORK = auto()  # a parallel sample waiting for its request's prompt to be prefilled


class Sequence:
    def __init__(
        self,
        request_id: str,
        index: int,
        prompt_token_ids: list[int],
        params: SamplingParams,
        detokenizer: IncrementalDetokenizer,
        metrics: RequestMetrics,
    ) -> None:
        self.request_id = request_id
        self.index = index
        self.params = params
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0  # tokens whose KV is in the cache
        self.block_table: list[int] = []
        self.block_hashes: list[bytes] = []  # chained hashes of the computed full blocks, in order
        self.status = SequenceStatus.WAITING
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.logprobs: list[dict[int, Logprob]] | None = [] if params.logprobs is not None else None
        self.detokenizer = detokenizer
        self.metrics = metrics
        self.generator: torch.Generator | None = None
        self.grammar: Grammar | None = None  # set when params.structured_outputs constrains the output
        self.spec_token_ids: list[int] = []  # draft tokens proposed for the next step (not yet verified)
        self.forks: list[Sequence] = []  # the request's other samples, forked once this one has prefilled
        # the request's prompt logprobs, gathered by the sequence that prefills the prompt (index 0)
        self.prompt_logprobs: PromptLogprobs | None = None
        if params.seed is not None:  # vLLM v1 gives child i of a seeded request the seed seed + i
            self.generator = torch.Generator().manual_seed(params.seed + index)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def child_request_id(self) -> str:
        """vLLM v1's id of this sample's child request: "{index}_{request_id}"."""
        return f"{self.index}_{self.request_id}"

    @property
    def needs_prompt_logits(self) -> bool:
        """Prompt rows are still to be recorded: the prefill keeps all its logits, and reads no cache."""
        return self.prompt_logprobs is not None and not self.prompt_logprobs.is_complete

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens
