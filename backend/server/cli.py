"""Serve a model over an OpenAI-compatible HTTP API with Prometheus metrics (like `vllm serve`)."""

from __future__ import annotations

import argparse
import os


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default=None, help="Hub id, local folder or .gguf file (default: SmolLM2-135M)"
    )
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
    engine = parser.add_argument_group("engine options (vLLM's names)")
    engine.add_argument("--dtype", default="auto", help="auto, bfloat16, float16 or float32 (default: auto)")
    engine.add_argument("--device", default="auto", help="auto, cpu, cuda or mps (default: auto)")
    engine.add_argument("--block-size", type=int, default=16, help="tokens per KV-cache block (default: 16)")
    engine.add_argument("--max-num-seqs", type=int, default=64, help="max requests per step (default: 64)")
    engine.add_argument(
        "--max-num-batched-tokens", type=int, default=512, help="token budget per step (default: 512)"
    )
    engine.add_argument(
        "--max-model-len", type=int, default=None, help="context length (default: the model's)"
    )
    engine.add_argument(
        "--num-kv-blocks", type=int, default=None, help="KV-cache blocks (default: sized to memory)"
    )
    engine.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse KV blocks of shared prompt prefixes (default: on)",
    )
    engine.add_argument("--seed", type=int, default=0, help="engine random seed (default: 0)")
    engine.add_argument(
        "--trust-remote-code", action="store_true", help="run code shipped with the model (off)"
    )


def port_or_zero(text: str) -> int:
    from app import port_number

    return 0 if text == "0" else port_number(text)


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
    from backend.engine import LLM, AsyncLLM
    from backend.server.app import build_app

    api_key = api_key_from_env(args.api_key_env)
    model = args.model or default_model()
    print(f"Loading {model} ...", flush=True)
    llm = LLM(
        model,
        dtype=args.dtype,
        device=args.device,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        num_kv_blocks=args.num_kv_blocks,
        enable_prefix_caching=args.enable_prefix_caching,
        seed=args.seed,
        trust_remote_code=args.trust_remote_code,
    )
    engine = AsyncLLM(llm)
    app = build_app(
        lambda: engine,
        served_model_name=args.served_model_name,
        api_key=api_key,
        max_waiting_requests=args.max_waiting_requests,
        max_body_bytes=args.max_request_bytes,
    )
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.uvicorn_log_level,
        access_log=not args.disable_uvicorn_access_log,
    )
    server = uvicorn.Server(config)
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
