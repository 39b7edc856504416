"""DeepSpeed-MII 0.3.3: the OpenAI-compatible server module and `mii.serve(...)`.

MII's last release is 0.3.3 (2025-03): the export says so and suggests vLLM or SGLang. It serves fp16/bf16
weights only, answers to the model id (no served-name option) and ships no container image.
"""

from __future__ import annotations

from backend.export.base import EnvRef, Token
from backend.export.engine import EngineInfo, Exporter, Unsupported, map_kv, map_quant, refuse_speculative
from backend.export.plan import ExportPlan

INFO = EngineInfo(
    name="mii",
    version="0.3.3",
    pip="pip install deepspeed-mii==0.3.3",
    native_dp=True,
    metrics_path=None,
    served_name_flag=False,
    notes=(
        "DeepSpeed-MII has been dormant since 2025 (its last release, 0.3.3, is from March 2025). "
        "Prefer the vLLM or SGLang export for new deployments.",
    ),
)
QUANT = {"none": None}
KV = {"auto": None, "bf16": None, "bfloat16": None, "fp16": None, "float16": None}


class MIIExporter(Exporter):
    INFO = INFO

    def check(self, plan: ExportPlan) -> None:
        map_quant(
            plan, INFO, QUANT, "MII serves fp16/bf16 weights only; use vLLM or SGLang for quantized models."
        )
        map_kv(plan, INFO, KV)
        refuse_speculative(plan, INFO)
        if plan.pp > 1:
            raise Unsupported("DeepSpeed-MII has no pipeline parallelism; set pp=1, or use vLLM")

    def command(self, plan: ExportPlan, host: str, port: int) -> list[Token]:
        self.check(plan)
        argv: list[Token] = ["python", "-m", "mii.entrypoints.openai_api_server", "--model", plan.checkpoint]
        argv += ["--host", host, "--port", str(port)]
        argv += ["--tensor-parallel", str(plan.tp), "--replica-num", str(plan.dp)]
        argv += ["--max-length", str(plan.max_model_len)]
        if plan.options.api_key_env:
            argv += ["--api-keys", EnvRef(plan.options.api_key_env)]
        return argv

    def python_snippet(self, plan: ExportPlan) -> str:
        self.check(plan)
        return (
            f'"""DeepSpeed-MII {INFO.version} deployment with a REST API (MII is dormant since 2025)."""\n\n'
            "import mii\n\n"
            "client = mii.serve(\n"
            f"    {plan.checkpoint!r},\n"
            f"    deployment_name={plan.served_name!r},\n"
            f"    tensor_parallel={plan.tp},\n"
            f"    replica_num={plan.dp},\n"
            f"    max_length={plan.max_model_len},\n"
            "    enable_restful_api=True,\n"
            f"    restful_api_port={plan.options.port},\n"
            ")\n"
            'response = client.generate(["Say hello in one sentence."], max_new_tokens=64)\n'
            "print(response[0].generated_text)\n"
            "client.terminate_server()\n"
        )


EXPORTER = MIIExporter()
