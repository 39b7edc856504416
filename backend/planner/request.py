"""The planner's input: one plan request, shared by the estimate, the exporters and the UI."""

from __future__ import annotations

from dataclasses import asdict, dataclass

ENGINES = ("vllm", "sglang", "trtllm", "tgi", "mii", "llamacpp", "ollama", "embedded")


@dataclass(slots=True)
class PlanRequest:
    """What a user asks the planner: a model, a quantization, GPUs and a workload.

    Field names follow vLLM where it has one (``max_model_len``, ``gpu_memory_utilization``,
    ``kv_cache_dtype``, ``max_num_seqs``, ``max_num_batched_tokens``).
    """

    model: str  # Hub id, local folder, GGUF file, or a bundled preset (named by its Hub id)
    gpu: str = "H100-80GB"  # short name from presets/gpus.yaml
    num_gpus: int = 1
    tp: int | None = None  # tensor parallel size; None = num_gpus // pp
    pp: int = 1  # pipeline parallel size
    dp: int = 1  # data parallel replicas (export only; each replica has tp * pp GPUs)
    enable_expert_parallel: bool = False
    quant: str = "bf16"  # key in presets/quantizations.yaml
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = None  # None = the model's limit
    input_len: int = 1024
    output_len: int = 256
    concurrency: int = 16
    gpu_memory_utilization: float = 0.92
    engine: str = "vllm"
    revision: str | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    enable_prefix_caching: bool = True

    @property
    def tensor_parallel_size(self) -> int:
        return self.tp if self.tp is not None else max(self.num_gpus // max(self.pp, 1), 1)

    def to_dict(self) -> dict:
        return asdict(self)
