"""The project's version: the one pyproject.toml declares (what the server's `/version` reports)."""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "llm-serving-playground"  # pyproject.toml's [project] name
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


@cache
def project_version() -> str:
    """pyproject.toml's version in a checkout, else the installed distribution's, else "unknown"."""
    try:
        with PYPROJECT.open("rb") as f:
            return str(tomllib.load(f)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        pass
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"
