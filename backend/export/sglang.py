"""SGLang 0.5.23: `python -m sglang.launch_server` and the lmsysorg/sglang image.

Memory: `--mem-fraction-static` is the share of total GPU memory for the weights plus the KV cache pool;
activations and CUDA graphs live outside it. It is converted from the plan's KV budget, so the KV cache
matches the vLLM export. AWQ/GPTQ use the Marlin kernels (`awq_marlin`, `gptq_marlin`), as vLLM does.
SGLang reads its API key only from `--api-key`: the exported command expands it from the environment.
"""

from __future__ import annotations

from backend.export.base import EnvRef, Token
from backend.export.engine import (
    EngineInfo,
    Exporter,
    gguf_file_only,
    map_kv,
    map_quant,
    need_checkpoint,
)
from backend.export.plan import ExportPlan
from backend.export.tool_calling import tool_calling_flags

INFO = EngineInfo(
    name="sglang",
    hf_endpoint=True,
    version="0.5.23",
    image="lmsysorg/sglang:v0.5.23",
    container_port=30000,
    pip='pip install "sglang[all]==0.5.23"',
    native_dp=True,
)
QUANT = {
    "none": None,
    "fp8": "fp8",
    "int8": "w8a8_int8",
    "awq": "awq_marlin",
    "gptq": "gptq_marlin",
    "bitsandbytes": "bitsandbytes",
    "mxfp4": "mxfp4",
    "nvfp4": "modelopt_fp4",
    "gguf": "gguf",
}
KV = {
    "auto": None,
    "bf16": None,
    "bfloat16": None,
    "fp16": None,
    "float16": None,
    "fp8": "fp8_e4m3",
    "fp8_e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
}
SPECULATIVE = {"eagle3": "EAGLE3", "ngram": "NGRAM", "draft_model": "STANDALONE"}
DEFAULT_BLOCK_SIZE = 16  # the planner's default: left to SGLang (--page-size) unless the plan sets another


def speculative_args(plan: ExportPlan) -> list[Token]:
    method = plan.options.speculative_method
    if method is None:
        return []
    argv: list[Token] = ["--speculative-algorithm", SPECULATIVE[method]]
    if plan.options.speculative_model:
        argv += ["--speculative-draft-model-path", plan.options.speculative_model]
    steps = plan.options.num_speculative_tokens
    argv += ["--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1"]
    return [*argv, "--speculative-num-draft-tokens", str(steps + 1)]


class SGLangExporter(Exporter):
    INFO = INFO

    def check(self, plan: ExportPlan) -> None:
        map_quant(plan, INFO, QUANT, "Use a bf16, fp8, AWQ or GPTQ checkpoint.")
        need_checkpoint(plan, INFO, online=("fp8",))
        gguf_file_only(plan, INFO)
        map_kv(plan, INFO, KV)

    def command(self, plan: ExportPlan, host: str, port: int) -> list[Token]:
        self.check(plan)
        argv: list[Token] = ["python", "-m", "sglang.launch_server", "--model-path", plan.checkpoint]
        argv += ["--host", host, "--port", str(port), "--served-model-name", plan.served_name]
        if plan.req.revision:
            argv += ["--revision", plan.req.revision]
        argv += ["--tp-size", str(plan.tp)]
        if plan.pp > 1:
            argv += ["--pp-size", str(plan.pp)]
        if plan.dp > 1:
            argv += ["--dp-size", str(plan.dp)]
        if plan.req.enable_expert_parallel:
            argv += ["--ep-size", str(plan.tp)]
        argv += [
            "--context-length", str(plan.max_model_len),
            "--mem-fraction-static", str(plan.sglang_mem_fraction_static()),
            "--max-running-requests", str(plan.max_num_seqs),
            "--chunked-prefill-size", str(plan.req.max_num_batched_tokens),
            "--dtype", plan.dtype,
        ]  # fmt: skip
        if plan.req.block_size != DEFAULT_BLOCK_SIZE:
            argv += ["--page-size", str(plan.req.block_size)]
        if quant := QUANT[plan.quant]:
            argv += ["--quantization", quant]
        if kv := KV[plan.kv_cache_dtype]:
            argv += ["--kv-cache-dtype", kv]
        if not plan.req.enable_prefix_caching:
            argv.append("--disable-radix-cache")
        if plan.options.enable_metrics:
            argv.append("--enable-metrics")
        if plan.options.enforce_eager:
            argv.append("--disable-cuda-graph")
        argv += speculative_args(plan)
        if plan.options.trust_remote_code:
            argv.append("--trust-remote-code")
        argv += tool_calling_flags("sglang", plan.model)
        if plan.options.api_key_env:
            argv += ["--api-key", EnvRef(plan.options.api_key_env)]
        return argv


EXPORTER = SGLangExporter()
