"""Hugging Face Text Generation Inference 3.3.7: `text-generation-launcher` and its image.

TGI is in maintenance mode since 2025-12 (3.3.7 is its last release): the export says so and suggests
vLLM or SGLang. It has no served-name option (clients send the model id), keeps its weights in /data
(HF_HOME=/data in the image), and reads its API key from API_KEY.
Memory: `--cuda-memory-fraction` caps the share of total GPU memory, like vLLM's utilization.
`--max-concurrent-requests` is TGI's admission limit (queued plus running, default 128), not vLLM's
max_num_seqs: it is left at its default, and TGI sizes its batches from the KV memory itself.
"""

from __future__ import annotations

from backend.export.base import Token
from backend.export.engine import (
    EngineInfo,
    Exporter,
    Unsupported,
    map_kv,
    map_quant,
    need_checkpoint,
    refuse_dp,
    refuse_speculative,
)
from backend.export.plan import ExportPlan

INFO = EngineInfo(
    name="tgi",
    hf_endpoint=True,
    version="3.3.7",
    image="ghcr.io/huggingface/text-generation-inference:3.3.7",
    entrypoint=("text-generation-launcher",),
    container_port=80,
    container_opts=("--shm-size", "1g"),
    served_name_flag=False,
    api_key_env="API_KEY",
    cache_dir="/data",
    vm_image=True,
    notes=(
        "TGI is in maintenance mode since December 2025 (3.3.7 is its last release): it gets no new "
        "features or models. Prefer the vLLM or SGLang export for new deployments.",
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


class TGIExporter(Exporter):
    INFO = INFO

    def check(self, plan: ExportPlan) -> None:
        if plan.pp > 1:
            raise Unsupported("TGI has no pipeline parallelism; set pp=1 and shard with tp, or use vLLM")
        refuse_dp(plan, INFO)
        refuse_speculative(plan, INFO, allowed=("ngram",))
        map_quant(plan, INFO, QUANT, "For GGUF use llama.cpp or Ollama; for other formats vLLM.")
        need_checkpoint(plan, INFO, online=("fp8", "bitsandbytes"))  # TGI quantizes both at load time
        map_kv(plan, INFO, KV)

    def command(self, plan: ExportPlan, host: str, port: int) -> list[Token]:
        self.check(plan)
        argv: list[Token] = ["text-generation-launcher", "--model-id", plan.checkpoint]
        if plan.req.revision:
            argv += ["--revision", plan.req.revision]
        argv += ["--hostname", host, "--port", str(port)]
        argv += [
            "--num-shard", str(plan.tp),
            "--max-input-tokens", str(plan.max_model_len - 1),
            "--max-total-tokens", str(plan.max_model_len),
            "--max-batch-prefill-tokens", str(plan.req.max_num_batched_tokens),
            "--cuda-memory-fraction", str(plan.gpu_memory_utilization),
        ]  # fmt: skip
        if quant := QUANT[plan.quant]:
            argv += ["--quantize", quant]
        elif dtype := DTYPES.get(plan.dtype):
            argv += ["--dtype", dtype]
        if kv := KV[plan.kv_cache_dtype]:
            argv += ["--kv-cache-dtype", kv]
        if plan.options.speculative_method == "ngram":
            argv += ["--speculate", str(plan.options.num_speculative_tokens)]
        if plan.options.trust_remote_code:
            argv.append("--trust-remote-code")
        return argv


EXPORTER = TGIExporter()
