"""Ollama 0.24: a Modelfile plus `ollama serve` settings (environment variables) and the ollama/ollama image.

Ollama runs GGUF models; `num_ctx` is the context per request and OLLAMA_NUM_PARALLEL the requests
served at once. It has no API key, speculative decoding or served-name option: the model is named by
`ollama create` (a post-start step in every format) with a name built from the served model name. Its
models live in /root/.ollama, which every container format keeps on a volume.
"""

from __future__ import annotations

import re

from backend.export.base import EnvRef, Token
from backend.export.engine import (
    EngineInfo,
    Exporter,
    Unsupported,
    gguf_model,
    map_kv,
    map_quant,
    refuse_api_key,
    refuse_dp,
    refuse_speculative,
)
from backend.export.llamacpp import parallel_slots
from backend.export.plan import ExportPlan

INFO = EngineInfo(
    name="ollama",
    version="0.24.0",
    image="ollama/ollama:0.24.0",
    entrypoint=("ollama",),
    container_port=11434,
    health_path="/api/version",
    metrics_path=None,
    container_opts=(),
    cache_dir="/root/.ollama",
)
QUANT = {"gguf": None, "none": None}
KV = {"auto": None, "fp16": "f16", "float16": "f16", "int8": "q8_0", "q8_0": "q8_0", "q4_0": "q4_0"}


def modelfile_source(plan: ExportPlan) -> str:
    """The Modelfile's FROM value: a local .gguf path or hf.co/REPO:TYPE."""
    flag, model = gguf_model(plan, INFO)
    source = model if flag == "-m" else f"hf.co/{model}"
    if '"' in source or "\\" in source:
        raise Unsupported(
            f"a Modelfile cannot hold the path {source!r}: rename it without quotes or backslashes"
        )
    return source


class OllamaExporter(Exporter):
    INFO = INFO

    def check(self, plan: ExportPlan) -> None:
        map_quant(plan, INFO, QUANT, "Choose a GGUF quantization such as Q4_K_M, or use vLLM or SGLang.")
        refuse_dp(plan, INFO)
        refuse_speculative(plan, INFO)
        refuse_api_key(plan, INFO)
        if plan.req.revision:
            raise Unsupported(
                "Ollama pulls the main branch only; download that revision's .gguf and pass its path"
            )
        modelfile_source(plan)
        map_kv(plan, INFO, KV)

    def client_model(self, plan: ExportPlan) -> str:
        """Ollama model names are lower-case letters, digits, '.', '_' and '-'."""
        return re.sub(r"[^a-z0-9._-]+", "-", plan.served_name.lower()).strip("-._")[:80] or "model"

    def environment(self, plan: ExportPlan, host: str, port: int) -> dict[str, str | EnvRef]:
        env: dict[str, str | EnvRef] = {"OLLAMA_HOST": f"{host}:{port}"}
        env["OLLAMA_NUM_PARALLEL"] = str(parallel_slots(plan))
        env["OLLAMA_FLASH_ATTENTION"] = "1"
        if kv := map_kv(plan, INFO, KV):
            env["OLLAMA_KV_CACHE_TYPE"] = kv
        return env

    def command(self, plan: ExportPlan, host: str, port: int) -> list[Token]:
        self.check(plan)
        return ["ollama", "serve"]

    def extra_files(self, plan: ExportPlan) -> dict[str, str]:
        modelfile = (
            f"# Ollama {INFO.version} Modelfile. Create the model with:\n"
            f"#   ollama create {self.client_model(plan)} -f Modelfile\n"
            f'FROM "{modelfile_source(plan)}"\n'
            f"PARAMETER num_ctx {plan.max_model_len}\n"
        )
        return {"Modelfile": modelfile}

    def post_start(self, plan: ExportPlan) -> list[list[str]]:
        return [["ollama", "create", self.client_model(plan), "-f", "Modelfile"]]

    def ready_check(self) -> list[str]:
        return ["ollama", "list"]


EXPORTER = OllamaExporter()
