"""LLM serving playground and deployment wizard.

With no arguments: start the web UI on http://127.0.0.1:7860. Subcommands do the same work from the shell.
"""

from __future__ import annotations

import argparse
import importlib
import sys

import backend  # noqa: F401  (sets the OpenMP thread-wait policy before anything loads torch)

# name -> module defining add_arguments(parser) and main(args) -> int. Modules import heavy
# dependencies inside main() only, so that `python app.py --help` stays fast.
SUBCOMMANDS: dict[str, str] = {
    "ui": "ui.cli",
    "estimate": "backend.planner.cli",
    "serve": "backend.server.cli",
    "bench": "backend.bench.cli",
    "compare": "backend.bench.compare_cli",
    "quality": "backend.quality.cli",
    "export": "backend.export.cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="app.py",
        description="LLM serving playground: plan, launch, chat, benchmark and export. "
        "Without a subcommand, starts the web UI.",
    )
    commands = parser.add_subparsers(dest="command", title="subcommands", metavar="COMMAND")
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        summary = (module.__doc__ or name).strip().splitlines()[0]
        sub = commands.add_parser(name, help=summary, description=module.__doc__)
        module.add_arguments(sub)
        sub.set_defaults(handler=module.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["ui", *argv]  # no subcommand: the web UI, with its own options
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
