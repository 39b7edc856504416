"""Structured outputs and tool calling through the real `openai` client against `python app.py serve` on
the default model (SmolLM2-135M), one server for the module. The KV pool is kept small (64 blocks) so
that the 50 concurrent schema-constrained requests preempt each other: the grammars must survive
recompute. Every output must validate; the pool must be empty after."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys

import httpx
import jsonschema
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backend.server.tools_demo import SAMPLE_SCHEMAS
from tests.common_utils import ROOT, free_port, stop_process
from tests.server_utils import wait_until

pytestmark = pytest.mark.slow
MODEL = "smol"
PERSON = SAMPLE_SCHEMAS["person"]
WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
CONVERT_PARAMS = {
    "type": "object",
    "properties": {
        "value": {"type": "number"},
        "from_unit": {"type": "string", "enum": ["km", "mi", "kg", "lb"]},
        "to_unit": {"type": "string", "enum": ["km", "mi", "kg", "lb"]},
    },
    "required": ["value", "from_unit", "to_unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "convert_units", "parameters": CONVERT_PARAMS}},
]
SCHEMAS = {"get_weather": WEATHER_PARAMS, "convert_units": CONVERT_PARAMS}
BAD_SCHEMA = {"type": "objectx"}
COLOURS = ["red", "green", "blue"]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
ASK = [{"role": "user", "content": "What is the weather in Paris? Also convert 3 km to miles."}]


@pytest.fixture(scope="module")
def server():
    port = free_port()
    argv = [sys.executable, "app.py", "serve", "--port", str(port), "--served-model-name", MODEL]
    argv += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--disable-uvicorn-access-log"]
    argv += ["--max-model-len", "1024", "--num-kv-blocks", "64", "--max-num-seqs", "64"]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert proc.poll() is None, "the server exited"
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy, timeout_s=300, what="python app.py serve to load the default model")
        yield url
    finally:
        stop_process(proc)


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=300)


def metrics(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def check_call(call) -> dict:
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
    return arguments


def test_fifty_json_schema_requests_all_validate_even_when_preempted(server):
    async def one(client, i):
        return await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Describe fictional person number {i} as JSON."}],
            max_tokens=200,
            temperature=0.8,
            seed=i,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
        )

    async def run():
        async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="unused", timeout=600) as client:
            return await asyncio.gather(*(one(client, i) for i in range(50)))

    before = metrics(server).get("vllm:num_preemptions_total", 0.0)
    replies = asyncio.run(run())
    for reply in replies:
        # the grammar completed the object
        assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
        jsonschema.validate(json.loads(reply.choices[0].message.content), PERSON)
    assert len({r.choices[0].message.content for r in replies}) > 1
    assert metrics(server)["vllm:num_preemptions_total"] > before  # recompute happened under grammars


def test_regex_choice_grammar_and_json_object_always_match(client):
    pattern = r"[A-Z][a-z]{2,8}-[0-9]{3}"
    for seed in range(6):
        out = client.completions.create(
            model=MODEL, prompt="A product code:", max_tokens=20, temperature=1.0, seed=seed,
            extra_body={"structured_outputs": {"regex": pattern}},
        )  # fmt: skip
        assert re.fullmatch(pattern, out.choices[0].text) and out.choices[0].finish_reason == "stop"
        chat = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Pick a colour."}], max_tokens=8,
            temperature=1.0, seed=seed, extra_body={"structured_outputs": {"choice": COLOURS}},
        )  # fmt: skip
        assert chat.choices[0].message.content in COLOURS
    batch = client.completions.create(  # a batch of prompts, n samples each: every choice constrained
        model=MODEL, prompt=["A product code:", "Another code:", "Code"], n=2, max_tokens=20,
        temperature=1.0, seed=7, extra_body={"structured_outputs": {"regex": pattern}},
    )  # fmt: skip
    assert [c.index for c in batch.choices] == list(range(6))
    assert all(re.fullmatch(pattern, c.text) and c.finish_reason == "stop" for c in batch.choices)
    grammar = 'root ::= "The answer is " ("yes" | "no") "."'
    out = client.completions.create(
        model=MODEL,
        prompt="Is the sky blue?",
        max_tokens=12,
        extra_body={"structured_outputs": {"grammar": grammar}},
    )
    assert out.choices[0].text in ("The answer is yes.", "The answer is no.")
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Give me a JSON object about cats."}],
        max_tokens=120, temperature=0, response_format={"type": "json_object"},
    )  # fmt: skip
    if chat.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(chat.choices[0].message.content), dict)
    else:  # cut by max_tokens: still a prefix of an object
        assert chat.choices[0].message.content.lstrip().startswith("{")


def test_required_and_named_tool_choice_always_parse(client):
    for seed in range(4):
        reply = client.chat.completions.create(
            model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
            max_tokens=80, temperature=0.8, seed=seed,
        )  # fmt: skip
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
        check_call(choice.message.tool_calls[0])
    for name in ("get_weather", "convert_units"):
        reply = client.chat.completions.create(
            model=MODEL, messages=ASK, tools=TOOLS, max_tokens=80, temperature=0.5, seed=1,
            tool_choice={"type": "function", "function": {"name": name}},
        )  # fmt: skip
        (call,) = reply.choices[0].message.tool_calls
        assert call.function.name == name and reply.choices[0].finish_reason == "tool_calls"
        check_call(call)


@pytest.mark.parametrize("tool_choice", ["required", NAMED])
def test_streamed_tool_call_deltas_reassemble_to_the_same_call(client, tool_choice):
    options = dict(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice=tool_choice, max_tokens=80, temperature=0
    )
    whole = client.chat.completions.create(**options, parallel_tool_calls=False).choices[0]
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(**options, parallel_tool_calls=False, stream=True):
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for delta in choice.delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": delta.id, "name": None, "arguments": ""})
            if delta.function.name:
                assert call["name"] is None  # the name comes once, in the call's first delta
                call["name"] = delta.function.name
            call["arguments"] += delta.function.arguments or ""
    (expected,) = whole.message.tool_calls
    assert finish == whole.finish_reason == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (expected.function.name, expected.function.arguments)
    ]
    assert calls[0]["id"].startswith("chatcmpl-tool-")


def test_auto_tool_choice_and_tool_results_round_trip(client):
    reply = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, max_tokens=40, temperature=0
    )
    message = reply.choices[0].message  # auto: parsed with the hermes parser, a call or plain content
    assert message.tool_calls or message.content
    for call in message.tool_calls or []:
        assert call.function.name in SCHEMAS
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18, "sky": "clear"}'},
    ]  # fmt: skip
    final = client.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, tool_choice="none", max_tokens=24, temperature=0
    )
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": BAD_SCHEMA}}}, "objectx"),
        ({"structured_outputs": {"regex": "[a-"}}, "regex"),
        ({"structured_outputs": {"choice": []}}, "choice"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "exactly one"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "nope"),
        ({"tool_choice": "required"}, "tools"),
    ],
)  # fmt: skip
def test_invalid_constraints_get_a_400_that_names_the_problem(server, body, needle):
    payload = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body}
    resp = httpx.post(f"{server}/v1/chat/completions", json=payload, timeout=60)
    assert resp.status_code == 400, resp.text
    assert needle in resp.json()["error"]["message"]


def test_zz_kv_blocks_are_all_free_after(server):
    wait_until(lambda: metrics(server)["vllm:num_requests_running"] == 0, what="no request running")
    parsed = metrics(server)
    assert parsed["playground:kv_cache_blocks_used"] == 0
    assert parsed["vllm:num_requests_waiting"] == 0
