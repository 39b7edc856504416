"""The tools demo behind the Chat tab: two local functions, a call, its result sent back, the final answer.

It goes through the same code as /v1/chat/completions (prompt rendering, the tool_choice constraint, the
parser), on an engine in this process, so the page shows what an OpenAI client would receive. Also the
sample JSON schemas offered by the Chat tab's structured-output panel.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from backend.engine.grammar_limits import DEFAULT_LIMITS
from backend.engine.sampling_params import SamplingParams, StructuredOutputsParams
from backend.server.chat_prompt import chat_prompt_ids
from backend.server.protocol import ChatCompletionRequest
from backend.server.tool_calls import ToolCallFormatter
from backend.server.tools import Tool, resolve_tool_choice, tool_constraint, tool_parser

SAMPLE_SCHEMAS: dict[str, dict[str, Any]] = {
    "person": {  # nested object, enum, pattern, bounded array, required fields (tests and bench use it)
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "role": {"type": "string", "enum": ["admin", "user", "guest"]},
            "address": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 20},
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                },
                "required": ["city", "zip"],
                "additionalProperties": False,
            },
            "tags": {
                "type": "array",
                "items": {"type": "string", "maxLength": 12},
                "minItems": 1,
                "maxItems": 3,
            },
            "active": {"type": "boolean"},
        },
        "required": ["name", "age", "role", "address", "tags", "active"],
        "additionalProperties": False,
    },
    "order": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {
                        "product": {"type": "string", "maxLength": 30},
                        "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                    },
                    "required": ["product", "quantity"],
                    "additionalProperties": False,
                },
            },
            "shipping": {"type": "string", "enum": ["standard", "express"]},
        },
        "required": ["items", "shipping"],
        "additionalProperties": False,
    },
    "sentiment": {
        "type": "object",
        "properties": {
            "sentiment": {"type": "string", "enum": ["positive", "neutral", "negative"]},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["sentiment", "confidence"],
        "additionalProperties": False,
    },
}

DEMO_TOOLS = [
    Tool.model_validate(
        {"type": "function", "function": {
            "name": "get_weather", "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": False}}}
    ),
    Tool.model_validate(
        {"type": "function", "function": {
            "name": "convert_units", "description": "Convert a distance or a weight",
            "parameters": {"type": "object", "properties": {
                "value": {"type": "number"},
                "from_unit": {"type": "string", "enum": sorted({"km", "mi", "kg", "lb"})},
                "to_unit": {"type": "string", "enum": sorted({"km", "mi", "kg", "lb"})}},
                "required": ["value", "from_unit", "to_unit"], "additionalProperties": False}}}
    ),
]  # fmt: skip
TO_BASE = {
    "km": ("distance", 1000.0),
    "mi": ("distance", 1609.344),
    "kg": ("mass", 1.0),
    "lb": ("mass", 0.45359237),
}


def schema_constraint(text: str) -> StructuredOutputsParams | None:
    """The Chat tab's schema box as a constraint (None when empty); ValueError for malformed JSON or a
    schema over the grammar limits (its size is checked before it is parsed)."""
    if not (text or "").strip():
        return None
    limit = DEFAULT_LIMITS.max_schema_bytes
    if len(text) > limit:
        raise ValueError(
            f"the JSON schema is {len(text):,} characters; the limit is {limit:,} (max_schema_bytes)"
        )
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"the JSON schema is not valid JSON: {exc}") from None
    return StructuredOutputsParams(json=schema)


def get_weather(city: str, unit: str) -> dict:
    """A stand-in forecast (no network here): the same city always gets the same weather."""
    celsius = 5 + sum(map(ord, city.lower())) % 25
    temperature = celsius if unit == "celsius" else round(celsius * 9 / 5 + 32)
    return {
        "city": city,
        "temperature": temperature,
        "unit": unit,
        "sky": ["clear", "cloudy", "rain"][celsius % 3],
    }


def convert_units(value: float, from_unit: str, to_unit: str) -> dict:
    (kind_from, scale_from), (kind_to, scale_to) = TO_BASE[from_unit], TO_BASE[to_unit]
    if kind_from != kind_to:
        return {"error": f"cannot convert {kind_from} ({from_unit}) to {kind_to} ({to_unit})"}
    return {
        "value": value,
        "from_unit": from_unit,
        "result": round(value * scale_from / scale_to, 4),
        "to_unit": to_unit,
    }


LOCAL_FUNCTIONS: dict[str, Callable[..., dict]] = {"get_weather": get_weather, "convert_units": convert_units}


@dataclass(slots=True)
class DemoTurn:
    messages: list[dict[str, Any]] = field(default_factory=list)  # the conversation, OpenAI's shapes
    answer: str = ""


async def _complete(engine, messages: list[dict], tool_choice: Any, max_tokens: int) -> dict:
    """One chat completion through the server's code path; the assistant message as OpenAI returns it."""
    body = {"messages": messages, "tools": [t.model_dump() for t in DEMO_TOOLS], "tool_choice": tool_choice}
    req = ChatCompletionRequest.model_validate({**body, "parallel_tool_calls": False})
    choice = resolve_tool_choice(req.tools, req.tool_choice)
    parser = tool_parser(choice, None, False)
    constraint = tool_constraint(req.tools, choice, parallel_tool_calls=False)
    ids = await engine.run_in_tokenizer(chat_prompt_ids, engine.tokenizer, req)  # off the event loop
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, structured_outputs=constraint)
    outputs = [out async for out in engine.generate(ids, params)]
    text = outputs[-1].outputs[0].text
    if parser is None:
        return {"role": "assistant", "content": text}
    message, _ = ToolCallFormatter(parser).message(text)
    return message


async def run_tools_demo(engine, question: str, max_tokens: int = 96) -> DemoTurn:
    """Ask with tool_choice="required", run the call locally, send the result back, get the answer."""
    turn = DemoTurn([{"role": "user", "content": question}])
    call_message = await _complete(engine, turn.messages, "required", max_tokens)
    turn.messages.append(call_message)
    for call in call_message.get("tool_calls") or []:
        function = LOCAL_FUNCTIONS[call["function"]["name"]]
        result = function(**json.loads(call["function"]["arguments"]))
        turn.messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})
    answer = await _complete(engine, turn.messages, "none", max_tokens)
    turn.messages.append(answer)
    turn.answer = answer["content"] or ""
    return turn
