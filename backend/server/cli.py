"""Serve a model over an OpenAI-compatible HTTP API with Prometheus metrics (like `vllm serve`)."""

from __future__ import annotations

import argparse
import os

from backend.cli_args import non_negative_int, port_or_zero, positive_int
from backend.engine.config import EngineConfig
from backend.server.tool_parsers import TOOL_PARSERS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)"
    )
    parser.add_argument(
        "--port", type=port_or_zero, default=8000, help="port (default: 8000; 0 = any free port)"
    )
    parser.add_argument(
        "--served-model-name", default=None, help="model name in the API (default: the model's)"
    )
    parser.add_argument(
        "--api-key-env",
        default=None,
        metavar="VAR",
        help="name of an environment variable holding the API key clients must send",
    )
    parser.add_argument(
        "--max-waiting-requests",
        type=int,
        default=256,
        help="answer 503 + Retry-After while this many requests wait (default: 256)",
    )
    parser.add_argument(
        "--max-waiting-per-client",
        type=positive_int,
        default=None,
        help="answer 503 + Retry-After to a client with this many requests waiting to start "
        "(default: half of --max-waiting-requests)",
    )
    parser.add_argument(
        "--max-input-tokens",
        type=positive_int,
        default=None,
        help="refuse requests with more input tokens (400), checked in characters before tokenizing "
        "(default: the model's context length)",
    )
    parser.add_argument(
        "--forwarded-hops",
        type=non_negative_int,
        default=0,
        help="trusted reverse proxies in front of this server: the client is the address they appended to "
        "X-Forwarded-For (default: 0, the connection's peer)",
    )
    parser.add_argument(
        "--max-request-bytes",
        type=int,
        default=4 * 1024 * 1024,
        help="refuse larger request bodies with 413 (default: 4 MiB)",
    )
    parser.add_argument(
        "--uvicorn-log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug", "trace"],
    )
    parser.add_argument(
        "--disable-uvicorn-access-log", action="store_true", help="do not log each request line"
    )
    parser.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help='let the model decide when to call tools (tool_choice="auto"); needs --tool-call-parser',
    )
    parser.add_argument(
        "--tool-call-parser",
        default=None,
        choices=sorted(TOOL_PARSERS),
        help="how tool calls are read from the output: hermes (Qwen2.5/3), llama3_json (Llama 3.1+) or "
        "openai (gpt-oss's harmony)",
    )
    engine = parser.add_argument_group("engine options (vLLM's names; --model defaults to SmolLM2-135M)")
    EngineConfig.add_cli_args(engine)


def api_key_from_env(var: str | None) -> str | None:
    """The key held in environment variable ``var``; an unset or empty variable is an error."""
    if var is None:
        return None
    key = os.environ.get(var, "")
    if not key:
        raise SystemExit(f"--api-key-env {var}: the environment variable {var} is not set or empty")
    return key


def main(args: argparse.Namespace) -> int:
    import asyncio

    import uvicorn

    from backend.default_model import default_model
    from backend.engine import AsyncLLM
    from backend.errors import UserError
    from backend.server.app import build_app, default_client_share
    from backend.server.fairness import ClientLine

    api_key = api_key_from_env(args.api_key_env)
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        parsers = "hermes, llama3_json or openai"
        raise SystemExit(f"error: --enable-auto-tool-choice needs --tool-call-parser ({parsers})")
    args.model = args.model or default_model()
    try:
        config = EngineConfig.from_cli_args(args)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    print(f"Loading {config.model} ...", flush=True)
    try:
        engine = AsyncLLM.from_config(config)  # loaded on its stepping thread (async_llm.py)
    except UserError as exc:  # a model that cannot be served as given: say why, without a traceback
        raise SystemExit(f"error: {exc}") from None
    share = args.max_waiting_per_client or default_client_share(args.max_waiting_requests)
    app = build_app(
        lambda: engine,
        served_model_name=args.served_model_name,
        api_key=api_key,
        max_waiting_requests=args.max_waiting_requests,
        max_body_bytes=args.max_request_bytes,
        tool_call_parser=args.tool_call_parser,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        max_input_tokens=args.max_input_tokens,
        clients=ClientLine(share),
        forwarded_hops=args.forwarded_hops,
    )
    server_config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.uvicorn_log_level,
        access_log=not args.disable_uvicorn_access_log,
    )
    server = uvicorn.Server(server_config)
    name = args.served_model_name or engine.model_name
    try:
        asyncio.run(_serve(server, name, api_key is not None))
    finally:
        engine.shutdown()
    return 0


async def _serve(server, model_name: str, with_key: bool) -> None:
    import asyncio

    task = asyncio.create_task(server.serve())
    while not server.started and not task.done():
        await asyncio.sleep(0.05)
    if server.started:
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        url = f"http://{host}:{port}"
        print(
            f"Serving {model_name} at {url}/v1 (OpenAI API); metrics at {url}/metrics; health at {url}/health"
            + ("; API key required" if with_key else ""),
            flush=True,
        )
    await task
