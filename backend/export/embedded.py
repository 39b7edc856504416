"""This project's embedded engine: `python app.py serve` (OpenAI-compatible, Prometheus /metrics).

It runs one model on one device (CPU or one GPU), with vLLM's names for its settings. Run the commands
from a checkout of this project with its requirements installed.
"""

from __future__ import annotations

import json

from backend.engine.config import EngineConfig
from backend.export.base import Token
from backend.export.engine import (
    EngineInfo,
    Exporter,
    Unsupported,
    map_kv,
    map_quant,
    refuse_speculative,
    speculative_config,
)
from backend.export.plan import ExportPlan
from backend.export.tool_calling import tool_calling_flags

INFO = EngineInfo(
    name="embedded",
    version="(this checkout)",  # reads "Launch Embedded engine (this checkout) as planned."
    pip="pip install -r requirements.txt",
    uses_gpu=False,
    runs_in_checkout=True,
)
QUANT = {"none": None, "gguf": None, "gptq": None, "awq": None}  # runs them as stored, from config.json
KV = {"auto": None, "fp8": "fp8", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}


class EmbeddedExporter(Exporter):
    INFO = INFO

    def check(self, plan: ExportPlan) -> None:
        map_quant(
            plan,
            INFO,
            QUANT,
            "It loads dense, GPTQ, AWQ or compressed-tensors safetensors and GGUF; use vLLM for the rest.",
        )
        map_kv(plan, INFO, KV)  # the engine's kv_cache_dtype, vLLM's names
        refuse_speculative(plan, INFO, allowed=("ngram", "draft_model"))
        if plan.gpus_per_replica > 1 or plan.dp > 1:
            raise Unsupported(
                "the embedded engine runs on one device; set tp=pp=dp=1 and num_gpus=1, or use vLLM"
            )
        if plan.quant == "gguf" and not plan.checkpoint.endswith(".gguf"):
            raise Unsupported(
                "the embedded engine loads GGUF from a local .gguf file; download the file first"
            )
        if plan.req.revision:
            raise Unsupported(
                "the embedded engine loads the main revision; pass a local folder for another one"
            )

    def engine_config(self, plan: ExportPlan) -> EngineConfig:
        """The plan as the engine's own config: launch.sh's flags and the Python snippet's arguments."""
        self.check(plan)
        return EngineConfig(
            model=plan.checkpoint,
            dtype=plan.dtype,
            max_model_len=plan.max_model_len,
            max_num_seqs=plan.max_num_seqs,
            max_num_batched_tokens=plan.max_num_batched_tokens,
            block_size=plan.req.block_size,
            enable_prefix_caching=plan.req.enable_prefix_caching,
            trust_remote_code=plan.options.trust_remote_code,
            kv_cache_dtype=map_kv(plan, INFO, KV) or "auto",
            speculative_config=json.dumps(spec) if (spec := speculative_config(plan)) else None,
        )

    def command(self, plan: ExportPlan, host: str, port: int) -> list[Token]:
        argv: list[Token] = ["python", "app.py", "serve", *self.engine_config(plan).cli_args()]
        argv += ["--host", host, "--port", str(port), "--served-model-name", plan.served_name]
        argv += tool_calling_flags("embedded", plan.model)
        if plan.options.api_key_env:
            argv += ["--api-key-env", plan.options.api_key_env]  # the variable's name, not the key
        return argv

    def python_snippet(self, plan: ExportPlan) -> str:
        config = self.engine_config(plan)
        kwargs = "".join(f"    {name}={value!r},\n" for name, value in config.explicit_items()[1:])
        return (
            '"""The embedded engine in-process, set up like launch.sh (run from the project root)."""\n\n'
            "from backend.engine import LLM, SamplingParams\n\n"
            f"llm = LLM(\n    {config.model!r},\n{kwargs})\n"
            "params = SamplingParams(temperature=0.7, max_tokens=64)\n"
            'outputs = llm.chat([{"role": "user", "content": "Say hello in one sentence."}], params)\n'
            "print(outputs[0].outputs[0].text)\n"
        )


EXPORTER = EmbeddedExporter()
