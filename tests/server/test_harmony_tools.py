"""gpt-oss's harmony tool calls (vLLM's ``openai`` tool parser) and reasoning items, on the token ids the
harmony test tokenizer gives for real harmony text: a message to ``functions.NAME`` becomes a tool call
(chat completions, whole and token by token), the call and its result render back through gpt-oss's own
chat template, and /v1/responses carries the analysis as a ``reasoning`` item whose streamed events the
``openai`` package's own types parse."""

from __future__ import annotations

import json

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from backend.engine.outputs import CompletionOutput, RequestOutput
from backend.engine.sampling_params import SamplingParams, StructuredOutputsParams
from backend.engine.structured_output import StructuredOutputManager
from backend.server.chat_prompt import chat_options, chat_prompt_ids
from backend.server.errors import OpenAIError
from backend.server.harmony import HarmonyParser, HarmonyTokens
from backend.server.protocol import ChatCompletionRequest
from backend.server.responses import ChatFormatter
from backend.server.responses_output import ResponsesFormatter
from backend.server.responses_protocol import ResponsesRequest
from backend.server.responses_stream import ResponsesEvents
from backend.server.serving import harmony_stop
from backend.server.tool_parsers import OpenAIToolParser, ParsedCall
from backend.server.tools import NamedToolChoice, Tool, harmony_tool_constraint, tool_parser
from tests.engine_utils import tokenizer_dir
from tests.harmony_utils import TOOLS, harmony_tokenizer

ARGS = '{"city": "Paris", "unit": "°C"}'
CALL = (
    "<|channel|>analysis<|message|>Need the weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    f"<|message|>{ARGS}<|call|>"
)
ANSWER = (
    "<|channel|>analysis<|message|>The user greets.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello!<|return|>"
)


@pytest.fixture(scope="module")
def tokenizer():
    return harmony_tokenizer()


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def output(tokenizer, ids: list[int], upto: int, finish_reason: str | None) -> RequestOutput:
    text = tokenizer.decode(ids[:upto], skip_special_tokens=True)
    comp = CompletionOutput(0, text, ids[:upto], finish_reason=finish_reason)
    return RequestOutput("r", None, [1, 2], [comp], finished=finish_reason is not None)


@pytest.mark.parametrize(
    "header",
    [
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>",  # the template's
    ],
)
def test_a_message_to_a_function_is_a_call_with_its_text_as_arguments(tokenizer, header):
    text = f"<|channel|>analysis<|message|>Need the weather.<|end|>{header}{ARGS}<|call|>"
    parser = HarmonyParser.for_tokenizer(tokenizer)
    assert parser is not None
    split = parser.split(ids_of(tokenizer, text), is_finished=True)
    assert (split.reasoning, split.content) == ("Need the weather.", None)
    assert split.calls == [ParsedCall("get_weather", ARGS, is_complete=True)]


def test_a_call_cut_off_is_incomplete_and_a_builtin_recipient_is_no_call(tokenizer):
    ids = ids_of(tokenizer, CALL)
    parser = HarmonyParser.for_tokenizer(tokenizer)
    assert parser is not None
    (cut,) = parser.split(ids[:-3], is_finished=True).calls
    assert not cut.is_complete and ARGS.startswith(cut.arguments) and cut.arguments
    browser = CALL.replace("functions.get_weather", "browser.search")
    assert HarmonyParser.for_tokenizer(tokenizer).split(ids_of(tokenizer, browser), True).calls == []  # type: ignore[union-attr]


def test_chat_tool_calls_whole_and_streamed_token_by_token(tokenizer):
    """vLLM's shape: message.tool_calls (id, type, function name and arguments as a JSON string),
    finish_reason "tool_calls", the analysis as reasoning_content; the streamed deltas (the first with index,
    id, type and name) add up to the whole."""
    ids = ids_of(tokenizer, CALL)
    harmony = HarmonyTokens.of(tokenizer)
    whole = ChatFormatter("m", tokenizer, None, OpenAIToolParser(), 1, harmony)
    choice = whole.response([output(tokenizer, ids, len(ids), "stop")])["choices"][0]
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls" and message["content"] is None
    assert message["reasoning_content"] == "Need the weather."
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    assert call["function"] == {"name": "get_weather", "arguments": ARGS}
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "unit": "°C"}

    streamed = ChatFormatter("m", tokenizer, None, OpenAIToolParser(), 1, harmony)
    chunks = [
        streamed.choice_chunk(output(tokenizer, ids, n, "stop" if n == len(ids) else None).outputs[0])
        for n in range(1, len(ids) + 1)
    ]
    deltas = [c["delta"] for c in chunks if c is not None]
    calls = [entry for d in deltas for entry in d.get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["type"] == "function"
    assert all("id" not in entry and "name" not in entry["function"] for entry in calls[1:])
    assert "".join(entry["function"]["arguments"] for entry in calls) == ARGS
    assert len(calls) > 2  # the arguments arrive as the tokens do
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Need the weather."
    assert not any(d.get("content") for d in deltas)
    assert [c["finish_reason"] for c in chunks if c is not None][-1] == "tool_calls"


def test_without_the_openai_parser_a_call_is_neither_content_nor_a_tool_call(tokenizer):
    ids = ids_of(tokenizer, CALL)
    plain = ChatFormatter("m", tokenizer, None, None, 1, HarmonyTokens.of(tokenizer))
    choice = plain.response([output(tokenizer, ids, len(ids), "stop")])["choices"][0]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"] is None


def test_a_tool_loop_renders_through_gpt_oss_template(tokenizer):
    """The call the model made (arguments as OpenAI's JSON string) and the tool's result (role tool) become
    harmony messages in gpt-oss's own template, the prompt ending where the next answer begins."""
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21"},
    ]
    req = ChatCompletionRequest(messages=messages, tools=TOOLS)  # type: ignore[arg-type]
    prompt = tokenizer.decode(chat_prompt_ids(tokenizer, req, chat_options(req)))
    assert "namespace functions {" in prompt and "type get_weather = (_: {" in prompt
    call = f"<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{ARGS}<|call|>"
    result = '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"sunny, 21"<|end|>'
    assert prompt.endswith(call + result + "<|start|>assistant")
    bad = [messages[0], {**messages[1], "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]
    with pytest.raises(OpenAIError, match="not JSON"):
        chat_prompt_ids(tokenizer, ChatCompletionRequest(messages=bad, tools=TOOLS), chat_options(req))  # type: ignore[arg-type]


def test_harmony_stops_at_call_and_the_openai_parser_needs_harmony(tokenizer):
    from transformers import AutoTokenizer

    params = SamplingParams(max_tokens=8)
    harmony_stop(tokenizer, OpenAIToolParser(), params)
    assert params.stop_token_ids == [tokenizer.convert_tokens_to_ids("<|call|>")]
    with pytest.raises(OpenAIError, match="no harmony control tokens"):
        harmony_stop(AutoTokenizer.from_pretrained(tokenizer_dir()), OpenAIToolParser(), SamplingParams())


def responses_formatter(tokenizer, parser) -> ResponsesFormatter:
    req = ResponsesRequest(model="m", input="Hi", tools=[{"type": "function", "name": "get_weather"}])  # type: ignore[list-item]
    return ResponsesFormatter("m", tokenizer, parser, req, HarmonyTokens.of(tokenizer))


@pytest.mark.parametrize("text", [ANSWER, CALL])
def test_responses_reasoning_item_first_whole_and_streamed(tokenizer, text):
    """/v1/responses: the analysis is a reasoning item (summary [], content [reasoning_text]) before the
    message or the function_call; the streamed events, parsed by the openai package's own event types, add
    up to the completed response's items, output indexes and ids included."""
    ids = ids_of(tokenizer, text)
    final = "stop"
    whole = Response.model_validate(
        responses_formatter(tokenizer, OpenAIToolParser()).response([output(tokenizer, ids, len(ids), final)])
    )
    kinds = [item.type for item in whole.output]
    reasoning = whole.output[0]
    thought_ids = ids_of(tokenizer, text.split("<|message|>")[1].split("<|end|>")[0])
    assert whole.usage is not None and whole.usage.output_tokens_details.reasoning_tokens == len(thought_ids)
    assert reasoning.type == "reasoning" and reasoning.summary == [] and reasoning.content is not None
    assert [(c.type, c.text) for c in reasoning.content] == [
        ("reasoning_text", text.split("<|message|>")[1].split("<|end|>")[0])
    ]
    if text == ANSWER:
        assert kinds == ["reasoning", "message"] and whole.output_text == "Hello!"
    else:
        assert kinds == ["reasoning", "function_call"]
        call = whole.output[1]
        assert call.type == "function_call" and (call.name, call.arguments) == ("get_weather", ARGS)

    events = ResponsesEvents(responses_formatter(tokenizer, OpenAIToolParser()))
    adapter: TypeAdapter = TypeAdapter(ResponseStreamEvent)
    sent = [adapter.validate_python(e) for e in events.start()]
    for n in range(1, len(ids) + 1):
        sent += [
            adapter.validate_python(e)
            for e in events.update(output(tokenizer, ids, n, final if n == len(ids) else None))
        ]
    types = [e.type for e in sent]
    assert types.index("response.reasoning_text.delta") < types.index("response.reasoning_text.done")
    thought = "".join(e.delta for e in sent if e.type == "response.reasoning_text.delta")
    done = next(e for e in sent if e.type == "response.reasoning_text.done")
    assert thought == done.text == reasoning.content[0].text and done.output_index == 0
    completed = next(e for e in sent if e.type == "response.completed").response
    assert [i.type for i in completed.output] == kinds
    added = [e.item.type for e in sent if e.type == "response.output_item.added"]
    assert added == kinds
    assert [e.sequence_number for e in sent] == list(range(len(sent)))


def test_several_calls_in_one_turn_each_render_with_their_own_result(tokenizer):
    """OpenAI's parallel calls (one assistant message, results matched by tool_call_id, here out of order)
    become call, result, call, result in gpt-oss's template, which renders one call per message."""

    def call(call_id: str, city: str) -> dict:
        arguments = json.dumps({"city": city})
        return {
            "id": call_id,
            "type": "function",
            "function": {"name": "get_weather", "arguments": arguments},
        }

    messages = [
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call("a", "Paris"), call("b", "Oslo")]},
        {"role": "tool", "tool_call_id": "b", "content": "snow"},
        {"role": "tool", "tool_call_id": "a", "content": "sun"},
    ]
    req = ChatCompletionRequest(messages=messages, tools=TOOLS)  # type: ignore[arg-type]
    prompt = tokenizer.decode(chat_prompt_ids(tokenizer, req, chat_options(req)))
    head = "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
    result = "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
    expected = (
        f'{head}{{"city": "Paris"}}<|call|>{result}"sun"<|end|>'
        f'{head}{{"city": "Oslo"}}<|call|>{result}"snow"<|end|><|start|>assistant'
    )
    assert prompt.endswith(expected)


def accepts(tokenizer, grammar: str, text: str) -> bool:
    """llguidance (the server's structured-output engine) over the harmony tokenizer: is text a whole
    sentence of the grammar?"""
    manager = StructuredOutputManager(tokenizer, len(tokenizer), tokenizer.eos_token_id)
    matcher = manager.compile(StructuredOutputsParams(grammar=grammar)).deep_copy()
    ids = ids_of(tokenizer, text)
    return all(matcher.consume_token(i) for i in ids) and matcher.is_accepting()


def test_a_forced_call_is_held_to_harmony_call_shape(tokenizer):
    """harmony_tool_constraint: OpenAI's documented call (reasoning first or not) parses; another function
    than the named one, arguments outside the schema, or a plain JSON answer do not; "auto" and "none"
    have no constraint, and a forced call on a harmony model is read by the openai parser."""
    tools = [Tool.model_validate(t) for t in TOOLS]
    required = harmony_tool_constraint(tools, "required")
    named = harmony_tool_constraint(
        tools, NamedToolChoice.model_validate({"function": {"name": "get_weather"}})
    )
    assert required is not None and named is not None and required.grammar and named.grammar
    call = (
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>'
    )
    thought = "<|channel|>analysis<|message|>Need the weather.\nUse <tool>.<|end|><|start|>assistant"
    for grammar in (required.grammar, named.grammar):
        assert accepts(tokenizer, grammar, call) and accepts(tokenizer, grammar, thought + call)
        assert not accepts(tokenizer, grammar, call.replace('"city"', '"town"'))
        # compact JSON, as OpenAI's harmony guide writes a call: free whitespace lets a model pad the
        # arguments until max_tokens
        assert not accepts(tokenizer, grammar, call.replace('{"city":', '{"city": '))
        assert not accepts(tokenizer, grammar, call.replace('{"city":', '{\n"city":'))
        assert not accepts(tokenizer, grammar, '[{"name": "get_weather", "parameters": {"city": "Paris"}}]')
    other = harmony_tool_constraint(
        [*tools, Tool.model_validate({"function": {"name": "get_time"}})],
        NamedToolChoice.model_validate({"function": {"name": "get_time"}}),
    )
    assert other is not None and other.grammar and not accepts(tokenizer, other.grammar, call)
    assert harmony_tool_constraint(tools, "auto") is None and harmony_tool_constraint(tools, "none") is None
    assert isinstance(tool_parser("required", None, False, harmony=True), OpenAIToolParser)
    assert not isinstance(tool_parser("required", None, False), OpenAIToolParser)
