"""OpenAI-compatible HTTP server with Prometheus metrics over the embedded engine.

``from backend.server import build_app`` (imported lazily, so ``python app.py --help`` stays fast).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backend.server.app import build_app

__all__ = ["build_app"]


def __getattr__(name: str):
    if name == "build_app":
        from backend.server.app import build_app

        return build_app
    raise AttributeError(f"module 'backend.server' has no attribute {name!r}")
