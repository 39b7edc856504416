"""vLLM 0.33: `vllm serve`, the vllm/vllm-openai image and the offline `LLM(...)` API.

Memory: `--gpu-memory-utilization` is the share of the GPU's total memory that vLLM may use for weights,
activations, CUDA graphs and the KV cache together. Removed flags (`--swap-space`, `--speculative-model`,
`--num-speculative-tokens`, `--use-v2-block-manager`) are never emitted.
"""

from __future__ import annotations

import json

from backend.export.base import EnvRef, Token
from backend.export.engine import EngineInfo, Unsupported, map_kv, map_quant
from backend.export.plan import ExportPlan

INFO = EngineInfo(
    name="vllm",
    title="vLLM",
    version="0.33.0",
    image="vllm/vllm-openai:v0.33.0",
    entrypoint=("vllm", "serve"),
    pip="pip install vllm==0.33.0",
    native_dp=True,
    multi_node=True,
)
QUANT = {
    "none": None,
    "fp8": "fp8",
    "int8": "compressed-tensors",
    "awq": "awq_marlin",
    "gptq": "gptq_marlin",
    "bitsandbytes": "bitsandbytes",
    "mxfp4": "mxfp4",
    "nvfp4": "modelopt_fp4",
    "gguf": "gguf",
}
KV = {
    "auto": None,
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp8": "fp8",
    "fp8_e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
    "fp16": None,
    "float16": None,
}


def speculative_config(plan: ExportPlan) -> dict | None:
    opts = plan.options
    if opts.speculative_method is None:
        return None
    config: dict = {"method": opts.speculative_method, "num_speculative_tokens": opts.num_speculative_tokens}
    if opts.speculative_method == "ngram":
        config["prompt_lookup_max"] = 4
    else:
        config["model"] = opts.speculative_model
    return config


def engine_args(plan: ExportPlan) -> dict:
    """The plan as vLLM engine arguments (names as in `vllm serve --help` with '_' for '-')."""
    if plan.quant == "gguf" and not plan.model.endswith(".gguf"):
        raise Unsupported(
            "vLLM loads GGUF from a local .gguf file; download the file first, or use llama.cpp"
        )
    args: dict = {
        "tensor_parallel_size": plan.tp,
        "pipeline_parallel_size": plan.pp,
        "max_model_len": plan.max_model_len,
        "gpu_memory_utilization": plan.gpu_memory_utilization,
        "max_num_seqs": plan.max_num_seqs,
        "max_num_batched_tokens": plan.req.max_num_batched_tokens,
        "block_size": plan.req.block_size,
        "dtype": plan.options.dtype,
        "enable_prefix_caching": plan.req.enable_prefix_caching,
    }
    if plan.dp > 1:
        args["data_parallel_size"] = plan.dp
    if plan.req.enable_expert_parallel:
        args["enable_expert_parallel"] = True
    if quant := map_quant(plan, INFO, QUANT, "Use a bf16, fp8, AWQ or GPTQ checkpoint."):
        args["quantization"] = quant
    if kv := map_kv(plan, INFO, KV):
        args["kv_cache_dtype"] = kv
    if plan.req.revision:
        args["revision"] = plan.req.revision
    if plan.options.trust_remote_code:
        args["trust_remote_code"] = True
    if spec := speculative_config(plan):
        args["speculative_config"] = spec
    if plan.nodes > 1:
        args["distributed_executor_backend"] = "ray"
    return args


def command(plan: ExportPlan, host: str, port: int) -> list[Token]:
    argv: list[Token] = ["vllm", "serve", plan.model, "--host", host, "--port", str(port)]
    argv += ["--served-model-name", plan.served_name]
    for name, value in engine_args(plan).items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False:
            argv.append("--no-" + flag[2:])
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value, separators=(",", ":"))]
        else:
            argv += [flag, str(value)]
    if plan.options.api_key_env:
        argv += ["--api-key", EnvRef(plan.options.api_key_env)]
    return argv


def python_snippet(plan: ExportPlan) -> str:
    args = engine_args(plan)
    kwargs = "".join(f"    {name}={value!r},\n" for name, value in args.items())
    return (
        f'"""Offline batch inference with vLLM {INFO.version}: the same engine settings as launch.sh."""\n\n'
        "from vllm import LLM, SamplingParams\n\n"
        f"llm = LLM(\n    model={plan.model!r},\n{kwargs})\n"
        "params = SamplingParams(temperature=0.7, max_tokens=256)\n"
        'outputs = llm.chat([{"role": "user", "content": "Say hello in one sentence."}], params)\n'
        "print(outputs[0].outputs[0].text)\n"
    )
