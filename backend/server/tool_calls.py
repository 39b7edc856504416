"""Tool calls in responses: the final message's ``tool_calls`` and the streamed deltas, as OpenAI sends them.

A call's first delta carries its index, id, type and name with empty arguments; later deltas carry only
argument text. Concatenating the deltas gives exactly the final response's arguments.
"""

from __future__ import annotations

import uuid

from backend.server.tool_parsers import ParsedCall, ParsedOutput, ToolParser


def tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"  # vLLM's form


class ToolCallFormatter:
    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser
        self.ids: list[str] = []
        self.sent_content = 0
        self.sent_arguments: list[int] = []

    def _id(self, index: int) -> str:
        while len(self.ids) <= index:
            self.ids.append(tool_call_id())
        return self.ids[index]

    def message(self, text: str) -> tuple[dict, bool]:
        """The assistant message for the whole output, and whether it calls tools."""
        parsed = self.parser.parse(text, final=True)
        calls = self.tool_calls(parsed.calls)
        content = parsed.content if parsed.content.strip() or not calls else None
        return {"role": "assistant", "content": content, "tool_calls": calls}, bool(calls)

    def tool_calls(self, calls: list[ParsedCall]) -> list[dict]:
        """The message's ``tool_calls``: the complete calls (one cut off by max_tokens would not parse)."""
        out = []
        for i, call in enumerate(calls):
            if call.is_complete:
                function = {"name": call.name, "arguments": call.arguments}
                out.append({"id": self._id(i), "type": "function", "function": function})
        return out

    def delta(self, text: str, final: bool) -> tuple[dict, bool]:
        """The new part of the message since the last call, and whether any tool was called so far."""
        parsed: ParsedOutput = self.parser.parse(text, final)
        delta: dict = {}
        if len(parsed.content) > self.sent_content:
            delta["content"] = parsed.content[self.sent_content :]
            self.sent_content = len(parsed.content)
        updates = self.call_updates(parsed.calls)
        if updates:
            delta["tool_calls"] = updates
        return delta, bool(self.sent_arguments)

    def call_updates(self, calls: list[ParsedCall]) -> list[dict]:
        """The streamed ``tool_calls`` entries for what the calls gained since the last update."""
        updates = []
        for index, call in enumerate(calls):
            if call.name is None:
                break
            if index == len(self.sent_arguments):  # a new call: its header, with what arguments exist
                self.sent_arguments.append(len(call.arguments))
                function = {"name": call.name, "arguments": call.arguments}
                header = {"index": index, "id": self._id(index), "type": "function"}
                updates.append({**header, "function": function})
            elif len(call.arguments) > self.sent_arguments[index]:
                new = call.arguments[self.sent_arguments[index] :]
                updates.append({"index": index, "function": {"arguments": new}})
                self.sent_arguments[index] = len(call.arguments)
        return updates
