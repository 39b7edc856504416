"""The embedded continuous-batching engine (vLLM's vocabulary): LLM, SamplingParams, AsyncLLM.

The names below load on first use, so that `backend.engine.config` (read by every CLI's --help and by
the UI's forms) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from backend.engine.async_llm import AsyncLLM
    from backend.engine.config import EngineConfig
    from backend.engine.llm import LLM
    from backend.engine.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
    from backend.engine.sampling_params import SamplingParams, StructuredOutputsParams

_MODULES = {
    "LLM": "llm",
    "AsyncLLM": "async_llm",
    "CompletionOutput": "outputs",
    "EngineConfig": "config",
    "Logprob": "outputs",
    "RequestMetrics": "outputs",
    "RequestOutput": "outputs",
    "SamplingParams": "sampling_params",
    "StructuredOutputsParams": "sampling_params",
}
__all__ = [
    "LLM",
    "AsyncLLM",
    "CompletionOutput",
    "EngineConfig",
    "Logprob",
    "RequestMetrics",
    "RequestOutput",
    "SamplingParams",
    "StructuredOutputsParams",
]


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
