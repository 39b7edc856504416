"""This project's embedded engine: `python app.py serve` (OpenAI-compatible, Prometheus /metrics).

It runs one model on one device (CPU or one GPU), with vLLM's names for its settings. Run the commands
from a checkout of this project with its requirements installed.
"""

from __future__ import annotations

from backend.export.base import Token
from backend.export.engine import EngineInfo, Unsupported, map_kv, map_quant, refuse_speculative
from backend.export.plan import ExportPlan

INFO = EngineInfo(
    name="embedded",
    title="Embedded engine",
    version="this checkout",
    pip="pip install -r requirements.txt",
    uses_gpu=False,
)
QUANT = {"none": None, "gguf": None}
KV = {"auto": None}


def check(plan: ExportPlan) -> None:
    map_quant(
        plan, INFO, QUANT, "It loads safetensors or GGUF files; use vLLM for AWQ, GPTQ or FP8 checkpoints."
    )
    map_kv(plan, INFO, KV)
    refuse_speculative(plan, INFO)
    if plan.gpus_per_replica > 1 or plan.dp > 1:
        raise Unsupported(
            "the embedded engine runs on one device; set tp=pp=dp=1 and num_gpus=1, or use vLLM"
        )
    if plan.quant == "gguf" and not plan.model.endswith(".gguf"):
        raise Unsupported("the embedded engine loads GGUF from a local .gguf file; download the file first")
    if plan.req.revision:
        raise Unsupported("the embedded engine loads the main revision; pass a local folder for another one")


def command(plan: ExportPlan, host: str, port: int) -> list[Token]:
    check(plan)
    argv: list[Token] = [
        "python",
        "app.py",
        "serve",
        "--model",
        plan.model,
        "--host",
        host,
        "--port",
        str(port),
    ]
    argv += ["--served-model-name", plan.served_name]
    argv += [
        "--max-model-len", str(plan.max_model_len),
        "--max-num-seqs", str(plan.max_num_seqs),
        "--max-num-batched-tokens", str(plan.req.max_num_batched_tokens),
        "--block-size", str(plan.req.block_size),
        "--dtype", plan.options.dtype,
    ]  # fmt: skip
    if not plan.req.enable_prefix_caching:
        argv.append("--no-enable-prefix-caching")
    if plan.options.trust_remote_code:
        argv.append("--trust-remote-code")
    if plan.options.api_key_env:
        argv += ["--api-key-env", plan.options.api_key_env]
    return argv


def python_snippet(plan: ExportPlan) -> str:
    check(plan)
    return (
        '"""The embedded engine in-process, set up like launch.sh (run from the project root)."""\n\n'
        "from backend.engine import LLM, SamplingParams\n\n"
        "llm = LLM(\n"
        f"    {plan.model!r},\n"
        f"    dtype={plan.options.dtype!r},\n"
        f"    max_model_len={plan.max_model_len},\n"
        f"    max_num_seqs={plan.max_num_seqs},\n"
        f"    max_num_batched_tokens={plan.req.max_num_batched_tokens},\n"
        f"    block_size={plan.req.block_size},\n"
        f"    enable_prefix_caching={plan.req.enable_prefix_caching},\n"
        f"    trust_remote_code={plan.options.trust_remote_code},\n"
        ")\n"
        "params = SamplingParams(temperature=0.7, max_tokens=64)\n"
        'outputs = llm.chat([{"role": "user", "content": "Say hello in one sentence."}], params)\n'
        "print(outputs[0].outputs[0].text)\n"
    )
