"""The command line: subcommands listed, bad input refused with a clear message and a non-zero exit."""

from __future__ import annotations

import subprocess
import sys

from tests.common_utils import ROOT


def run_app(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "app.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_help_lists_subcommands():
    from app import SUBCOMMANDS

    result = run_app("--help")
    assert result.returncode == 0
    for name in SUBCOMMANDS:
        assert name in result.stdout


def test_negative_port_is_refused():
    result = run_app("--port", "-1")
    assert result.returncode != 0
    assert "port must be an integer in 1-65535, got -1" in result.stderr


def test_unknown_subcommand_is_refused():
    result = run_app("frobnicate")
    assert result.returncode != 0
    assert "invalid choice: 'frobnicate'" in result.stderr
