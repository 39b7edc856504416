"""/v1/responses through the real `openai` client on a real server over a tiny random Llama (the default
model's tokenizer and chat template): the Response's shape, the input items' translation into the chat
prompt (token counts equal /tokenize's for the same chat), the stream's events, and every refusal of a
stateless, text-only server. Generation quality is test_server_clients.py's business (default model)."""

from __future__ import annotations

import httpx
import openai
import pytest

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": False,
}
BAD_FORMAT = {"type": "json_schema", "name": "x", "schema": {"type": "objectx"}}
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": '{"sky": "clear"}'},
]
CHAT_HISTORY = [
    {"role": "system", "content": "Answer in French."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear"}'},
]


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=f"{served[1].url}/v1", api_key="unused", max_retries=0, timeout=120)


def tokenize_count(served, body: dict) -> int:
    return httpx.post(f"{served[1].url}/tokenize", json=body, timeout=60).json()["count"]


def test_a_text_response_has_openais_shape_and_counts_the_chat_tokens(served, client):
    reply = client.responses.create(
        model="tiny", input="Say hi", instructions="Be brief.", max_output_tokens=4, temperature=0,
        metadata={"trace": "t1"},
    )  # fmt: skip
    assert reply.id.startswith("resp_") and reply.object == "response" and reply.model == "tiny"
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    (message,) = reply.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert reply.output_text == message.content[0].text and reply.usage.output_tokens == 4
    assert reply.store is False and reply.metadata == {"trace": "t1"} and reply.instructions == "Be brief."
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}]
    assert reply.usage.input_tokens == tokenize_count(served, {"messages": chat})
    assert reply.usage.total_tokens == reply.usage.input_tokens + 4
    completion = client.chat.completions.create(model="tiny", messages=chat, max_tokens=4, temperature=0)
    assert reply.output_text == completion.choices[0].message.content  # the same path, greedy


def test_function_call_items_become_the_chat_turns_they_stand_for(served, client):
    reply = client.responses.create(
        model="tiny", input=[{"role": "developer", "content": "Answer in French."}, *HISTORY],
        tools=[TOOL], tool_choice="none", max_output_tokens=2, temperature=0,
    )  # fmt: skip
    tools = [{"type": "function", "function": {k: TOOL[k] for k in ("name", "description", "parameters")}}]
    assert reply.usage.input_tokens == tokenize_count(served, {"messages": CHAT_HISTORY, "tools": tools})
    assert reply.tools[0].name == "get_weather" and reply.tool_choice == "none"
    parts = [
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "Say "}, {"type": "input_text", "text": "hi"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},  # skipped
    ]  # fmt: skip
    split = client.responses.create(model="tiny", input=parts, max_output_tokens=1)
    assert split.usage.input_tokens == tokenize_count(
        served, {"messages": [{"role": "user", "content": "Say hi"}]}
    )


def test_the_stream_is_openais_event_sequence_and_adds_up_to_the_response(client):
    options = dict(model="tiny", input="Say hi", max_output_tokens=6, temperature=0)
    whole = client.responses.create(**options)
    events = list(client.responses.create(**options, stream=True))
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",  # max_output_tokens reached, as OpenAI says it
    ]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert deltas == final.output_text == whole.output_text
    assert events[2].item.id == final.output[0].id and events[0].response.id == final.id


@pytest.mark.parametrize(
    ("extra", "param", "needle"),
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id", "stateless"),
        ({"background": True}, "background", "stored responses"),
        ({"truncation": "auto"}, "truncation", "disabled"),
        ({"include": ["message.output_text.logprobs"]}, "include", "logprobs"),
        ({"conversation": "conv_1"}, "conversation", "input"),
    ],
)
def test_stateful_and_unsupported_features_get_a_400_that_says_what_to_send(client, extra, param, needle):
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="tiny", input="hi", max_output_tokens=2, **extra)
    error = raised.value.body
    assert error["param"] == param and needle in error["message"]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "text only"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "'item_reference' are not supported"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "only function tools"),
        ({"input": "hi", "tools": [TOOL], "tool_choice": {"type": "function", "name": "nope"}}, "nope"),
        ({"input": "hi", "tools": [TOOL], "tool_choice": "auto"}, "--enable-auto-tool-choice"),
        ({"input": []}, "no messages"),
        ({"input": "hi", "max_output_tokens": 600}, "max_output_tokens is too large: 600"),
        ({"input": "hi", "text": {"format": BAD_FORMAT}}, "objectx"),
    ],
)  # fmt: skip
def test_bad_input_gets_a_400_that_names_the_problem(served, body, needle):
    resp = httpx.post(f"{served[1].url}/v1/responses", json={"model": "tiny", **body}, timeout=60)
    assert resp.status_code == 400, resp.text
    assert needle in resp.json()["error"]["message"]


def test_a_response_is_never_stored(client):
    reply = client.responses.create(model="tiny", input="hi", max_output_tokens=1, store=True)
    assert reply.store is False
    with pytest.raises(openai.NotFoundError, match="stores no responses"):
        client.responses.retrieve(reply.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(reply.id)
