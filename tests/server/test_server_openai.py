"""The OpenAI-compatible server on the default model (SmolLM2-135M), driven by the real `openai` client
over HTTP on a free 127.0.0.1 port. One engine and one server for the whole module."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backend.default_model import default_model
from backend.server import build_app
from tests.server_utils import RunningServer, scrape, start_engine, wait_until

pytestmark = pytest.mark.slow
MODEL = "smol"
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


@pytest.fixture(scope="module")
def served():
    engine = start_engine(default_model(check_hub=False), max_num_seqs=64, max_model_len=1024)
    server = RunningServer(build_app(lambda: engine, served_model_name=MODEL))
    yield engine, server
    server.stop()
    engine.shutdown()


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=f"{served[1].url}/v1", api_key="unused", max_retries=0)


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample of a /metrics text, parsed by prometheus_client: (name, sorted labels) -> value."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def metric(parsed: dict, name: str, **labels) -> float:
    want = tuple(sorted({"model_name": MODEL, **labels}.items()))
    return parsed.get((name, want), 0.0)


def idle(engine) -> bool:
    stats = engine.stats()
    return stats.num_requests_running == 0 and stats.num_requests_waiting == 0


def test_models_lists_the_served_name(client, served):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].model_extra["max_model_len"] == served[0].max_model_len == 1024


def test_chat_usage_counts_the_tokens_sent_and_received(client, served):
    tokenizer = served[0].tokenizer
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    expected_prompt = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    reply = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0, logprobs=True, top_logprobs=3
    )
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and choice.message.role == "assistant"
    assert "Paris" in choice.message.content
    received = choice.logprobs.content
    assert reply.usage.prompt_tokens == expected_prompt
    assert reply.usage.completion_tokens == len(received) <= 12
    assert reply.usage.total_tokens == expected_prompt + len(received)
    # the stop token (EOS) counts as a completion token, as in vLLM, but is not part of the text
    assert "".join(t.token for t in received).startswith(choice.message.content)
    for token in received:
        assert len(token.top_logprobs) == 3
        assert token.top_logprobs[0].logprob >= token.top_logprobs[-1].logprob
        assert token.logprob <= 0


def test_chat_streaming_matches_non_streaming(client):
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16, temperature=0)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == plain.choices[0].message.content
    assert finish == [plain.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == plain.usage.model_dump()
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_streaming_and_not_with_ignore_eos(client, served):
    prompt = "The three primary colours are"
    expected_prompt = len(served[0].tokenizer(prompt)["input_ids"])
    extra = {"ignore_eos": True}
    plain = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=20, temperature=0, logprobs=0, extra_body=extra
    )
    assert plain.choices[0].finish_reason == "length"
    assert plain.usage.completion_tokens == 20 == len(plain.choices[0].logprobs.tokens)
    assert plain.usage.prompt_tokens == expected_prompt
    stream = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=20,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    assert chunks[-1].usage.completion_tokens == 20 and chunks[-1].usage.prompt_tokens == expected_prompt


def test_token_id_prompt_and_stop_string(client, served):
    ids = served[0].tokenizer("Count: one, two, three,")["input_ids"]
    reply = client.completions.create(model=MODEL, prompt=ids, max_tokens=30, temperature=0, stop=[","])
    assert reply.usage.prompt_tokens == len(ids)
    assert reply.choices[0].finish_reason == "stop" and "," not in reply.choices[0].text


def test_64_concurrent_streams_complete_and_free_every_block(served):
    engine, server = served
    aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)

    async def one(i: int) -> tuple[str, int, int]:
        stream = await aclient.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Tell me fact number {i} about the sea."}],
            max_tokens=8 + i % 8,
            temperature=0.7,
            seed=i,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        text, finish, usage = "", None, None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
            usage = chunk.usage or usage
        return finish, usage.completion_tokens, i

    async def all_of_them():
        async with aclient:
            return await asyncio.gather(*(one(i) for i in range(64)))

    results = asyncio.run(all_of_them())
    assert [(finish, tokens) for finish, tokens, i in results] == [("length", 8 + i % 8) for i in range(64)]
    wait_until(lambda: idle(engine), what="the engine to go idle")
    stats = engine.stats()
    assert stats.num_kv_blocks_used == 0 and stats.block_owners == {}
    assert metric(samples(scrape(server.url)), "playground:kv_cache_blocks_used") == 0


def test_client_dropping_mid_stream_frees_its_blocks(served):
    engine, server = served
    before = metric(samples(scrape(server.url)), "vllm:request_success_total", finished_reason="abort")
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 900, "stream": True, "ignore_eos": True}
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", f"{server.url}/v1/chat/completions", json=body) as r,
    ):
        lines = r.iter_lines()
        chunks = [next(lines) for _ in range(6)]  # data lines and blank separators
        assert any(line.startswith("data: ") for line in chunks)
        assert engine.stats().num_kv_blocks_used > 0
    # the connection is closed here, mid-stream
    wait_until(lambda: engine.stats().num_kv_blocks_used == 0, what="the dropped request's blocks")
    after = metric(samples(scrape(server.url)), "vllm:request_success_total", finished_reason="abort")
    assert after == before + 1
    assert engine.stats().generation_tokens_total > 0


def test_client_dropping_a_non_streaming_request_frees_its_blocks(served):
    engine, server = served
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 900, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=httpx.Timeout(30, read=1.0))
    wait_until(lambda: idle(engine) and engine.stats().num_kv_blocks_used == 0, what="the abort")


def test_logit_bias_steers_chat_and_completions_as_openai_defines_it(client, served):
    """logit_bias through the openai client (JSON keys are token ids as strings): a ban on the greedy reply's
    first token changes it and the new first token is the raw model's second choice; +100 on a token makes
    every generated token that one; a bias beyond 100 is clamped (vLLM), an unknown token id is a 400."""
    plain = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=1, temperature=0, logprobs=True, top_logprobs=2
    )
    first, second = plain.choices[0].logprobs.content[0].top_logprobs
    tokenizer = served[0].tokenizer
    first_id = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(first.token))[0]
    banned = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=1, temperature=0, logit_bias={str(first_id): -100}
    )
    assert plain.choices[0].message.content == first.token
    assert banned.choices[0].message.content == second.token != first.token
    comma = tokenizer.convert_tokens_to_ids(",")
    forced = client.completions.create(
        model=MODEL, prompt="Count:", max_tokens=6, temperature=0, logit_bias={str(comma): 150}
    )
    assert forced.choices[0].text == "," * 6
    with pytest.raises(openai.BadRequestError, match="logit_bias token id 99999999 is out of vocabulary"):
        client.completions.create(model=MODEL, prompt="Count:", max_tokens=2, logit_bias={"99999999": 1})
    assert idle(served[0]) and served[0].stats().num_kv_blocks_used == 0


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"messages": [{"role": "user", "content": "hi " * 1100}]}, 400, ["1024", "input tokens"]),
        ({"messages": MESSAGES, "max_tokens": -5}, 400, ["max_tokens", "greater than or equal to 1"]),
        ({"messages": MESSAGES, "max_completion_tokens": 2000}, 400, ["1024", "2000"]),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, ["role", "wizard"]),
        ({"messages": MESSAGES, "temperature": 7}, 400, ["temperature", "less than or equal to 2"]),
        ({"messages": MESSAGES, "n": 129}, 400, ["n", "less than or equal to 128"]),
        ({"messages": MESSAGES, "model": "gpt-9"}, 404, ["gpt-9", "does not exist", MODEL]),
        ({"messages": []}, 400, ["messages"]),
    ],
)
def test_invalid_requests_get_openai_errors(client, served, body, status, words):
    body = {"model": MODEL, **body}
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(**body)
    error = caught.value
    assert error.status_code == status
    assert set(error.body) >= {"message", "type", "param", "code"}
    for word in words:
        assert word in error.body["message"]
    assert idle(served[0]) and served[0].stats().num_kv_blocks_used == 0


def test_malformed_json_and_prompt_too_long_on_completions(served):
    url = served[1].url
    resp = httpx.post(
        f"{url}/v1/chat/completions",
        content=b'{"model": "smol", "messages": [',
        headers={"content-type": "application/json"},
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["message"].startswith("Malformed JSON body")
    ids = list(range(100, 1100))
    resp = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": ids, "max_tokens": 50})
    assert resp.status_code == 400
    message = resp.json()["error"]["message"]
    assert "1024" in message and "1000" in message and "50" in message


def test_metrics_counters_move_by_exactly_the_tokens_served(client, served):
    engine, server = served
    wait_until(lambda: idle(engine), what="the engine to go idle")
    before = samples(scrape(server.url))
    usages = []
    for question in ("Name a fruit.", "Name a colour.", "Name a planet."):
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=10, temperature=0
        )
        usages.append(reply.usage)
    stream = client.completions.create(
        model=MODEL,
        prompt="Hello",
        max_tokens=7,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    usages.append([c for c in stream][-1].usage)
    after = samples(scrape(server.url))

    def delta(name: str, **labels) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("vllm:prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert delta("vllm:generation_tokens_total") == sum(u.completion_tokens for u in usages)
    finished = delta("vllm:request_success_total", finished_reason="stop")
    finished += delta("vllm:request_success_total", finished_reason="length")
    assert finished == 4
    assert delta("vllm:time_to_first_token_seconds_count") == 4
    assert delta("vllm:e2e_request_latency_seconds_count") == 4
    assert delta("vllm:inter_token_latency_seconds_count") == sum(u.completion_tokens - 1 for u in usages)
    assert delta("vllm:request_generation_tokens_sum") == sum(u.completion_tokens for u in usages)
    assert metric(after, "vllm:num_requests_running") == 0
    assert metric(after, "vllm:kv_cache_usage_perc") == 0
    stats = engine.stats()
    assert metric(after, "playground:kv_cache_blocks_total") == stats.num_kv_blocks_total
    info = [k for k in after if k[0] == "vllm:cache_config_info"]
    assert info and dict(info[0][1])["num_gpu_blocks"] == str(stats.num_kv_blocks_total)
    assert json.loads(json.dumps(stats.to_dict()))  # the stats behind the gauges are plain JSON
