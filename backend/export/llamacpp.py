"""llama.cpp `llama-server` (2026 builds, `-fa on|off|auto` syntax) and the ggml-org server-cuda image.

llama.cpp runs GGUF files only. `-c` is the context of all slots together and `-np` the number of slots,
so each sequence gets `-c / -np` tokens: the plan's max_model_len.
"""

from __future__ import annotations

from backend.export.base import EnvRef, Token
from backend.export.engine import (
    EngineInfo,
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
    title="llama.cpp",
    version="b7000",
    image="ghcr.io/ggml-org/llama.cpp:server-cuda",
    entrypoint=("llama-server",),
    container_port=8080,
    container_opts=(),
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
    """Slots (-np): the plan's concurrency, capped by max_num_seqs; each slot holds one sequence."""
    return max(1, min(plan.max_num_seqs, plan.req.concurrency))


def command(plan: ExportPlan, host: str, port: int) -> list[Token]:
    map_quant(plan, INFO, QUANT, "Choose a GGUF quantization such as Q4_K_M, or use vLLM or SGLang.")
    refuse_dp(plan, INFO)
    refuse_speculative(plan, INFO, allowed=("draft_model",))
    if plan.req.revision:
        raise Unsupported(
            "llama.cpp downloads the main branch only; download that revision's .gguf and pass its path"
        )
    flag, model = gguf_model(plan, INFO)
    slots = parallel_slots(plan)
    argv: list[Token] = ["llama-server", flag, model, "--host", host, "--port", str(port)]
    argv += ["--alias", plan.served_name]
    argv += ["-c", str(plan.max_model_len * slots), "-np", str(slots), "-ngl", "999"]
    argv += ["-b", str(plan.req.max_num_batched_tokens), "-fa", "auto", "--jinja"]
    if plan.gpus_per_replica > 1:
        argv += ["-sm", "layer" if plan.pp > 1 else "row"]
    if kv := map_kv(plan, INFO, KV):
        argv += ["-ctk", kv, "-ctv", kv]
    if plan.options.speculative_method == "draft_model":
        draft = plan.options.speculative_model or ""
        argv += ["-md" if draft.endswith(".gguf") else "-hfd", draft]
        argv += ["--draft-max", str(plan.options.num_speculative_tokens)]
    if plan.options.enable_metrics:
        argv.append("--metrics")
    if plan.options.api_key_env:
        argv += ["--api-key", EnvRef(plan.options.api_key_env)]
    return argv
