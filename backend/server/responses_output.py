"""The Responses API's Response object, built from the engine's last RequestOutput.

The output text is read by the request's tool parser (as on /v1/chat/completions): the text before any
call becomes one ``message`` item (unless it is blank and calls follow), each call a ``function_call``
item, in that order. A call cut off by max_output_tokens is kept with status "incomplete". A model that
speaks harmony (gpt-oss), without a tool parser or with vLLM's ``openai`` one, is read from token ids
(``harmony.py``): its analysis is a ``reasoning`` item (``content: [{type: "reasoning_text", text}]``,
``summary: []``, as vLLM's harmony path gives it) before the message, the message its final channel, its
messages to ``functions.NAME`` the ``function_call`` items.
"""

from __future__ import annotations

import uuid
from typing import Any

from backend.server.harmony import HarmonyParser, HarmonyTokens
from backend.server.responses import ResponseFormatter
from backend.server.responses_protocol import FunctionToolChoice, ResponsesRequest
from backend.server.tool_parsers import ParsedCall, ParsedOutput, ToolParser


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": [part]}


def reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}]
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "status": status}


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
    return bool(parsed.content.strip()) or not (parsed.calls or parsed.reasoning)


class ResponsesFormatter(ResponseFormatter):
    object_name = "response"

    def __init__(
        self,
        model: str,
        tokenizer,
        parser: ToolParser | None,
        req: ResponsesRequest,
        harmony: HarmonyTokens | None = None,
    ):
        super().__init__(model, tokenizer, None)
        self.id = f"resp_{uuid.uuid4().hex}"  # OpenAI's form; also the engine's request id
        self.request = req
        self.parser = parser
        # gpt-oss: harmony's channels, read from token ids (one output, n=1)
        use_harmony = harmony is not None and (parser is None or parser.reads_harmony)
        self.harmony = HarmonyParser(tokenizer, harmony) if use_harmony and harmony is not None else None
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.reasoning_id = f"rs_{uuid.uuid4().hex}"
        self.call_ids: list[tuple[str, str]] = []  # (item id, call_id) of each call, by index

    def parse(self, comp, final: bool) -> ParsedOutput:
        """One output's message text and calls (comp: its CompletionOutput so far)."""
        if self.harmony is not None:
            split = self.harmony.split(comp.token_ids, final)
            calls = split.calls if self.parser is not None else []  # tools are read only when asked for
            return ParsedOutput(split.content or "", calls, split.reasoning or "", split.reasoning_tokens)
        return self.parser.parse(comp.text, final) if self.parser is not None else ParsedOutput(comp.text)

    def ids(self, index: int) -> tuple[str, str]:
        while len(self.call_ids) <= index:
            self.call_ids.append((f"fc_{uuid.uuid4().hex}", f"call_{uuid.uuid4().hex}"))
        return self.call_ids[index]

    def items(self, parsed: ParsedOutput, status: str) -> list[dict[str, Any]]:
        """The output items of the finished text: its reasoning (if any), its message (if any), its calls."""
        out = [reasoning_item(self.reasoning_id, parsed.reasoning, status)] if parsed.reasoning else []
        if shows_message(parsed):
            out.append(message_item(self.message_id, parsed.content, status))
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
    def response_usage(output, reasoning_tokens: int = 0) -> dict:
        prompt, completion = len(output.prompt_token_ids), len(output.outputs[0].token_ids)
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": prompt + completion,
        }

    def final(self, output) -> dict:
        """The finished Response for the last output."""
        comp = output.outputs[0]
        incomplete = comp.finish_reason == "length"
        status = "incomplete" if incomplete else "completed"
        parsed = self.parse(comp, final=True)
        items = self.items(parsed, status)
        reason = "max_output_tokens" if incomplete else None
        return self.body(status, items, self.response_usage(output, parsed.reasoning_tokens), reason)

    def response(self, outputs: list) -> dict:  # the non-streamed body (Job.collect): one prompt, n=1
        return self.final(outputs[0])


def text_format(req: ResponsesRequest) -> dict[str, Any]:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type != "json_schema":
        return {"type": fmt.type if fmt is not None else "text"}
    out = {"type": "json_schema", "name": fmt.name, "schema": fmt.json_schema, "strict": fmt.strict}
    return out | ({"description": fmt.description} if fmt.description else {})
