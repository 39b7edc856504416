"""Responses API bodies and streaming events, built from the engine's cumulative RequestOutputs.

The output text is read by the request's tool parser (as on /v1/chat/completions): the text before any
call becomes one ``message`` item, each call a ``function_call`` item, in that order. Streaming sends
OpenAI's event sequence (response.created, response.in_progress, output_item.added, content_part.added,
output_text.delta ..., output_text.done, content_part.done, output_item.done, function_call_arguments
.delta/.done, response.completed or response.incomplete), numbered by ``sequence_number``. Invariant:
the deltas of each item add up to that item in the final response, which has the same ids; a message
is opened only once its text is more than white space, so a call preceded by a blank line has no
message item in either form.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from backend.server.responses import ResponseFormatter
from backend.server.responses_protocol import FunctionToolChoice, ResponsesRequest
from backend.server.tool_parsers import ParsedCall, ParsedOutput, ToolParser


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": [part]}


def call_item(ids: tuple[str, str], call: ParsedCall, status: str) -> dict[str, Any]:
    item_id, call_id = ids
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": call.name,
        "arguments": call.arguments,
        "status": status,
    }


def shows_message(parsed: ParsedOutput) -> bool:
    return bool(parsed.content.strip()) or not parsed.calls


class ResponsesFormatter(ResponseFormatter):
    object_name = "response"

    def __init__(self, model: str, tokenizer, parser: ToolParser | None, req: ResponsesRequest):
        super().__init__(model, tokenizer, None)
        self.id = f"resp_{uuid.uuid4().hex}"  # OpenAI's form; also the engine's request id
        self.request = req
        self.parser = parser
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.call_ids: list[tuple[str, str]] = []  # (item id, call_id) of each call, by index

    def parse(self, text: str, final: bool) -> ParsedOutput:
        return self.parser.parse(text, final) if self.parser is not None else ParsedOutput(text)

    def ids(self, index: int) -> tuple[str, str]:
        while len(self.call_ids) <= index:
            self.call_ids.append((f"fc_{uuid.uuid4().hex}", f"call_{uuid.uuid4().hex}"))
        return self.call_ids[index]

    def items(self, parsed: ParsedOutput, status: str) -> list[dict[str, Any]]:
        """The output items of the finished text: its message (if any), then its calls."""
        out = [message_item(self.message_id, parsed.content, status)] if shows_message(parsed) else []
        for index, call in enumerate(c for c in parsed.calls if c.name is not None):
            out.append(call_item(self.ids(index), call, "completed" if call.is_complete else "incomplete"))
        return out

    def body(self, status: str, output: list[dict], usage: dict | None, reason: str | None = None) -> dict:
        """The Response object; ``reason``: why it is incomplete."""
        req = self.request
        choice = req.tool_choice
        if choice is None:
            choice = "auto" if req.tools else "none"
        return {
            "id": self.id,
            "object": self.object_name,
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": reason} if reason else None,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "metadata": req.metadata or {},
            "model": self.model,
            "output": output,
            "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": None,
            "reasoning": {"effort": (req.reasoning or {}).get("effort"), "summary": None},
            "store": False,  # stateless: nothing is stored, whatever the request asked
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "text": {"format": text_format(req)},
            "tool_choice": choice.model_dump() if isinstance(choice, FunctionToolChoice) else choice,
            "tools": [t.model_dump() for t in req.tools or []],
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "truncation": "disabled",
            "usage": usage,
            "user": req.user,
        }

    @staticmethod
    def response_usage(output) -> dict:
        prompt, completion = len(output.prompt_token_ids), len(output.outputs[0].token_ids)
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        }

    def final(self, output) -> dict:
        """The finished Response for the last output."""
        comp = output.outputs[0]
        incomplete = comp.finish_reason == "length"
        status = "incomplete" if incomplete else "completed"
        items = self.items(self.parse(comp.text, final=True), status)
        reason = "max_output_tokens" if incomplete else None
        return self.body(status, items, self.response_usage(output), reason)

    def response(self, output) -> dict:  # the non-streamed body (Job.collect)
        return self.final(output)


def text_format(req: ResponsesRequest) -> dict[str, Any]:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type != "json_schema":
        return {"type": fmt.type if fmt is not None else "text"}
    out = {"type": "json_schema", "name": fmt.name, "schema": fmt.json_schema, "strict": fmt.strict}
    return out | ({"description": fmt.description} if fmt.description else {})


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
        parsed = self.formatter.parse(comp.text, final)
        events = self._text_events(parsed, final)
        for index, call in enumerate(c for c in parsed.calls if c.name is not None):
            events += self._call_events(index, call)
        if final:
            events += self._finish(output, parsed)
        return events

    def failed(self, code: str, message: str) -> list[dict]:
        body = self.formatter.body("failed", [], None) | {"error": {"code": code, "message": message}}
        return [self.event("response.failed", response=body)]

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
            if item["type"] == "message":
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
