"""The engine a chat-like handler talks to (Chat, the tools demo): the one serving now, or the default
model launched for it when none was (locally)."""

from __future__ import annotations

import asyncio
from typing import Any

from backend.server.engine_holder import EngineState
from ui import launch_tab
from ui.common import AppContext


async def ensure_engine(ctx: AppContext) -> tuple[Any | None, str]:
    """The serving engine (also while another loads); launches the default model if none was launched
    (locally); (None, why) on failure."""
    holder = ctx.holder
    if holder.get() is not None:
        return holder.get(), ""
    if holder.status().state == EngineState.STOPPED:
        if ctx.policy.is_public:  # visitors do not control the engine; its owner launches it
            return None, "the engine is stopped; the owner of this app launches it (Launch tab, admin token)"
        await asyncio.to_thread(launch_tab.launch_default, ctx)
    while holder.status().state == EngineState.LOADING and holder.get() is None:
        await asyncio.sleep(0.5)
    status = holder.status()
    if status.state == EngineState.FAILED:
        return None, f"the engine failed to load ({status.error}); fix it in the Launch tab"
    engine = holder.get()
    return (
        (engine, "")
        if engine is not None
        else (None, "the engine is stopped; press Launch in the Launch tab")
    )
