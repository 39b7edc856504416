"""Benchmarks that run each variant in a fresh process (served_steps, shared_cores): the parent runs its own
module again with ``--child VARIANT`` and reads the one RESULT line (JSON) the child prints."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PREFIX = "RESULT "


def answered_as_child(args: argparse.Namespace, run: Callable[[argparse.Namespace], dict]) -> bool:
    """In a child (args.child set): run its variant, print the RESULT line, True. In the parent: print the
    CPU and the kernels every figure depends on, False."""
    if args.child:
        print(PREFIX + json.dumps(run(args)), flush=True)
        return True
    from backend.bench.machine import cpu_summary

    print(cpu_summary())
    return False


def parent_argv(argv: list[str] | None) -> list[str]:
    """The parent's arguments, passed on to each child (the children add their own --child)."""
    return [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--child"]


def run_child(module: str, argv: list[str], variant: str) -> dict:
    """`python -m module *argv --child variant` in the repository; RuntimeError with the child's last
    stderr when it printed no result."""
    command = [sys.executable, "-m", module, *argv, "--child", variant]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(PREFIX)]
    if not lines:
        raise RuntimeError(f"the {variant} run failed: {done.stderr.strip()[-300:]}")
    return json.loads(lines[-1][len(PREFIX) :])
