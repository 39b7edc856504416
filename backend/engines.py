"""The serving engines this project plans for, launches and exports to: one table of their traits.

The planner (how an engine sizes its KV cache, whether it captures CUDA graphs, whether it runs on a
CPU-only host), the exporters (backend/export/, one Exporter per engine) and the UI read these rows;
nothing else keeps a list of engine names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

KVSizing = Literal["budget", "context", "own"]


@dataclass(slots=True, frozen=True)
class EngineTraits:
    name: str
    title: str
    # budget: the KV cache is what a memory budget leaves after weights and activations (vLLM & co);
    # context: exactly the context it is given (llama.cpp -c, Ollama num_ctx); own: the embedded engine's
    kv_sizing: KVSizing
    cuda_graphs: bool  # captures CUDA graphs (their memory counts against the budget)
    runs_on_cpu: bool  # also serves on a CPU-only host
    # its pool is a share of the GPU's whole memory (gpu_memory_utilization, SGLang's mem_fraction_static,
    # TGI's cuda_memory_fraction): raising the share is advice that helps. TensorRT-LLM's share is of what
    # the weights leave, and context-sized engines take no share.
    sized_by_utilization: bool = False


ENGINE_TRAITS: dict[str, EngineTraits] = {
    t.name: t
    for t in (
        EngineTraits(
            "vllm", "vLLM", "budget", cuda_graphs=True, runs_on_cpu=False, sized_by_utilization=True
        ),
        EngineTraits(
            "sglang", "SGLang", "budget", cuda_graphs=True, runs_on_cpu=False, sized_by_utilization=True
        ),
        EngineTraits("trtllm", "TensorRT-LLM", "budget", cuda_graphs=True, runs_on_cpu=False),
        EngineTraits("tgi", "TGI", "budget", cuda_graphs=False, runs_on_cpu=False, sized_by_utilization=True),
        EngineTraits(
            "mii", "DeepSpeed-MII", "budget", cuda_graphs=False, runs_on_cpu=False, sized_by_utilization=True
        ),
        EngineTraits("llamacpp", "llama.cpp", "context", cuda_graphs=False, runs_on_cpu=True),
        EngineTraits("ollama", "Ollama", "context", cuda_graphs=False, runs_on_cpu=True),
        EngineTraits("embedded", "Embedded engine", "own", cuda_graphs=False, runs_on_cpu=True),
    )
}
ENGINES = tuple(ENGINE_TRAITS)
CPU_ENGINES = tuple(n for n, t in ENGINE_TRAITS.items() if t.runs_on_cpu)
CONTEXT_ENGINES = tuple(n for n, t in ENGINE_TRAITS.items() if t.kv_sizing == "context")
GRAPH_ENGINES = tuple(n for n, t in ENGINE_TRAITS.items() if t.cuda_graphs)
