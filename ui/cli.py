"""Start the web UI (the default when no subcommand is given)."""

from __future__ import annotations

import argparse

from backend.cli_args import port_number


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=port_number, default=7860, help="port (default: 7860)")
    parser.add_argument("--model", default=None, help="model for the playground (default: SmolLM2-135M)")
    parser.add_argument("--share", action="store_true", help="create a public Gradio share link")


def main(args: argparse.Namespace) -> int:
    from ui.app import launch

    launch(host=args.host, port=args.port, model=args.model, share=args.share)
    return 0
