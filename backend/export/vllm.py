"""vLLM 0.33: `vllm serve`, the vllm/vllm-openai image and the offline `LLM(...)` API.

Memory: `--gpu-memory-utilization` is the share of the GPU's total memory that vLLM may use for weights,
activations, CUDA graphs and the KV cache together (on vLLM's CPU build: the share of host memory).
vLLM 0.33 removed the `bitsandbytes` and `gguf` quantization methods and the old speculative flags; none is
emitted. The API key is read from VLLM_API_KEY, never put on the command line.
"""

from __future__ import annotations

import json

from backend.export.base import Token
from backend.export.engine import (
    EngineInfo,
    Exporter,
    Unsupported,
    map_kv,
    map_quant,
    need_checkpoint,
    speculative_config,
)
from backend.export.plan import ExportPlan
from backend.export.tool_calling import tool_calling_flags

INFO = EngineInfo(
    name="vllm",
    hf_endpoint=True,
    version="0.33.0",
    image="vllm/vllm-openai:v0.33.0",
    entrypoint=("vllm", "serve"),
    pip="pip install vllm==0.33.0",
    native_dp=True,
    multi_node=True,
    api_key_env="VLLM_API_KEY",
)
QUANT = {
    "none": None,
    "fp8": "fp8",
    "int8": "compressed-tensors",
    "awq": "awq_marlin",
    "gptq": "gptq_marlin",
    "mxfp4": "mxfp4",
    "nvfp4": "modelopt_fp4",
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
DEFAULT_BLOCK_SIZE = 16  # the planner's default: left to vLLM, which picks per attention backend
SERVER_ONLY = ("data_parallel_size", "distributed_executor_backend")  # `vllm serve` options LLM() refuses


class VLLMExporter(Exporter):
    INFO = INFO

    def check(self, plan: ExportPlan) -> None:
        if plan.quant == "gguf":
            raise Unsupported(
                "vLLM 0.33 no longer loads GGUF; write a dense folder with "
                "`python -m backend.engine.convert --gguf FILE --out DIR` and serve that, or use llama.cpp"
            )
        map_quant(
            plan, INFO, QUANT, "Use a bf16, fp8, AWQ or GPTQ checkpoint (bitsandbytes is gone in 0.33)."
        )
        need_checkpoint(plan, INFO, online=("fp8",))
        map_kv(plan, INFO, KV)

    def engine_args(self, plan: ExportPlan) -> dict:
        """The plan as vLLM engine arguments (names as in `vllm serve --help` with '_' for '-')."""
        self.check(plan)
        args: dict = {
            "tensor_parallel_size": plan.tp,
            "pipeline_parallel_size": plan.pp,
            "max_model_len": plan.max_model_len,
            "gpu_memory_utilization": plan.gpu_memory_utilization,
            "max_num_seqs": plan.max_num_seqs,
            "max_num_batched_tokens": plan.req.max_num_batched_tokens,
            "dtype": plan.dtype,
            "enable_prefix_caching": plan.req.enable_prefix_caching,
        }
        if plan.req.block_size != DEFAULT_BLOCK_SIZE:
            args["block_size"] = plan.req.block_size
        if plan.dp > 1:
            args["data_parallel_size"] = plan.dp
        if plan.req.enable_expert_parallel:
            args["enable_expert_parallel"] = True
        if quant := QUANT[plan.quant]:
            args["quantization"] = quant
        if kv := KV[plan.kv_cache_dtype]:
            args["kv_cache_dtype"] = kv
        if plan.req.revision:
            args["revision"] = plan.req.revision
        if plan.options.trust_remote_code:
            args["trust_remote_code"] = True
        if plan.options.enforce_eager:
            args["enforce_eager"] = True
        if spec := speculative_config(plan):
            args["speculative_config"] = spec
        if plan.nodes > 1:
            args["distributed_executor_backend"] = "ray"
        return args

    def command(self, plan: ExportPlan, host: str, port: int) -> list[Token]:
        argv: list[Token] = ["vllm", "serve", plan.checkpoint, "--host", host, "--port", str(port)]
        argv += ["--served-model-name", plan.served_name]
        for name, value in self.engine_args(plan).items():
            flag = "--" + name.replace("_", "-")
            if value is True:
                argv.append(flag)
            elif value is False:
                argv.append("--no-" + flag[2:])
            elif isinstance(value, dict):
                argv += [flag, json.dumps(value, separators=(",", ":"))]
            else:
                argv += [flag, str(value)]
        return argv + tool_calling_flags("vllm", plan.model)

    def python_snippet(self, plan: ExportPlan) -> str:
        args = {k: v for k, v in self.engine_args(plan).items() if k not in SERVER_ONLY}
        kwargs = "".join(f"        {name}={value!r},\n" for name, value in args.items())
        note = (
            f"# One engine; the server runs {plan.dp} data-parallel replicas, LLM() has no such option.\n"
            if plan.dp > 1
            else ""
        )
        return (
            f'"""Offline batch inference with vLLM {INFO.version}: the engine settings of launch.sh."""\n\n'
            "from vllm import LLM, SamplingParams\n\n"
            f"{note}"
            'if __name__ == "__main__":  # vLLM starts worker processes that import this file\n'
            f"    llm = LLM(\n        model={plan.checkpoint!r},\n" + kwargs + "    )\n"
            "    params = SamplingParams(temperature=0.7, max_tokens=256)\n"
            '    outputs = llm.chat([{"role": "user", "content": "Say hello in one sentence."}], params)\n'
            "    print(outputs[0].outputs[0].text)\n"
        )


EXPORTER = VLLMExporter()
