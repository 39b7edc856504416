"""The embedded continuous-batching engine (vLLM's vocabulary): LLM, SamplingParams, AsyncLLM."""

from backend.engine.async_llm import AsyncLLM
from backend.engine.config import EngineConfig
from backend.engine.llm import LLM
from backend.engine.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from backend.engine.sampling_params import SamplingParams

__all__ = [
    "LLM",
    "AsyncLLM",
    "CompletionOutput",
    "EngineConfig",
    "Logprob",
    "RequestMetrics",
    "RequestOutput",
    "SamplingParams",
]
