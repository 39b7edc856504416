"""OpenAI's Responses API request (POST /v1/responses), and its translation into a chat request.

The server is stateless: a response is never stored, so ``previous_response_id``, ``conversation`` and
``background`` are refused with a message saying to send the whole conversation in ``input`` (earlier
output items, then the new input), which is what a client does with ``store=false``. ``store=true``
(OpenAI's default) is accepted and the response says ``"store": false``, as vLLM does without
VLLM_ENABLE_RESPONSES_API_STORE. Input is text: message items (``input_text`` / ``output_text`` parts),
``function_call`` and ``function_call_output`` items; ``reasoning`` items are skipped. Tools are
function tools in the Responses API's flat shape. Everything else about generation (chat template, tool
constraint and parsing, structured output, limits) is the chat completions path (``responses_chat``).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from backend.server.errors import OpenAIError
from backend.server.json_values import check_list_lengths
from backend.server.limits import MAX_TOOLS
from backend.server.protocol import MAX_CONTENT_PARTS, MAX_MESSAGES, FailFastList, StrictJSON

TEXT_PART_TYPES = ("input_text", "output_text", "text")
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
# The one `include` value refused; the others ask for output this server never produces (hosted tools,
# images, encrypted reasoning), so asking for them is harmless.
LOGPROBS_INCLUDE = "message.output_text.logprobs"


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["input_text", "output_text", "text"]
    text: str


class RefusalPart(BaseModel):
    type: Literal["refusal"]
    refusal: str


ContentPart = Annotated[TextPart | RefusalPart, Field(discriminator="type")]


class MessageItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | FailFastList[ContentPart]


class FunctionCallItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call_output"]
    call_id: str
    output: str | FailFastList[ContentPart]


class ReasoningItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["reasoning"]


InputItem = Annotated[
    MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem, Field(discriminator="type")
]


class FunctionTool(BaseModel):
    """The Responses API's function tool: flat, unlike chat completions' {"function": {...}}."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")  # as chat's tools
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionToolChoice(BaseModel):
    type: Literal["function"]
    name: str


class TextFormat(BaseModel):
    """``text.format``: text, json_object, or json_schema with its fields flat (name, schema, strict)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str = "response"
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    format: TextFormat = Field(default_factory=lambda: TextFormat.model_validate({}))


def _check_input_types(data: Any) -> None:
    """Say plainly which input items and content parts this server takes (pydantic's union errors
    list every member's missing fields instead)."""
    items = data.get("input") if isinstance(data, dict) else None
    num_parts = sum(
        len(item.get(key) or []) * isinstance(item.get(key), list)
        for item in (items if isinstance(items, list) else [])
        if isinstance(item, dict)
        for key in ("content", "output")
    )
    if num_parts > MAX_CONTENT_PARTS:  # as a chat request's content parts (protocol.py)
        raise ValueError(f"input holds {num_parts:,} content parts; the limit is {MAX_CONTENT_PARTS:,}")
    for i, item in enumerate(items if isinstance(items, list) else []):
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind not in ITEM_TYPES:
            raise ValueError(
                f"input[{i}]: items of type {kind!r} are not supported; this server takes message, "
                "function_call and function_call_output items (reasoning items are skipped)"
            )
        for key in ("content", "output"):
            parts = item.get(key)
            for j, part in enumerate(parts if isinstance(parts, list) else []):
                part_type = part.get("type") if isinstance(part, dict) else None
                if part_type not in (*TEXT_PART_TYPES, "refusal"):
                    raise ValueError(
                        f"input[{i}].{key}[{j}]: {part_type!r} parts are not supported; this server "
                        "takes text only (input_text, output_text)"
                    )


class ResponsesRequest(StrictJSON):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    # the chat request's limits: input items become messages, at most MAX_MESSAGES (protocol.py)
    list_limits: ClassVar[dict[str, int]] = {"input": MAX_MESSAGES, "tools": MAX_TOOLS}

    model: str | None = None
    input: str | FailFastList[InputItem]
    instructions: str | None = None
    tools: FailFastList[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    text: TextConfig | None = None
    stream: bool = False
    store: bool = True
    metadata: dict[str, str] | None = None
    user: str | None = None
    reasoning: dict[str, Any] | None = None  # effort: to gpt-oss's template
    structured_outputs: dict[str, Any] | None = None  # vLLM's extra: a grammar, regex, json or choice
    include: FailFastList[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    # Stateful features: refused (see refuse_stateful)
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None
    prompt: Any = None

    @model_validator(mode="before")
    @classmethod
    def _supported_input(cls, data: Any) -> Any:
        check_list_lengths(data, cls.list_limits)  # before the items are walked
        _check_input_types(data)
        if isinstance(data, dict) and isinstance(data.get("input"), list):  # type is optional on messages
            items = [{"type": "message", **i} if isinstance(i, dict) else i for i in data["input"]]
            data = {**data, "input": items}
        if isinstance(data, dict):
            for i, tool in enumerate(data.get("tools") or []):
                kind = tool.get("type") if isinstance(tool, dict) else None
                if kind != "function":
                    raise ValueError(
                        f"tools[{i}]: tools of type {kind!r} are not supported; only function tools "
                        '({"type": "function", "name", "parameters"}) are'
                    )
        return data


def refuse_unsupported_responses(req: ResponsesRequest) -> None:
    """400 for what a stateless, text-only server cannot honour, saying what to send instead."""
    if req.previous_response_id is not None:
        raise OpenAIError(
            400,
            "previous_response_id is not supported: this server is stateless and stores no responses. "
            "Send the whole conversation in `input` instead (the earlier input and output items, then "
            "the new input), with store=false.",
            "previous_response_not_found",
            "previous_response_id",
        )
    refusals = {
        "conversation": (req.conversation is not None, "conversations need stored state; send `input`"),
        "background": (bool(req.background), "background responses need stored responses"),
        "prompt": (req.prompt is not None, "stored prompt templates are not supported; send `input`"),
        "truncation": (req.truncation == "auto", 'only "disabled": an input too long is a 400'),
        "include": (LOGPROBS_INCLUDE in (req.include or []), "logprobs are not supported here"),
        "top_logprobs": (bool(req.top_logprobs), "logprobs are not supported here"),
    }
    for param, (refused, why) in refusals.items():
        if refused:
            raise OpenAIError(400, f"{param} is not supported on this server: {why}", param=param)
