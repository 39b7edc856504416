"""Tool-call parsers on recorded outputs of each model family's format, whole and streamed piece by piece:
the streamed deltas must reassemble to exactly the calls of the whole-text parse."""

from __future__ import annotations

import json

import pytest

from backend.server.tool_calls import ToolCallFormatter
from backend.server.tool_parsers import (
    HermesToolParser,
    Llama3JsonToolParser,
    NamedToolParser,
    RequiredToolParser,
    value_end,
)

WEATHER = {"city": "Paris", "unit": "celsius"}
CONVERT = {"value": 3.5, "from_unit": "km", "to_unit": "mi"}

# Qwen2.5-7B-Instruct's output for "What's the weather in Paris, and 3.5 km in miles?" (Hermes format)
QWEN_TWO_CALLS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "convert_units", "arguments": {"value": 3.5, "from_unit": "km", "to_unit": "mi"}}'
    "\n</tool_call>"
)
QWEN_TEXT_THEN_CALL = (
    "Let me check that for you.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
)
# Llama-3.1-8B-Instruct's JSON tool calls (its chat template's "JSON based tool calling")
LLAMA_ONE_CALL = '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}'
LLAMA_PYTHON_TAG = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}'
LLAMA_TWO_CALLS = (
    '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}; '
    '{"name": "convert_units", "parameters": {"value": 3.5, "from_unit": "km", "to_unit": "mi"}}'
)

CASES = [
    (HermesToolParser(), QWEN_TWO_CALLS, None, [("get_weather", WEATHER), ("convert_units", CONVERT)]),
    (HermesToolParser(), QWEN_TEXT_THEN_CALL, "Let me check that for you.\n", [("get_weather", WEATHER)]),
    (HermesToolParser(), "The weather in Paris is sunny.", "The weather in Paris is sunny.", []),
    (Llama3JsonToolParser(), LLAMA_ONE_CALL, None, [("get_weather", WEATHER)]),
    (Llama3JsonToolParser(), LLAMA_PYTHON_TAG, None, [("get_weather", WEATHER)]),
    (Llama3JsonToolParser(), LLAMA_TWO_CALLS, None, [("get_weather", WEATHER), ("convert_units", CONVERT)]),
    (Llama3JsonToolParser(), "It is sunny in Paris.", "It is sunny in Paris.", []),
    (RequiredToolParser(), '[{"name": "get_weather", "parameters": ' + json.dumps(WEATHER) + "}]", None,
     [("get_weather", WEATHER)]),
    (NamedToolParser("convert_units"), json.dumps(CONVERT), None, [("convert_units", CONVERT)]),
]  # fmt: skip


def reassemble(chunks: list[dict]) -> tuple[str, list[dict]]:
    """Content and calls from streamed deltas, the way OpenAI clients accumulate them."""
    content, calls = "", {}
    for delta in chunks:
        content += delta.get("content", "")
        for update in delta.get("tool_calls", []):
            call = calls.setdefault(update["index"], {"id": None, "name": None, "arguments": ""})
            call["id"] = update.get("id", call["id"])
            call["name"] = update.get("function", {}).get("name", call["name"])
            call["arguments"] += update.get("function", {}).get("arguments", "")
    return content, [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize(("parser", "text", "content", "expected"), CASES)
def test_whole_output_parses_to_the_recorded_calls(parser, text, content, expected):
    message, called = ToolCallFormatter(parser).message(text)
    assert called == bool(expected)
    assert message["content"] == content
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]]
    assert got == expected
    assert all(c["id"].startswith("chatcmpl-tool-") for c in message["tool_calls"])


@pytest.mark.parametrize(("parser", "text", "content", "expected"), CASES)
@pytest.mark.parametrize("step", [1, 3, 7])
def test_streamed_deltas_reassemble_to_the_whole_parse(parser, text, content, expected, step):
    streamer, whole = ToolCallFormatter(parser), ToolCallFormatter(parser)
    chunks = []
    for end in range(step, len(text) + step, step):
        delta, _ = streamer.delta(text[:end], final=end >= len(text))
        if delta:
            chunks.append(delta)
    streamed_content, streamed_calls = reassemble(chunks)
    message, _ = whole.message(text)
    assert streamed_content == (message["content"] or "")
    assert [(c["name"], c["arguments"]) for c in streamed_calls] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]
    ]
    first_updates = [u for d in chunks for u in d.get("tool_calls", []) if "id" in u]
    assert len(first_updates) == len(expected)  # each call announced once, with its id and name


def test_a_tag_split_across_chunks_is_not_shown_as_content():
    parser = HermesToolParser()
    assert parser.parse("Sure <tool_", final=False).content == "Sure "
    assert parser.parse("Sure <tool_", final=True).content == "Sure <tool_"


def test_a_call_cut_off_by_max_tokens_is_left_out_of_the_message():
    text = '[{"name": "get_weather", "parameters": {"city": "Par'
    message, called = ToolCallFormatter(RequiredToolParser()).message(text)
    assert not called and message["tool_calls"] == []


def test_value_end_ignores_braces_inside_strings():
    text = '{"a": "}{\\"", "b": [1, {"c": 2}]} tail'
    assert text[: value_end(text, 0)] == '{"a": "}{\\"", "b": [1, {"c": 2}]}'
    assert value_end('{"a": "}', 0) is None
