"""argparse value types shared by the subcommands' CLIs (app.py, backend/*/cli.py, ui/cli.py)."""

from __future__ import annotations

import argparse


def port_number(text: str) -> int:
    """A TCP port, 1-65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port must be an integer in 1-65535, got {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be an integer in 1-65535, got {port}")
    return port


def port_or_zero(text: str) -> int:
    """A TCP port, or 0 for any free port."""
    return 0 if text == "0" else port_number(text)
