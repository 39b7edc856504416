"""The Responses API's streaming events of one response, from its successive cumulative outputs.

OpenAI's sequence, numbered by ``sequence_number``: response.created, response.in_progress, then per item
output_item.added, content_part.added + output_text.delta ... (a message) or
function_call_arguments.delta ... (a call), and at the end output_text.done + content_part.done or
function_call_arguments.done, output_item.done, then response.completed (or response.incomplete). A
harmony model's analysis (gpt-oss) comes first as a ``reasoning`` item: content_part.added (reasoning_text),
reasoning_text.delta ..., and at the end reasoning_text.done + content_part.done; it streams while it is
the first item (harmony's analysis precedes the answer); analysis written after the answer has begun is
only in the completed response.
Invariant: the deltas of each item add up to that item in the final response, which has the same ids
and output indexes; a message is opened only once its text is more than white space, so a call after a
blank line has no message item in either form (``responses_output.shows_message``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backend.server.responses_output import (
    ResponsesFormatter,
    call_item,
    message_item,
    reasoning_item,
    shows_message,
)
from backend.server.tool_parsers import ParsedCall, ParsedOutput


@dataclass(slots=True)
class StreamedCall:
    output_index: int
    sent_arguments: int = 0


class ResponsesEvents:
    """The streaming events of one response, from its successive outputs."""

    def __init__(self, formatter: ResponsesFormatter):
        self.formatter = formatter
        self.sequence_number = 0
        self.num_items = 0
        self.message_index: int | None = None
        self.sent_text = 0
        self.calls: list[StreamedCall] = []
        self.reasoning_index: int | None = None
        self.sent_reasoning = 0

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        out = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return out

    def start(self) -> list[dict]:
        body = self.formatter.body("in_progress", [], None)
        created = self.event("response.created", response=body)
        return [created, self.event("response.in_progress", response=body)]

    def update(self, output) -> list[dict]:
        comp = output.outputs[0]
        final = comp.finish_reason is not None
        parsed = self.formatter.parse(comp, final)
        events = self._reasoning_events(parsed)
        events += self._text_events(parsed, final)
        for index, call in enumerate(c for c in parsed.calls if c.name is not None):
            events += self._call_events(index, call)
        if final:
            events += self._finish(output, parsed)
        return events

    def failed(self, code: str, message: str) -> list[dict]:
        body = self.formatter.body("failed", [], None) | {"error": {"code": code, "message": message}}
        return [self.event("response.failed", response=body)]

    def _reasoning_events(self, parsed: ParsedOutput) -> list[dict]:
        events: list[dict] = []
        item_id = self.formatter.reasoning_id
        if self.reasoning_index is None and parsed.reasoning and self.num_items == 0:
            self.reasoning_index, self.num_items = 0, 1
            item = reasoning_item(item_id, "", "in_progress") | {"content": []}
            events.append(self._added(0, item))
            part = {"type": "reasoning_text", "text": ""}
            events.append(self.event("response.content_part.added", **self._at(item_id, 0), part=part))
        if self.reasoning_index is not None and len(parsed.reasoning) > self.sent_reasoning:
            delta = parsed.reasoning[self.sent_reasoning :]
            self.sent_reasoning = len(parsed.reasoning)
            events.append(self.event("response.reasoning_text.delta", **self._at(item_id, 0), delta=delta))
        return events

    @staticmethod
    def _at(item_id: str, output_index: int) -> dict[str, Any]:
        return {"item_id": item_id, "output_index": output_index, "content_index": 0}

    def _text_events(self, parsed: ParsedOutput, final: bool) -> list[dict]:
        events: list[dict] = []
        msg_id = self.formatter.message_id
        if self.message_index is None and not self.calls and (parsed.content.strip() or final):
            if not shows_message(parsed):
                return events
            self.message_index = self.num_items
            self.num_items += 1
            item = message_item(msg_id, "", "in_progress") | {"content": []}
            events.append(self._added(self.message_index, item))
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            events.append(self._part_event("response.content_part.added", part))
        if self.message_index is not None and len(parsed.content) > self.sent_text:
            delta = parsed.content[self.sent_text :]
            self.sent_text = len(parsed.content)
            events.append(
                self.event(
                    "response.output_text.delta",
                    item_id=msg_id,
                    output_index=self.message_index,
                    content_index=0,
                    delta=delta,
                    logprobs=[],
                )
            )
        return events

    def _added(self, output_index: int, item: dict) -> dict:
        return self.event("response.output_item.added", output_index=output_index, item=item)

    def _part_event(self, kind: str, part: dict) -> dict:
        msg_id, index = self.formatter.message_id, self.message_index
        return self.event(kind, item_id=msg_id, output_index=index, content_index=0, part=part)

    def _call_events(self, index: int, call: ParsedCall) -> list[dict]:
        events: list[dict] = []
        ids = self.formatter.ids(index)
        if index == len(self.calls):
            self.calls.append(StreamedCall(self.num_items))
            self.num_items += 1
            item = call_item(ids, call, "in_progress") | {"arguments": ""}
            events.append(self._added(self.num_items - 1, item))
        streamed = self.calls[index]
        if len(call.arguments) > streamed.sent_arguments:
            delta = call.arguments[streamed.sent_arguments :]
            streamed.sent_arguments = len(call.arguments)
            events.append(
                self.event(
                    "response.function_call_arguments.delta",
                    item_id=ids[0],
                    output_index=streamed.output_index,
                    delta=delta,
                )
            )
        return events

    def _finish(self, output, parsed: ParsedOutput) -> list[dict]:
        response = self.formatter.final(output)
        events: list[dict] = []
        for index, item in enumerate(response["output"]):
            if item["type"] == "reasoning":
                part, at = item["content"][0], self._at(item["id"], index)
                events.append(self.event("response.reasoning_text.done", **at, text=part["text"]))
                events.append(self.event("response.content_part.done", **at, part=part))
            elif item["type"] == "message":
                text = item["content"][0]
                events.append(
                    self.event(
                        "response.output_text.done",
                        item_id=item["id"],
                        output_index=index,
                        content_index=0,
                        text=text["text"],
                        logprobs=[],
                    )
                )
                events.append(self._part_event("response.content_part.done", text))
            else:
                events.append(
                    self.event(
                        "response.function_call_arguments.done",
                        item_id=item["id"],
                        output_index=index,
                        name=item["name"],
                        arguments=item["arguments"],
                    )
                )
            events.append(self.event("response.output_item.done", output_index=index, item=item))
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        events.append(self.event(kind, response=response))
        return events
