"""TensorRT-LLM 1.2: `trtllm-serve` with the PyTorch backend, plus its extra options YAML.

Memory: `free_gpu_memory_fraction` is the share of the memory still free after the weights are loaded
that goes to the KV cache; it is converted from the plan's KV budget. trtllm-serve merges the YAML over
its command line, block by block, so the YAML's `kv_cache_config` carries the fraction too (a block without
it would reset it to the default). Quantized weights must be a checkpoint made with NVIDIA ModelOpt
(`--qformat fp8|int4_awq|w4a8_awq|nvfp4`); their format is read from the checkpoint, so no quantization
flag is passed, and the plan must name that checkpoint.
"""

from __future__ import annotations

from backend.export.base import Token, dump_yaml
from backend.export.engine import (
    EngineInfo,
    Exporter,
    map_kv,
    map_quant,
    need_checkpoint,
    refuse_api_key,
    refuse_dp,
)
from backend.export.plan import ExportPlan

INFO = EngineInfo(
    name="trtllm",
    version="1.2.1",
    image="nvcr.io/nvidia/tensorrt-llm/release:1.2.1",
    # NVIDIA's install steps: the MPI runtime first, then the wheel from NVIDIA's index
    pip="sudo apt-get update && sudo apt-get install -y libopenmpi-dev\npip install tensorrt_llm==1.2.1",
    metrics_path="/prometheus/metrics",
    served_name_flag=False,
    # NVIDIA's recommended container settings (TensorRT-LLM's docker run examples)
    container_opts=("--ipc=host", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864"),
)
CONFIG_FILE = "extra_llm_api_options.yaml"
QUANT = {"none": None, "fp8": None, "awq": None, "nvfp4": None, "mxfp4": None}
KV = {
    "auto": "auto",
    "bf16": "auto",
    "bfloat16": "auto",
    "fp16": "auto",
    "float16": "auto",
    "fp8": "fp8",
    "fp8_e4m3": "fp8",
}
SPECULATIVE = {"eagle3": "Eagle3", "ngram": "NGram", "draft_model": "DraftTarget"}


def extra_options(plan: ExportPlan) -> dict:
    options: dict = {
        "kv_cache_config": {
            "dtype": map_kv(plan, INFO, KV),
            "enable_block_reuse": plan.req.enable_prefix_caching,
            "tokens_per_block": plan.req.block_size,
            "free_gpu_memory_fraction": plan.trtllm_free_gpu_memory_fraction(),
        },
        "enable_chunked_prefill": True,
        "return_perf_metrics": plan.options.enable_metrics,
    }
    if method := plan.options.speculative_method:
        spec: dict = {
            "decoding_type": SPECULATIVE[method],
            "max_draft_len": plan.options.num_speculative_tokens,
        }
        if plan.options.speculative_model:
            spec["speculative_model_dir"] = plan.options.speculative_model
        if method == "ngram":
            spec["max_matching_ngram_size"] = 4
        options["speculative_config"] = spec
    if plan.req.revision:
        options["revision"] = plan.req.revision
    return options


class TRTLLMExporter(Exporter):
    INFO = INFO

    def check(self, plan: ExportPlan) -> None:
        map_quant(
            plan, INFO, QUANT,
            "Quantize with NVIDIA ModelOpt (fp8, int4_awq, nvfp4); for GGUF use llama.cpp, "
            "for GPTQ or bitsandbytes vLLM.",
        )  # fmt: skip
        need_checkpoint(plan, INFO)  # no online quantization: the ModelOpt checkpoint holds the weights
        refuse_dp(plan, INFO)
        refuse_api_key(plan, INFO)
        extra_options(plan)  # refuses an unsupported KV dtype before any file is written

    def command(self, plan: ExportPlan, host: str, port: int) -> list[Token]:
        self.check(plan)
        argv: list[Token] = ["trtllm-serve", plan.checkpoint, "--backend", "pytorch"]
        argv += ["--host", host, "--port", str(port), "--tp_size", str(plan.tp), "--pp_size", str(plan.pp)]
        if plan.req.enable_expert_parallel:
            argv += ["--ep_size", str(plan.tp)]
        argv += [
            "--max_batch_size", str(plan.max_num_seqs),
            "--max_num_tokens", str(plan.req.max_num_batched_tokens),
            "--max_seq_len", str(plan.max_model_len),
            "--kv_cache_free_gpu_memory_fraction", str(plan.trtllm_free_gpu_memory_fraction()),
            "--config", CONFIG_FILE,
        ]  # fmt: skip
        if plan.options.trust_remote_code:
            argv.append("--trust_remote_code")
        return argv

    def extra_files(self, plan: ExportPlan) -> dict[str, str]:
        header = (
            f"# TensorRT-LLM {INFO.version} LLM API options (`trtllm-serve --config {CONFIG_FILE}`)."
            "\n# trtllm-serve merges these over its command line: kv_cache_config repeats the KV fraction.\n"
        )
        return {CONFIG_FILE: header + dump_yaml(extra_options(plan))}


EXPORTER = TRTLLMExporter()
