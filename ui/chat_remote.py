"""Chat with an external engine launched from the Launch tab (vLLM, ...): its /v1 streamed through the
`openai` client, with the same sampling controls and reply stats as the embedded engine."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from backend.export.process import ManagedServer

# the page re-renders the whole reply on each update: one a token (vLLM streams a chunk a token) falls
# behind on busy cores and freezes the tab until it catches up; 20 a second reads as live
PAGE_INTERVAL_S = 0.05


def request_body(system: str, history: list[dict[str, str]], params: Any) -> dict[str, Any]:
    """The chat form as chat.completions arguments (vLLM's extra sampling fields in extra_body)."""
    messages = ([{"role": "system", "content": system}] if system.strip() else []) + history
    extra: dict[str, Any] = {}
    if params.top_k and params.top_k > 0:
        extra["top_k"] = params.top_k
    return {
        "messages": messages,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "max_tokens": params.max_tokens,
        "seed": params.seed,
        "stop": params.stop,
        "stream": True,
        "stream_options": {"include_usage": True},
        "extra_body": extra or None,
    }


async def stream_reply(
    server: ManagedServer, system: str, history: list[dict[str, str]], params: Any, info: dict[str, Any]
) -> AsyncIterator[tuple[str, str]]:
    """Yields (reasoning, text) so far (vLLM's reasoning_content, e.g. gpt-oss's analysis channel, and the
    answer), at most one update per PAGE_INTERVAL_S and always the whole reply last; fills info with
    first_token (a time), tokens and finish."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=server.base_url, api_key="EMPTY", max_retries=0)
    reasoning, text, shown, held = "", "", float("-inf"), False
    info.update(first_token=None, tokens=0, finish="?")
    stream = await client.chat.completions.create(
        model=server.served_name, **request_body(system, history, params)
    )
    async for chunk in stream:
        if chunk.usage is not None:
            info["tokens"] = chunk.usage.completion_tokens
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        if choice.finish_reason:
            info["finish"] = choice.finish_reason
        thought = (choice.delta.model_extra or {}).get("reasoning_content") or ""  # vLLM's extra field
        if choice.delta.content or thought:
            if info["first_token"] is None:
                info["first_token"] = time.time()
            reasoning, text = reasoning + thought, text + (choice.delta.content or "")
            held = time.monotonic() - shown < PAGE_INTERVAL_S
            if not held:
                shown = time.monotonic()
                yield reasoning, text
    if held:
        yield reasoning, text
