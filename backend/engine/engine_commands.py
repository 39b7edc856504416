"""The messages the event loop sends AsyncLLM's stepping thread (vLLM v1's EngineCoreRequestType, in one
process): every engine mutation is one of them, applied between steps in the order sent."""

from __future__ import annotations

from dataclasses import dataclass

from backend.engine.sampling_params import SamplingParams


@dataclass(slots=True, frozen=True)
class AddRequest:
    """Admit a tokenized request (already checked by LLMEngine.process_inputs on the event loop)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams


@dataclass(slots=True, frozen=True)
class AbortRequest:
    """End a request: its stream gets finish_reason "abort" and its KV blocks are freed."""

    request_id: str


@dataclass(slots=True, frozen=True)
class Shutdown:
    """Abort every request and end the stepping thread."""


EngineCommand = AddRequest | AbortRequest | Shutdown
