"""Sequence: one completion being generated, with its tokens, KV blocks and decoding state."""

from __future__ import annotations

from enum import Enum, auto
from typing import TYPE_CHECKING

import torch

from backend.engine.detokenizer import IncrementalDetokenizer
from backend.engine.outputs import Logprob, RequestMetrics
from backend.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from backend.engine.structured_output import Grammar


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


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
        if params.seed is not None:
            self.generator = torch.Generator().manual_seed(params.seed + index)

    def __len__(self) -> int:
        return len(self.token_ids)

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
