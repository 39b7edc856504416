"""Start the web UI (the default when no subcommand is given)."""

from __future__ import annotations

import argparse
import os

from backend.cli_args import port_number

DEFAULT_KEY_VARIABLE = "PLAYGROUND_API_KEY"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=port_number, default=7860, help="port (default: 7860)")
    parser.add_argument("--model", default=None, help="model for the playground (default: SmolLM2-135M)")
    parser.add_argument(
        "--share", action="store_true", help="create a public Gradio share link (turns public mode on)"
    )
    parser.add_argument(
        "--public",
        action="store_true",
        help="lock the app for public hosting; on by itself on a Hugging Face Space, with --share and with a "
        "--host other than loopback (docs/security.md)",
    )
    parser.add_argument(
        "--unsafe-local",
        action="store_true",
        help="keep local mode although --share or --host exposes the app (only on a network you trust: "
        "whoever reaches it may load local paths and start engines)",
    )
    parser.add_argument(
        "--api-key-env",
        default=None,
        metavar="VAR",
        help="environment variable holding the key /v1 and /metrics require "
        f"(default: {DEFAULT_KEY_VARIABLE} when it is set)",
    )


def main(args: argparse.Namespace) -> int:
    from backend.server.cli import api_key_from_env
    from ui.app import launch

    variable = args.api_key_env or (DEFAULT_KEY_VARIABLE if os.environ.get(DEFAULT_KEY_VARIABLE) else None)
    api_key = api_key_from_env(variable)
    launch(
        args.host,
        args.port,
        args.model,
        args.share,
        public=args.public,
        api_key=api_key,
        unsafe_local=args.unsafe_local,
    )
    return 0
