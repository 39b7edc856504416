"""`app.py serve` with a tiny random gpt-oss (tests/gpt_oss_utils.py: harmony's control tokens and gpt-oss's
chat template on the default tokenizer), driven by the real openai client: chat completions carry vLLM's
reasoning_content beside content, whole and streamed (n=2: each choice its own). A grammar over harmony's
special tokens (llguidance) makes the random model answer in harmony's shape; the same request on
/v1/completions with special tokens kept gives the raw text, which says independently what each field must
hold. With `--tool-call-parser openai` a grammar in harmony's tool-call shape makes the model call a tool:
the server returns it as tool_calls, and the call and its result go back through gpt-oss's template. The
Responses API carries the analysis as a reasoning item, parsed by the openai client's own types."""

from __future__ import annotations

import json
import re

import pytest
from openai import OpenAI

from backend.server.tools import NamedToolChoice, Tool, harmony_tool_constraint
from tests.gpt_oss_utils import tiny_gpt_oss
from tests.harmony_utils import HARMONY_GRAMMAR, TOOLS, harmony_tokenizer
from tests.server_utils import ServeProcess

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]
RAW = re.compile(
    r"<\|channel\|>analysis<\|message\|>(?P<reasoning>[a-z ]+)<\|end\|><\|start\|>assistant"
    r"<\|channel\|>final<\|message\|>(?P<content>[A-Z ]+)"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("harmony") / "serve.log"
    args = ("--model", tiny_gpt_oss(), "--num-kv-blocks", "128", "--max-model-len", "512")
    tools = ("--enable-auto-tool-choice", "--tool-call-parser", "openai")
    proc = ServeProcess(log, *args, *tools, "--served-model-name", "tiny-harmony")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def raw_answers(client, **sampling) -> list[re.Match]:
    """The same prompt through /v1/completions, special tokens kept: harmony as the model wrote it (one
    match per choice)."""
    tokenizer = harmony_tokenizer()
    text = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    extra = {"structured_outputs": {"grammar": HARMONY_GRAMMAR}, "skip_special_tokens": False}
    sampling = {"temperature": 0} | sampling
    raw = client.completions.create(
        model="tiny-harmony", prompt=ids, max_tokens=120, extra_body=extra, **sampling
    )
    found = [RAW.fullmatch(choice.text) for choice in sorted(raw.choices, key=lambda c: c.index)]
    assert all(found), [choice.text for choice in raw.choices]
    return found  # type: ignore[return-value]


def raw_answer(client) -> re.Match:
    return raw_answers(client)[0]


def test_the_answer_is_content_and_the_analysis_reasoning_content(client):
    expected = raw_answer(client)
    reply = client.chat.completions.create(
        model="tiny-harmony",
        messages=MESSAGES,
        max_tokens=120,
        temperature=0,
        extra_body={"structured_outputs": {"grammar": HARMONY_GRAMMAR}},
    )
    message = reply.choices[0].message
    assert message.content == expected["content"]
    assert message.reasoning_content == expected["reasoning"]  # type: ignore[attr-defined]
    assert reply.choices[0].finish_reason == "stop"


def test_streamed_deltas_carry_the_reasoning_first_then_the_answer(client):
    expected = raw_answer(client)
    stream = client.chat.completions.create(
        model="tiny-harmony",
        messages=MESSAGES,
        max_tokens=120,
        temperature=0,
        stream=True,
        extra_body={"structured_outputs": {"grammar": HARMONY_GRAMMAR}},
    )
    kinds, reasoning, content = [], "", ""
    for chunk in stream:
        delta = chunk.choices[0].delta
        piece = getattr(delta, "reasoning_content", None)
        if piece:
            kinds.append("reasoning")
            reasoning += piece
        if delta.content:
            kinds.append("content")
            content += delta.content
    assert (reasoning, content) == (expected["reasoning"], expected["content"])
    assert kinds == sorted(kinds, key=lambda kind: kind == "content") and len(set(kinds)) == 2
    # how many chunks the reasoning takes depends on how fast the client reads (the engine keeps only the
    # newest output for a slow reader); that deltas come token by token is test_harmony's ReasoningStream test


def test_a_reply_cut_inside_the_reasoning_has_no_content_yet(client):
    reply = client.chat.completions.create(
        model="tiny-harmony",
        messages=MESSAGES,
        max_tokens=5,
        temperature=0,
        extra_body={"structured_outputs": {"grammar": HARMONY_GRAMMAR}},
    )
    message, choice = reply.choices[0].message, reply.choices[0]
    assert choice.finish_reason == "length" and message.content is None
    assert re.fullmatch("[a-z ]+", message.reasoning_content)  # type: ignore[attr-defined]


def test_parallel_samples_each_split_their_own_channels(client):
    """n=2 sampled with a seed: each choice's reasoning and answer are its own (one parser per choice), whole
    and streamed, as the same seed's raw /v1/completions choices say."""
    sampling = {"n": 2, "temperature": 1.0, "seed": 7}
    expected = [(m["reasoning"], m["content"]) for m in raw_answers(client, **sampling)]
    assert expected[0] != expected[1]  # the check below could not tell the choices apart otherwise
    extra = {"structured_outputs": {"grammar": HARMONY_GRAMMAR}}
    reply = client.chat.completions.create(
        model="tiny-harmony", messages=MESSAGES, max_tokens=120, extra_body=extra, **sampling
    )
    whole = {c.index: (c.message.reasoning_content, c.message.content) for c in reply.choices}  # type: ignore[attr-defined]
    assert [whole[0], whole[1]] == expected
    stream = client.chat.completions.create(
        model="tiny-harmony", messages=MESSAGES, max_tokens=120, stream=True, extra_body=extra, **sampling
    )
    streamed = {0: ["", ""], 1: ["", ""]}
    for chunk in stream:
        for choice in chunk.choices:
            streamed[choice.index][0] += getattr(choice.delta, "reasoning_content", None) or ""
            streamed[choice.index][1] += choice.delta.content or ""
    assert [tuple(streamed[0]), tuple(streamed[1])] == expected


# harmony's tool-call shape as gpt-oss writes it (openai's harmony docs): the analysis, then a commentary
# message to functions.get_weather, JSON-constrained, closed by <|call|>
TOOL_GRAMMAR = r"""
start: analysis call
analysis: <|channel|> "analysis" <|message|> THINK <|end|>
call: head <|message|> ARGS <|call|>
head: <|start|> "assistant" <|channel|> "commentary to=functions.get_weather " <|constrain|> "json"
THINK: /[a-z ]{1,40}/
ARGS: /\{"city": "[a-z]{1,12}"\}/
"""
RAW_CALL = re.compile(
    r"<\|channel\|>analysis<\|message\|>(?P<reasoning>[a-z ]+)<\|end\|><\|start\|>assistant<\|channel\|>"
    r"commentary to=functions\.get_weather <\|constrain\|>json<\|message\|>(?P<arguments>\{.*\})<\|call\|>"
)


def raw_call(client) -> re.Match:
    """The forced call as the model wrote it: the same prompt (tools rendered by gpt-oss's template) through
    /v1/completions with special tokens kept."""
    tokenizer = harmony_tokenizer()
    text = tokenizer.apply_chat_template(MESSAGES, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    extra = {"structured_outputs": {"grammar": TOOL_GRAMMAR}, "skip_special_tokens": False}
    raw = client.completions.create(
        model="tiny-harmony", prompt=ids, max_tokens=120, temperature=0, extra_body=extra
    )
    found = RAW_CALL.fullmatch(raw.choices[0].text)
    assert found, raw.choices[0].text
    return found


def test_a_harmony_call_is_a_tool_call_whole_and_streamed(client):
    """The random model cannot choose to call a tool, so a grammar (llguidance over harmony's special tokens)
    forces the call's shape; the name and arguments are what the model sampled inside it, and the server's
    `openai` parser must read them back as vLLM returns them (the raw completion says what they are)."""
    expected = raw_call(client)
    extra = {"structured_outputs": {"grammar": TOOL_GRAMMAR}}
    request = {
        "model": "tiny-harmony",
        "messages": MESSAGES,
        "tools": TOOLS,
        "max_tokens": 120,
        "temperature": 0,
    }
    reply = client.chat.completions.create(**request, extra_body=extra)  # type: ignore[call-overload]
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.reasoning_content == expected["reasoning"]  # type: ignore[attr-defined]
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
    assert (call.function.name, call.function.arguments) == ("get_weather", expected["arguments"])
    assert set(json.loads(call.function.arguments)) == {"city"}

    stream = client.chat.completions.create(**request, stream=True, extra_body=extra)  # type: ignore[call-overload]
    names, ids, arguments, finish = [], set(), "", None
    for chunk in stream:
        for entry in chunk.choices[0].delta.tool_calls or []:
            names += [entry.function.name] if entry.function and entry.function.name else []
            ids |= {entry.id} if entry.id else set()
            arguments += entry.function.arguments or "" if entry.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert (names, arguments, finish) == (["get_weather"], expected["arguments"], "tool_calls")
    assert len(ids) == 1 and next(iter(ids)).startswith("chatcmpl-tool-")


def test_a_tool_result_goes_back_through_gpt_oss_template(client):
    """A tool loop: the reply's call and the tool's result (role tool) are sent back; the server renders them
    with gpt-oss's template (the prompt's token count is the local template's) and the model answers."""
    extra = {"structured_outputs": {"grammar": TOOL_GRAMMAR}}
    first = client.chat.completions.create(
        model="tiny-harmony",
        messages=MESSAGES,
        tools=TOOLS,
        max_tokens=120,
        temperature=0,
        extra_body=extra,  # type: ignore[arg-type]
    )
    (call,) = first.choices[0].message.tool_calls or []
    turn = {
        "role": "assistant",
        "content": None,
        "tool_calls": [call.model_dump(include={"id", "type", "function"})],
    }
    loop = [*MESSAGES, turn, {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    answer = client.chat.completions.create(
        model="tiny-harmony",
        messages=loop,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        max_tokens=120,
        temperature=0,
        extra_body={"structured_outputs": {"grammar": HARMONY_GRAMMAR}},
    )
    assert answer.choices[0].finish_reason == "stop" and re.fullmatch(
        "[A-Z ]+", answer.choices[0].message.content or ""
    )
    local = [
        *loop[:-2],
        turn
        | {
            "tool_calls": [
                {"function": {"name": "get_weather", "arguments": json.loads(call.function.arguments)}}
            ]
        },
        loop[-1],
    ]
    tokenizer = harmony_tokenizer()
    text = tokenizer.apply_chat_template(local, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert (
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"sunny, 21 C"<|end|>'
        in text
    )
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == len(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_responses_carry_the_analysis_as_a_reasoning_item_whole_and_streamed(client):
    """client.responses.create: a reasoning item (reasoning_text) before the message, both as the raw
    completion says; streamed, the reasoning_text deltas and the output_text deltas add up to them."""
    expected = raw_answer(client)
    request = {
        "model": "tiny-harmony",
        "instructions": "Be brief.",
        "input": "Say hello.",
        "max_output_tokens": 120,
        "temperature": 0,
        "extra_body": {"structured_outputs": {"grammar": HARMONY_GRAMMAR}},
    }
    response = client.responses.create(**request)
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.summary == []
    assert [(c.type, c.text) for c in reasoning.content or []] == [("reasoning_text", expected["reasoning"])]
    assert message.type == "message" and response.output_text == expected["content"]
    assert (
        response.usage is not None
    )  # the exact count: test_harmony_tools (here each token is 1+ characters)
    assert 0 < response.usage.output_tokens_details.reasoning_tokens <= len(expected["reasoning"])

    thought, text, kinds = "", "", []
    for event in client.responses.create(**request, stream=True):
        kinds.append(event.type)
        if event.type == "response.reasoning_text.delta":
            thought += event.delta
        elif event.type == "response.output_text.delta":
            text += event.delta
        elif event.type == "response.reasoning_text.done":
            assert event.text == expected["reasoning"] and event.output_index == 0
    assert (thought, text) == (expected["reasoning"], expected["content"])
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.done")
    assert kinds[-1] == "response.completed"


def bounded_tool(name: str, description: str, argument: str) -> dict:
    """A tool with one string argument of at most 16 characters: a random model never closes a free string
    (it writes until max_tokens), so the schema bounds it, as a real tool's might (a city, a time zone)."""
    string = {"type": "string", "maxLength": 16}
    parameters = {"type": "object", "properties": {argument: string}, "required": [argument]}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


TWO_TOOLS = [
    bounded_tool("get_weather", "The weather in a city", "city"),
    bounded_tool("get_time", "The local time in a city", "zone"),
]
FORCED_CALL = re.compile(
    r"(?:<\|channel\|>analysis<\|message\|>(?P<reasoning>.*)<\|end\|><\|start\|>assistant)?"
    r"<\|channel\|>commentary to=functions\.(?P<name>[a-z_]+) <\|constrain\|>json<\|message\|>"
    r"(?P<arguments>\{.*\})<\|call\|>",
    re.DOTALL,
)


# a random model never ends its reasoning by itself: a bias on <|end|> makes it end the analysis where the
# grammar allows (elsewhere in the call the grammar masks <|end|> out)
END_SOON = {str(harmony_tokenizer().convert_tokens_to_ids("<|end|>")): 100}


def raw_forced_call(client, tool_choice) -> re.Match:
    """The forced call as the model wrote it: the prompt with both tools, through /v1/completions under the
    grammar the server builds for this tool_choice (harmony_tool_constraint), special tokens kept."""
    tokenizer = harmony_tokenizer()
    text = tokenizer.apply_chat_template(
        MESSAGES, tools=TWO_TOOLS, add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    choice = tool_choice if isinstance(tool_choice, str) else NamedToolChoice.model_validate(tool_choice)
    constraint = harmony_tool_constraint([Tool.model_validate(t) for t in TWO_TOOLS], choice)
    assert constraint is not None
    extra = {"structured_outputs": {"grammar": constraint.grammar}, "skip_special_tokens": False}
    raw = client.completions.create(
        model="tiny-harmony", prompt=ids, max_tokens=200, temperature=0, logit_bias=END_SOON, extra_body=extra
    )
    found = FORCED_CALL.fullmatch(raw.choices[0].text)
    assert found, raw.choices[0].text
    return found


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_time"}}],
    ids=["required", "named"],
)
def test_a_forced_tool_choice_is_a_harmony_call_read_back_as_a_tool_call(client, tool_choice):
    """tool_choice "required" or a named function on a harmony model: the output is held to gpt-oss's own
    call shape (its reasoning free, then one commentary message to functions.NAME with JSON arguments),
    not to a bare JSON list, and the call comes back as tool_calls although the request is not "auto"."""
    expected = raw_forced_call(client, tool_choice)
    reply = client.chat.completions.create(
        model="tiny-harmony",
        messages=MESSAGES,  # type: ignore[arg-type]
        tools=TWO_TOOLS,  # type: ignore[arg-type]
        tool_choice=tool_choice,
        max_tokens=200,
        temperature=0,
        logit_bias=END_SOON,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    reasoning = choice.message.reasoning_content  # type: ignore[attr-defined]
    assert (reasoning or "") == (expected["reasoning"] or "")
    (call,) = choice.message.tool_calls or []
    assert (call.function.name, call.function.arguments) == (expected["name"], expected["arguments"])
    if tool_choice != "required":
        assert call.function.name == "get_time"
    schema = next(
        t["function"]["parameters"] for t in TWO_TOOLS if t["function"]["name"] == call.function.name
    )
    assert set(json.loads(call.function.arguments)) == set(schema["required"])
