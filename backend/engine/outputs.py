"""What generate() returns: RequestOutput, CompletionOutput, Logprob, RequestMetrics (vLLM's shapes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int  # 1 = the most likely token
    decoded_token: str | None = None


@dataclass(slots=True)
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" | None while running
    stop_reason: str | int | None = None  # the matched stop string or stop token id

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(0.0))
    error: str | None = None  # why the engine failed this request (finish_reason "error")
    # SamplingParams.prompt_logprobs: None for the first prompt token, then each token's dict
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    # SamplingParams.return_prompt_logprobs_tensor: [len(prompt) - 1, vocab] float32 log-softmax rows,
    # row i the model's distribution over prompt token i + 1 (docs/serving.md)
    prompt_logprobs_tensor: torch.Tensor | None = None
