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


def positive_int(text: str) -> int:
    """A whole number >= 1, for counts and limits; argparse shows the message."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """A whole number >= 0; argparse shows the message."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {value}")
    return value
