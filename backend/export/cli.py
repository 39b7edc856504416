"""Export launch configs for serving engines (vLLM, SGLang, TensorRT-LLM, TGI, MII, llama.cpp, Ollama, ours).

Writes the files and a README.md that explains each one into --out, and prints the main launch command.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from backend.cli_args import port_number
from backend.export.base import DTYPES, SPECULATIVE_METHODS
from backend.export.files import ENGINES, FORMATS
from backend.knobs import add_cli_args, from_cli_args
from backend.planner.request import PlanRequest


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """The planner's options (PlanRequest fields), with vLLM's names."""
    plan = parser.add_argument_group("plan")
    add_cli_args(plan, PlanRequest, skip=("engine",))  # --engine (below) names the engines to export


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", nargs="+", default=["vllm"], choices=[*ENGINES, "all"])
    parser.add_argument("--format", nargs="+", default=["shell"], choices=[*FORMATS, "all"])
    parser.add_argument("--out", type=Path, required=True, help="folder to write the files into")
    add_plan_arguments(parser)
    serve = parser.add_argument_group("server")
    serve.add_argument("--host", default="127.0.0.1", help="address the server binds (default: 127.0.0.1)")
    serve.add_argument("--port", type=port_number, default=8000)
    serve.add_argument(
        "--served-model-name",
        default=None,
        help="the name clients send (default: the Hub id, or a local .gguf's or folder's name, not its path)",
    )
    serve.add_argument("--api-key-env", default=None, help="name of the env variable holding the API key")
    serve.add_argument(
        "--hf-token-env", default="HF_TOKEN", help="name of the env variable holding the Hub token"
    )
    serve.add_argument("--dtype", default="auto", choices=DTYPES)
    serve.add_argument("--trust-remote-code", action="store_true")
    serve.add_argument("--speculative-method", default=None, choices=SPECULATIVE_METHODS)
    serve.add_argument("--speculative-model", default=None)
    serve.add_argument("--num-speculative-tokens", type=int, default=3)
    serve.add_argument("--gpus-per-node", type=int, default=8)


def main(args: argparse.Namespace) -> int:
    from backend.export import ExportOptions, export_files, main_command, resolve

    req = from_cli_args(PlanRequest, args, engine=args.engine[0] if args.engine[0] != "all" else "vllm")
    options = ExportOptions(
        host=args.host, port=args.port, served_model_name=args.served_model_name,
        api_key_env=args.api_key_env,
        hf_token_env=args.hf_token_env, dtype=args.dtype, trust_remote_code=args.trust_remote_code,
        speculative_method=args.speculative_method, speculative_model=args.speculative_model,
        num_speculative_tokens=args.num_speculative_tokens, gpus_per_node=args.gpus_per_node,
        enforce_eager=args.enforce_eager,  # the plan's flag: vLLM/SGLang start without CUDA graphs
    )  # fmt: skip
    try:
        files = export_files(req, options, engines=args.engine, formats=args.format)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path, text in files.items():
        target = args.out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        if path.endswith(".sh"):
            target.chmod(0o755)
    print(f"wrote {len(files)} files to {args.out} (see {args.out / 'README.md'})")
    order = ENGINES if "all" in args.engine else args.engine
    engine = next((name for name in order if f"{name}/launch.sh" in files), None)
    if engine:
        print(f"\nmain command ({engine}):\n")
        print(main_command(resolve(req, options), engine))
    return 0
