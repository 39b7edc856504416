"""Errors the engine raises to its callers (vLLM's names where it has them).

A ValueError means the request itself was wrong (HTTP 400); these are the engine's own conditions.
"""

from __future__ import annotations


class EngineGenerateError(RuntimeError):
    """One request failed inside the engine (model, sampling or output processing); the engine goes on
    serving the others and the request's KV blocks are already freed (HTTP 500)."""


class EngineDeadError(RuntimeError):
    """The stepping thread has stopped: the engine serves nothing more until it is relaunched (HTTP 503)."""


class EngineOverloadedError(RuntimeError):
    """Too many requests are waiting to be scheduled: retry later (HTTP 503 + Retry-After)."""


def describe(exc: BaseException) -> str:
    """`Type: message`, how a failed request's error names what went wrong."""
    return f"{type(exc).__name__}: {exc}"
