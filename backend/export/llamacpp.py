"""llama.cpp `llama-server` (builds of the b10398 series: `-fa on|off|auto`, `--spec-*` options) and the
ggml-org server-cuda image, pinned to that build.

llama.cpp runs GGUF files only. `-c` is the context of all slots together and `-np` the number of slots,
so each sequence gets `-c / -np` tokens: the plan's max_model_len. The slots are capped by the KV cache
the planner estimates, so `-c` never asks for more than fits. The API key is read from LLAMA_API_KEY.
"""

from __future__ import annotations

from backend.export.base import Token
from backend.export.engine import (
    EngineInfo,
    Exporter,
    Unsupported,
    gguf_model,
    map_kv,
    map_quant,
    refuse_dp,
    refuse_speculative,
)
from backend.export.plan import ExportPlan

INFO = EngineInfo(
    name="llamacpp",
    hf_endpoint=True,
    version="b10398",
    image="ghcr.io/ggml-org/llama.cpp:server-cuda-b10398",
    entrypoint=("llama-server",),
    container_port=8080,
    container_opts=(),
    api_key_env="LLAMA_API_KEY",
)
QUANT = {"gguf": None, "none": None}
KV = {
    "auto": None,
    "fp16": "f16",
    "float16": "f16",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "int8": "q8_0",
    "q8_0": "q8_0",
    "q4_0": "q4_0",
}


def parallel_slots(plan: ExportPlan) -> int:
    """Slots (-np): the plan's concurrency, capped by max_num_seqs and by the KV cache that fits."""
    slots = max(1, min(plan.max_num_seqs, plan.req.concurrency))
    if plan.kv_capacity_tokens is not None:
        slots = min(slots, plan.kv_capacity_tokens // plan.max_model_len)
    if slots < 1:
        raise Unsupported(
            f"one sequence of max_model_len={plan.max_model_len} tokens needs more KV cache than fits "
            f"({plan.kv_capacity_tokens} tokens by the planner's estimate); lower max_model_len, quantize "
            "the KV cache, or use more or larger GPUs"
        )
    return slots


class LlamaCppExporter(Exporter):
    INFO = INFO

    def check(self, plan: ExportPlan) -> None:
        map_quant(plan, INFO, QUANT, "Choose a GGUF quantization such as Q4_K_M, or use vLLM or SGLang.")
        refuse_dp(plan, INFO)
        refuse_speculative(plan, INFO, allowed=("draft_model",))
        if plan.req.revision:
            raise Unsupported(
                "llama.cpp downloads the main branch only; download that revision's .gguf and pass its path"
            )
        gguf_model(plan, INFO)
        map_kv(plan, INFO, KV)
        parallel_slots(plan)

    def command(self, plan: ExportPlan, host: str, port: int) -> list[Token]:
        self.check(plan)
        flag, model = gguf_model(plan, INFO)
        slots = parallel_slots(plan)
        argv: list[Token] = ["llama-server", flag, model, "--host", host, "--port", str(port)]
        argv += ["--alias", plan.served_name]
        argv += ["-c", str(plan.max_model_len * slots), "-np", str(slots), "-ngl", "999"]
        argv += ["-b", str(plan.req.max_num_batched_tokens), "-fa", "auto", "--jinja"]
        if plan.gpus_per_replica > 1:
            argv += ["-sm", "layer" if plan.pp > 1 else "row"]
        if kv := KV[plan.kv_cache_dtype]:
            argv += ["-ctk", kv, "-ctv", kv]
        if plan.options.speculative_method == "draft_model":
            draft = plan.options.speculative_model or ""
            argv += ["-md" if draft.endswith(".gguf") else "-hfd", draft, "--spec-type", "draft-simple"]
            argv += ["--spec-draft-n-max", str(plan.options.num_speculative_tokens)]
        if plan.options.enable_metrics:
            argv.append("--metrics")
        return argv

    def ready_check(self) -> list[str]:
        return ["curl", "-fsS", f"http://localhost:{INFO.container_port}{INFO.health_path}"]


EXPORTER = LlamaCppExporter()
