"""A Responses API request as the chat completion request that generates it.

Input items become chat messages: ``instructions`` and developer messages are system messages,
consecutive ``function_call`` items join one assistant turn's ``tool_calls`` (after its text, if any),
``function_call_output`` items become tool messages, ``reasoning`` items are skipped. Function tools
take chat's nested shape and ``text.format`` becomes ``response_format``; so the chat path renders the
same prompt for the same conversation (``/tokenize`` with these messages counts the same tokens).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from backend.server.errors import OpenAIError, describe_validation_errors
from backend.server.protocol import ChatCompletionRequest
from backend.server.responses_protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionToolChoice,
    MessageItem,
    ResponsesRequest,
    TextConfig,
    TextPart,
)


def _text(content: str | list[Any]) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.text if isinstance(p, TextPart) else p.refusal for p in content)


def _messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """Chat messages for the input items: consecutive function calls join the assistant turn."""
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    items = [MessageItem(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    for item in items:
        if isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            messages.append({"role": role, "content": _text(item.content)})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "function": {"name": item.name, "arguments": item.arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)})
    if not messages:
        raise OpenAIError(400, "input holds no messages: send a text or a message item", param="input")
    return messages


def _response_format(text: TextConfig | None) -> dict[str, Any] | None:
    if text is None or text.format.type == "text":
        return None
    if text.format.type == "json_object":
        return {"type": "json_object"}
    schema = {"name": text.format.name, "schema": text.format.json_schema, "strict": text.format.strict}
    return {"type": "json_schema", "json_schema": schema}


# The efforts chat completions take (and gpt-oss's template knows); OpenAI's others ("minimal") are dropped
REASONING_EFFORTS = ("low", "medium", "high")


def to_chat_request(req: ResponsesRequest) -> ChatCompletionRequest:
    """The chat completion request that generates this response (OpenAIError 400 if it is invalid)."""
    tools: list[dict[str, Any]] = [
        {"type": "function", "function": t.model_dump(include={"name", "description", "parameters"})}
        for t in req.tools or []
    ]
    for tool in tools:
        if tool["function"]["parameters"] is None:
            del tool["function"]["parameters"]
    choice = req.tool_choice
    effort = (req.reasoning or {}).get("effort")
    body = {
        "model": req.model,
        "messages": _messages(req),
        "tools": tools or None,
        "tool_choice": {"type": "function", "function": {"name": choice.name}}
        if isinstance(choice, FunctionToolChoice)
        else choice,
        "parallel_tool_calls": req.parallel_tool_calls,
        "max_completion_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "response_format": _response_format(req.text),
        "reasoning_effort": effort if effort in REASONING_EFFORTS else None,  # gpt-oss's template writes it
        "structured_outputs": req.structured_outputs,
    }
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        message, param = describe_validation_errors([dict(e) for e in exc.errors()])
        raise OpenAIError(400, message, "invalid_value", param) from None
