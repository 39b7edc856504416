"""A conversation laid out for gpt-oss's chat template, which renders one tool call per assistant message
(``message.tool_calls[0]``) and names each tool result after the latest call.

OpenAI's format lets an assistant message carry several calls, their results following as tool messages
matched by ``tool_call_id``. Harmony writes each call as its own message, its result right after it (as
vLLM's ``parse_chat_input_to_harmony_message`` does), so such a turn is split into one assistant message per
call, each followed by the result whose ``tool_call_id`` is that call's id; nothing is dropped.
"""

from __future__ import annotations

from typing import Any


def one_call_per_turn(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with every multi-call assistant turn split into call, result, call, result, ..."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        message = messages[i]
        calls = message.get("tool_calls") or []
        if message["role"] != "assistant" or len(calls) < 2:
            out.append(message)
            i += 1
            continue
        j = i + 1
        while j < len(messages) and messages[j]["role"] == "tool":
            j += 1
        results = messages[i + 1 : j]
        for n, call in enumerate(calls):
            out.append(message | {"tool_calls": [call]} | ({} if n == 0 else {"content": ""}))
            call_id = call.get("id")
            matched = next(
                (r for r in results if call_id is not None and r.get("tool_call_id") == call_id), None
            )
            if matched is not None:
                out.append(matched)
                results.remove(matched)
        out += results  # results no call id matched keep their order, after the last call
        i = j
    return out
