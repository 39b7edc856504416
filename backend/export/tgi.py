"""Hugging Face Text Generation Inference 3.3.5: `text-generation-launcher` and its image.

TGI is in maintenance mode since 2026: the export says so and suggests vLLM or SGLang.
Memory: `--cuda-memory-fraction` caps the share of total GPU memory, like vLLM's utilization.
"""

from __future__ import annotations

from backend.export.base import EnvRef, Token
from backend.export.engine import EngineInfo, Unsupported, map_kv, map_quant, refuse_dp, refuse_speculative
from backend.export.plan import ExportPlan

INFO = EngineInfo(
    name="tgi",
    title="TGI",
    version="3.3.5",
    image="ghcr.io/huggingface/text-generation-inference:3.3.5",
    entrypoint=("text-generation-launcher",),
    container_port=80,
    container_opts=("--shm-size", "1g"),
    notes=(
        "TGI is in maintenance mode (since 2026): it gets fixes but no new features or models. "
        "Prefer the vLLM or SGLang export for new deployments.",
    ),
)
QUANT = {
    "none": None,
    "fp8": "fp8",
    "awq": "awq",
    "gptq": "gptq",
    "bitsandbytes": "bitsandbytes-nf4",
    "int8": "compressed-tensors",
}
KV = {
    "auto": None,
    "bf16": None,
    "bfloat16": None,
    "fp16": None,
    "float16": None,
    "fp8": "fp8_e4m3fn",
    "fp8_e4m3": "fp8_e4m3fn",
    "fp8_e5m2": "fp8_e5m2",
}
DTYPES = {"auto": None, "bfloat16": "bfloat16", "float16": "float16"}


def command(plan: ExportPlan, host: str, port: int) -> list[Token]:
    if plan.pp > 1:
        raise Unsupported("TGI has no pipeline parallelism; set pp=1 and shard with tp, or use vLLM")
    refuse_dp(plan, INFO)
    refuse_speculative(plan, INFO, allowed=("ngram",))
    quant = map_quant(plan, INFO, QUANT, "For GGUF use llama.cpp or Ollama; for other formats vLLM.")
    argv: list[Token] = ["text-generation-launcher", "--model-id", plan.model]
    if plan.req.revision:
        argv += ["--revision", plan.req.revision]
    argv += ["--hostname", host, "--port", str(port), "--served-model-name", plan.served_name]
    argv += [
        "--num-shard", str(plan.tp),
        "--max-input-tokens", str(plan.max_model_len - 1),
        "--max-total-tokens", str(plan.max_model_len),
        "--max-batch-prefill-tokens", str(plan.req.max_num_batched_tokens),
        "--max-concurrent-requests", str(plan.max_num_seqs),
        "--cuda-memory-fraction", str(plan.gpu_memory_utilization),
    ]  # fmt: skip
    if quant:
        argv += ["--quantize", quant]
    elif dtype := DTYPES.get(plan.options.dtype):
        argv += ["--dtype", dtype]
    if kv := map_kv(plan, INFO, KV):
        argv += ["--kv-cache-dtype", kv]
    if plan.options.speculative_method == "ngram":
        argv += ["--speculate", str(plan.options.num_speculative_tokens)]
    if plan.options.trust_remote_code:
        argv.append("--trust-remote-code")
    if plan.options.api_key_env:
        argv += ["--api-key", EnvRef(plan.options.api_key_env)]
    return argv
