"""No request can kill the engine: hostile input against a real `python app.py serve` subprocess (tiny
random model, real tokenizer), driven by the `openai` client and raw httpx. Each bad request gets its
4xx before any stream starts, a forced exception inside a step (test-only fault injection) fails only
its own request with 500, a burst beyond the waiting-queue limit gets 503s, and after each test the
server is healthy, serves the next request, and holds no KV blocks."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from backend.engine.fault_injection import ENV_VAR
from tests.server_utils import ServeProcess, long_context_tiny_model, wait_until

SAMPLE_FAULT, EXECUTE_FAULT = "FAULT-IN-SAMPLING", "FAULT-IN-FORWARD"
QUEUE_LIMIT = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    args = ["--model", long_context_tiny_model(), "--served-model-name", "tiny", "--max-num-seqs", "2"]
    args += ["--max-waiting-requests", str(QUEUE_LIMIT), "--num-kv-blocks", "1100", "--max-model-len", "8192"]
    args += ["--disable-uvicorn-access-log", "--max-waiting-per-client", "64"]  # the engine's queue first
    env = {ENV_VAR: f"sample:{SAMPLE_FAULT},execute:{EXECUTE_FAULT}"}
    proc = ServeProcess(log, *args, env=env)
    yield proc
    proc.stop()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(autouse=True)
def still_serving(server, client):
    """After every test: healthy, every block free, and the next request completes."""
    yield
    wait_until(lambda: server.metric("playground:kv_cache_blocks_used") == 0, what="all KV blocks freed")
    assert httpx.get(f"{server.url}/health").status_code == 200
    done = client.completions.create(
        model="tiny", prompt="next", max_tokens=4, extra_body={"ignore_eos": True}
    )
    assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 4


def post_raw(server, path: str, body: bytes) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    return httpx.post(f"{server.url}{path}", content=body, headers=headers, timeout=60)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b'{"prompt": "hi", "temperature": NaN}', "NaN and Infinity"),
        (b'{"prompt": "hi", "repetition_penalty": Infinity}', "NaN and Infinity"),
        (b'{"prompt": "hi", "extra": {"deep": [-Infinity]}}', "NaN and Infinity"),
        (b'{"prompt": "caf\\ud800e"}', "lone surrogate"),
        (b'{"prompt": "hi", "stop": ["\\udfff"]}', "lone surrogate"),
        (b'{"prompt": "hi", "seed": 18446744073709551616}', "seed"),
        (b'{"prompt": "hi", "seed": -9223372036854775809}', "seed"),
        (b'{"prompt": "hi", "logprobs": 21}', "logprobs"),
        (b'{"prompt": "hi", "top_p": 0}', "top_p"),
        (b'{"prompt": "hi", "max_tokens": 9000}', "maximum context length is 8192"),
        (b'{"prompt": [5, 99999999]}', "Prompt token ids must be integers"),
        (b'{"prompt": "hi", "stop_token_ids": [1.5]}', "stop_token_ids"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_out_of_domain_values_get_400_before_any_stream(server, body, words, stream):
    data = body[:-1] + (b', "stream": true}' if stream else b"}")
    resp = post_raw(server, "/v1/completions", data)
    assert resp.status_code == 400, resp.text
    assert resp.headers["content-type"].startswith("application/json")  # not an event stream
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and words in error["message"], error


def test_lone_surrogate_in_a_chat_message_gets_400(server):
    body = b'{"messages": [{"role": "user", "content": "hi \\ud83d there"}], "max_tokens": 3}'
    resp = post_raw(server, "/v1/chat/completions", body)
    assert resp.status_code == 400 and "lone surrogate" in resp.json()["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_100k_stop_strings_get_400_with_the_limit(client, stream):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(
            model="tiny", prompt="hi", stop=[f"s{i}" for i in range(100_000)], stream=stream
        )
    assert info.value.status_code == 400 and "at most 64 strings, got 100000" in info.value.message


def test_out_of_range_seed_via_the_openai_client_gets_400(client):
    with pytest.raises(openai.BadRequestError, match="seed"):
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], seed=2**64, stream=True
        )


def test_a_forced_failure_while_sampling_fails_only_that_request(server, client):
    """The faulty request runs in the same batches as a healthy stream, which completes unharmed."""

    async def main():
        aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        healthy = await aclient.completions.create(
            model="tiny",
            prompt="a healthy prompt",
            max_tokens=300,
            extra_body={"ignore_eos": True},
            stream=True,
        )
        first = await anext(aiter(healthy))  # it is running before the faulty one arrives
        with pytest.raises(openai.InternalServerError) as info:
            await aclient.completions.create(model="tiny", prompt=f"x {SAMPLE_FAULT} y", max_tokens=50)
        chunks = [first] + [chunk async for chunk in healthy]
        await aclient.close()
        return info.value, chunks

    error, chunks = asyncio.run(main())
    body = error.response.json()["error"]
    assert error.status_code == 500 and body["type"] == "server_error" and body["code"] == "engine_error"
    assert "InjectedFault" in body["message"] and "sampling failed" in body["message"]
    assert chunks[-1].choices[0].finish_reason == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_failure_in_the_forward_pass_fails_the_batch_not_the_engine(server, client, stream):
    prompt = f"x {EXECUTE_FAULT} y"
    if not stream:
        with pytest.raises(openai.InternalServerError, match="running the model failed"):
            client.completions.create(model="tiny", prompt=prompt, max_tokens=5)
        return
    with httpx.stream(
        "POST", f"{server.url}/v1/completions", json={"prompt": prompt, "stream": True}, timeout=60
    ) as resp:
        lines = [line for line in resp.iter_lines() if line]
    assert resp.status_code == 200  # the status line went out before the first step: the error is in-band
    error = json.loads(lines[-2].removeprefix("data: "))["error"]
    assert error["type"] == "server_error" and "running the model failed" in error["message"]
    assert lines[-1] == "data: [DONE]"


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_failure_fails_a_response_in_the_responses_api_shape(server, client, stream):
    if not stream:
        with pytest.raises(openai.InternalServerError, match="running the model failed"):
            client.responses.create(model="tiny", input=f"x {EXECUTE_FAULT} y", max_output_tokens=5)
        return
    events = list(client.responses.create(model="tiny", input=f"x {EXECUTE_FAULT} y", stream=True))
    assert [e.type for e in events] == ["response.created", "response.in_progress", "response.failed"]
    failed = events[-1].response
    assert failed.status == "failed" and "running the model failed" in failed.error.message


def test_a_burst_beyond_the_queue_limit_gets_503_at_once(server):
    """60 long streaming requests at once: 2 may run and QUEUE_LIMIT wait (requests accepted but not yet
    in the engine count too), the rest are refused at once. None can finish during the burst."""
    body = {"model": "tiny", "prompt": "burst", "max_tokens": 4000, "ignore_eos": True, "stream": True}

    async def main():
        async with httpx.AsyncClient(timeout=300) as http:
            requests = [
                http.build_request("POST", f"{server.url}/v1/completions", json=body) for _ in range(60)
            ]
            responses = await asyncio.gather(*(http.send(r, stream=True) for r in requests))
            refused = [
                (r.status_code, r.headers.get("Retry-After"), json.loads(await r.aread()))
                for r in responses
                if r.status_code != 200
            ]
            accepted = sum(r.status_code == 200 for r in responses)
            for r in responses:
                await r.aclose()  # the accepted streams are dropped: their requests are aborted
            return accepted, refused

    accepted, refused = asyncio.run(main())
    assert QUEUE_LIMIT <= accepted <= QUEUE_LIMIT + 2 and accepted + len(refused) == 60
    assert all(code == 503 and retry == "1" for code, retry, _ in refused)
    assert all(body["error"]["code"] == "queue_full" for _, _, body in refused)
