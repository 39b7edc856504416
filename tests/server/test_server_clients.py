"""What real clients do with the `openai` SDK against the server on the default model (SmolLM2-135M),
greedy: Responses text and a function-tool loop (call -> function_call_output -> answer), the SDK's
`responses.stream()` helper, `responses.parse` and `chat.completions.parse` with a pydantic model, a
chat tool loop with tool_choice="required", and the OpenAI Agents SDK (`openai-agents`) on
/v1/responses. Calls and structured outputs are forced by the grammar, so they must parse whatever the
model's skill; the KV pool must be empty afterwards."""

from __future__ import annotations

import asyncio
import json

import httpx
import jsonschema
import openai
import pytest
from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from pydantic import BaseModel

from backend.default_model import default_model
from backend.server import build_app
from tests.engine_utils import assert_engine_clean
from tests.server_utils import RunningServer, start_engine, wait_until

pytestmark = pytest.mark.slow
MODEL = "smol"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": WEATHER,
}
CHAT_TOOL = {"type": "function", "function": {k: TOOL[k] for k in ("name", "description", "parameters")}}
QUESTION = "What is the weather in Paris?"


class City(BaseModel):
    name: str
    country: str


def get_weather(city: str) -> dict:
    return {"city": city, "temperature_c": 21, "sky": "sunny"}


@pytest.fixture(scope="module")
def served():
    engine = start_engine(default_model(check_hub=False), max_num_seqs=8, max_model_len=2048)
    app = build_app(
        lambda: engine, served_model_name=MODEL, tool_call_parser="hermes", enable_auto_tool_choice=True
    )
    server = RunningServer(app)
    yield engine, server
    server.stop()
    wait_until(lambda: engine.stats().num_requests_running == 0, what="no request running")
    assert_engine_clean(engine.llm)
    engine.shutdown()


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=f"{served[1].url}/v1", api_key="unused", max_retries=0, timeout=300)


def summary(output: list) -> list[tuple]:
    """Each output item without its ids: what streamed and whole responses must agree on."""
    return [
        (i.type, i.status, i.content[0].text)
        if i.type == "message"
        else (i.type, i.status, i.name, i.arguments)
        for i in output
    ]


def tokenize_count(served, body: dict) -> int:
    return httpx.post(f"{served[1].url}/tokenize", json=body, timeout=60).json()["count"]


def test_responses_text_answers_like_chat_completions(client):
    reply = client.responses.create(
        model=MODEL, input="What is the capital of France?", max_output_tokens=30, temperature=0
    )
    assert reply.status == "completed" and "Paris" in reply.output_text
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=30,
        temperature=0,
    )
    assert reply.output_text == chat.choices[0].message.content
    assert reply.usage.output_tokens == chat.usage.completion_tokens


def test_responses_tool_loop_call_result_answer(served, client):
    first = client.responses.create(
        model=MODEL, input=QUESTION, tools=[TOOL], tool_choice="required", parallel_tool_calls=False,
        max_output_tokens=60, temperature=0,
    )  # fmt: skip
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    arguments = json.loads(call.arguments)
    jsonschema.validate(arguments, WEATHER)
    result = json.dumps(get_weather(**arguments))
    history = [
        {"role": "user", "content": QUESTION},
        *[item.model_dump(exclude_none=True) for item in first.output],  # the output items, sent back
        {"type": "function_call_output", "call_id": call.call_id, "output": result},
    ]
    final = client.responses.create(
        model=MODEL, input=history, tools=[TOOL], tool_choice="none", max_output_tokens=40, temperature=0
    )
    assert [item.type for item in final.output] == ["message"] and final.output_text.strip()
    chat = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": call.call_id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }]},
        {"role": "tool", "tool_call_id": call.call_id, "content": result},
    ]  # fmt: skip
    # the model read the call and its result: the same tokens as that chat
    assert final.usage.input_tokens == tokenize_count(served, {"messages": chat, "tools": [CHAT_TOOL]})


@pytest.mark.parametrize(
    "options",
    [
        {"input": "Say hello to the reader in one sentence."},
        {"input": QUESTION, "tools": [TOOL], "tool_choice": "required", "parallel_tool_calls": False},
        {"input": QUESTION, "tools": [TOOL]},  # auto: the hermes parser reads the output
    ],
)
def test_responses_stream_helper_gets_the_same_response(client, options):
    options = {"model": MODEL, "max_output_tokens": 80, "temperature": 0, **options}
    whole = client.responses.create(**options)
    with client.responses.stream(**options) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert summary(final.output) == summary(whole.output)
    texts = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert texts == final.output_text
    assert arguments == "".join(i.arguments for i in final.output if i.type == "function_call")
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert (
        kinds.count("response.output_item.added")
        == kinds.count("response.output_item.done")
        == len(final.output)
    )


def test_responses_parse_with_a_pydantic_model(client):
    reply = client.responses.parse(
        model=MODEL, input="Name a city in France.", text_format=City, max_output_tokens=60, temperature=0
    )
    assert isinstance(reply.output_parsed, City) and reply.output_parsed.name
    assert reply.text.format.type == "json_schema"


def test_chat_completions_parse_with_a_pydantic_model(client):
    reply = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a city in Italy."}],
        response_format=City,
        max_tokens=60,
        temperature=0,
    )
    parsed = reply.choices[0].message.parsed
    assert isinstance(parsed, City) and parsed.name and reply.choices[0].finish_reason == "stop"


def test_chat_tool_loop_with_required_tool_choice(client):
    messages: list[dict] = [{"role": "user", "content": QUESTION}]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=[CHAT_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=60,
        temperature=0,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    messages.append(choice.message.model_dump(exclude_none=True))
    for call in choice.message.tool_calls:
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, WEATHER)
        messages.append(
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps(get_weather(**arguments))}
        )
    final = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[CHAT_TOOL], tool_choice="none", max_tokens=40, temperature=0
    )
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls


def test_openai_agents_sdk_runs_text_tools_and_streaming_on_the_responses_api(served):
    """The OpenAI Agents SDK's default model class (OpenAIResponsesModel) pointed at this server: a text
    answer, a tool loop (the SDK runs the forced call, sends its output, then asks with tool_choice
    unset: "auto", read by the hermes parser) and a streamed run."""
    set_tracing_disabled(True)  # no export of traces to OpenAI's platform
    cities: list[str] = []

    @function_tool
    def weather(city: str) -> str:
        """Get the current weather in a city."""
        cities.append(city)
        return json.dumps(get_weather(city))

    async def run() -> tuple:
        client = openai.AsyncOpenAI(base_url=f"{served[1].url}/v1", api_key="unused", max_retries=0)
        model = OpenAIResponsesModel(model=MODEL, openai_client=client)
        settings = ModelSettings(temperature=0, max_tokens=60)
        plain = Agent(name="plain", instructions="You are helpful.", model=model, model_settings=settings)
        text = await Runner.run(plain, "What is the capital of France?")
        forced = ModelSettings(
            temperature=0, max_tokens=60, tool_choice="required", parallel_tool_calls=False
        )
        agent = Agent(
            name="tools", instructions="Use tools.", model=model, tools=[weather], model_settings=forced
        )
        tools = await Runner.run(agent, QUESTION, max_turns=4)
        streamed = Runner.run_streamed(plain, "What is the capital of France?")
        kinds = [event.type async for event in streamed.stream_events()]
        return text, tools, streamed, kinds

    text, tools, streamed, kinds = asyncio.run(run())
    assert "Paris" in text.final_output
    assert len(cities) == 1 and cities[0]
    item_types = [item.type for item in tools.new_items]
    assert item_types == ["tool_call_item", "tool_call_output_item", "message_output_item"]
    assert tools.final_output
    assert streamed.final_output == text.final_output and "raw_response_event" in kinds
