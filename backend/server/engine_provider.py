"""EngineProvider: how the server finds the engine it serves.

The server asks on every request, because the web app launches, stops and relaunches engines under a
running server: the provider returns the running AsyncLLM, or None while none runs (the API answers 503).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from backend.engine.async_llm import AsyncLLM  # torch loads with the engine, not with the server

EngineProvider: TypeAlias = Callable[[], "AsyncLLM | None"]
