"""Security round three against a real server (uvicorn, real HTTP, tiny random model, real tokenizer): work
in proportion to the request and off the event loop, short error bodies, grammar and tool limits with
a bounded compile pool that the engine thread never uses, input limits before tokenizing, and each
client's share of the waiting queue. Each test failed on the code before the fix (docs/security.md)."""

from __future__ import annotations

import json
import threading

import httpx
import llguidance
import pytest

from backend.engine import structured_output
from backend.server import build_app
from backend.server.fairness import ClientLine, client_id
from backend.worker_pool import WorkerPool
from tests.server_utils import RunningServer, wait_until

MAX_BODY = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def server(engine):
    running = RunningServer(build_app(lambda: engine, served_model_name="tiny"))
    yield running
    running.stop()


@pytest.fixture(autouse=True)
def engine_is_clean(engine):
    yield
    wait_until(lambda: engine.stats().num_kv_blocks_used == 0, what="every KV block freed")


def post(url: str, body: bytes | dict, **kwargs) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **kwargs.pop("headers", {})}
    return httpx.post(url, content=content, headers=headers, timeout=120, **kwargs)


class HealthPoller:
    """/health polled in a thread while a request runs: the event loop must keep answering it."""

    def __init__(self, url: str) -> None:
        self.url, self.answers, self.stop = url, 0, threading.Event()
        self.thread = threading.Thread(target=self.poll, daemon=True)

    def poll(self) -> None:
        with httpx.Client(timeout=120) as http:
            while not self.stop.is_set():
                if http.get(f"{self.url}/health").status_code == 200:
                    self.answers += 1

    def __enter__(self) -> HealthPoller:
        self.thread.start()
        wait_until(lambda: self.answers > 0, what="/health to answer")
        self.answers = 0
        return self

    def __exit__(self, *_exc) -> None:
        self.stop.set()
        self.thread.join()


def long_key_body() -> bytes:
    """Just under 4 MiB: one 2 MiB key holding a list of a million zeros (the old walk copied the key
    into a path string for every element: 2 TB)."""
    key = "k" * (2 * 1024 * 1024)
    zeros = ",".join(["0"] * 950_000)
    body = f'{{"prompt": "hi", "max_tokens": 1, "{key}": [{zeros}]}}'.encode()
    assert len(body) < MAX_BODY
    return body


def test_a_long_key_over_a_long_list_is_answered_while_health_keeps_answering(server):
    with HealthPoller(server.url) as health:
        resp = post(f"{server.url}/v1/completions", long_key_body())
        answered_meanwhile = health.answers
    assert resp.status_code == 200, resp.text[:300]
    assert answered_meanwhile > 0  # the body was parsed off the event loop


def test_nan_deep_in_a_long_key_names_a_short_path(server):
    body = json.dumps({"prompt": "hi", "x" * 100_000: [0] * 1000 + [{"y": 1}]}).encode()
    resp = post(f"{server.url}/v1/completions", body.replace(b'"y": 1', b'"y": NaN'))
    assert resp.status_code == 400
    message = resp.json()["error"]["message"]
    assert "NaN and Infinity" in message and "[1000].y" in message and len(message) < 300


@pytest.mark.parametrize(
    ("field", "items"),
    [("stop_token_ids", '"x"'), ("stop", "1"), ("messages", '{"role": "robot"}'), ("prompt", "[1, 2]")],
)
def test_a_million_invalid_items_get_a_short_400(server, field, items):
    count = (MAX_BODY - 200) // (len(items) + 1)
    path = "/v1/chat/completions" if field == "messages" else "/v1/completions"
    body = {"messages": [{"role": "user", "content": "hi"}]} if path.endswith("chat/completions") else {}
    body = body if field == "messages" else {**body, "prompt": "hi"}
    raw = json.dumps(body)[:-1] + f', "{field}": [' + ",".join([items] * count) + "]}"
    if field == "prompt":  # a list of token-id lists, each one too short to be wrong: make the last bad
        raw = raw.replace("]]}", '], "x"]}')
    with HealthPoller(server.url) as health:
        resp = post(f"{server.url}{path}", raw.encode())
        answered_meanwhile = health.answers
    assert resp.status_code == 400, resp.text[:300]
    error = resp.json()["error"]
    assert len(resp.content) < 2000 and error["code"] == "invalid_value", resp.text[:500]
    assert field in error["message"]
    assert answered_meanwhile > 0


def test_several_invalid_fields_report_the_first_three_and_a_count(server):
    body = {"prompt": 5, "temperature": "hot", "top_p": 7, "n": "two", "stop": [1], "seed": "s"}
    error = post(f"{server.url}/v1/completions", body).json()["error"]
    assert error["message"].count(";") == 3 and "more errors" in error["message"], error["message"]


def test_an_error_message_quoting_the_request_is_cut_short(server):
    resp = post(f"{server.url}/v1/completions", {"model": "m" * 1_000_000, "prompt": "hi"})
    assert resp.status_code == 404 and len(resp.content) < 2500


@pytest.mark.parametrize(
    ("structured", "limit"),
    [
        ({"choice": [f"c{i}" for i in range(1001)]}, "max_choices"),
        ({"choice": ["x" * 60_000, "y" * 60_001]}, "max_choice_chars"),
        ({"regex": "a" * 9000}, "max_regex_chars"),
        ({"grammar": "start: " + " | ".join(f'"w{i}"' for i in range(12_000))}, "max_grammar_chars"),
        ({"json": {"type": "object", "description": "d" * 140_000}}, "max_schema_bytes"),
        ({"json": json.loads('{"items": ' * 40 + "{}" + "}" * 40)}, "max_schema_depth"),
    ],
)
def test_structured_outputs_over_a_limit_get_a_400_naming_it(server, structured, limit):
    body = {"prompt": "hi", "max_tokens": 2, "structured_outputs": structured}
    resp = post(f"{server.url}/v1/completions", body)
    assert resp.status_code == 400 and limit in resp.json()["error"]["message"], resp.text[:300]


def tool(name: str, parameters: dict | None = None) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters or {"type": "object"}}}


def test_tools_have_limits_of_their_own(server):
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "tool_choice": "required"}
    many = post(f"{server.url}/v1/chat/completions", {**chat, "tools": [tool(f"f{i}") for i in range(129)]})
    assert many.status_code == 400 and "tools has 129 items; the limit is 128" in many.text
    deep = json.loads('{"type": "object", "properties": {"a": ' * 20 + "{}" + "}}" * 20)
    nested = post(f"{server.url}/v1/chat/completions", {**chat, "tools": [tool("f", deep)]})
    assert nested.status_code == 400 and "max_schema_depth" in nested.json()["error"]["message"]


class ThreadSpy:
    """Stands in for llguidance.LLMatcher: records the thread of every compile, builds the real one."""

    def __init__(self) -> None:
        self.threads: list[str] = []
        self.real = llguidance.LLMatcher

    def __call__(self, *args, **kwargs):
        self.threads.append(threading.current_thread().name)
        return self.real(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.real, name)


def test_grammar_churn_never_compiles_on_the_engine_thread(server, engine, monkeypatch):
    """A one-entry cache and eight clients with distinct grammars at once: each request's grammar is
    evicted by the next before the engine adds it; the engine must use the one compiled for it."""
    spy = ThreadSpy()
    monkeypatch.setattr(structured_output.llguidance, "LLMatcher", spy)
    monkeypatch.setattr(structured_output, "CACHE_SIZE", 1)

    def one(i: int, results: list) -> None:
        body = {"prompt": "hi", "max_tokens": 3, "structured_outputs": {"regex": f"(ab|cd){{1,{i + 2}}}x"}}
        results.append(post(f"{server.url}/v1/completions", body).status_code)

    results: list[int] = []
    threads = [threading.Thread(target=one, args=(i, results)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [200] * 8
    assert len(spy.threads) >= 8 and not [t for t in spy.threads if t == "AsyncLLM-engine"], spy.threads


def test_a_full_grammar_pool_answers_503_and_a_slow_grammar_400(server, engine, monkeypatch):
    """The pool's one worker held by a stand-in for a slow compile: a grammar finds no room (503 with
    Retry-After); with room in the line but a compile over the time limit, a 400 that says so."""
    release = threading.Event()
    body = {"prompt": "hi", "max_tokens": 2, "structured_outputs": {"regex": "[a-z]{2,5}q"}}

    monkeypatch.setattr(engine, "grammar_pool", WorkerPool("grammar compiler", 1, 0))
    held = engine.grammar_pool.submit(release.wait, 60)
    try:
        full = post(f"{server.url}/v1/completions", body)
    finally:
        release.set()
        held.result()
    assert full.status_code == 503 and full.headers["Retry-After"] == "1"
    assert full.json()["error"]["code"] == "server_busy"

    never = threading.Event()  # a compile that would take 2 s, against a limit of 0.2 s
    monkeypatch.setattr(engine, "grammar_pool", WorkerPool("grammar compiler", 1, 1, timeout_s=0.2))
    monkeypatch.setattr(engine.engine.structured_output, "compile", lambda params: never.wait(2))
    slow = post(f"{server.url}/v1/completions", {**body, "structured_outputs": {"regex": "[a-z]{3}z"}})
    assert slow.status_code == 400 and "took longer than 0.2 s to compile" in slow.json()["error"]["message"]


def test_a_prompt_too_long_to_fit_is_refused_before_it_is_tokenized(server, engine, monkeypatch):
    calls: list[int] = []
    tokenize = engine.run_in_tokenizer

    async def counting(function, *args):
        calls.append(1)
        return await tokenize(function, *args)

    monkeypatch.setattr(engine, "run_in_tokenizer", counting)
    resp = post(f"{server.url}/v1/completions", {"prompt": "word " * 700_000, "max_tokens": 1})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == "context_length_exceeded" and "characters long" in error["message"]
    assert len(calls) <= 1  # at most the tokenizer's one-time measure of its longest token, never the text
    batch = {"prompt": ["word " * 2000] * 100, "max_tokens": 1}  # each fits; the batch as a whole does not
    resp = post(f"{server.url}/v1/completions", batch)
    assert resp.status_code == 400 and "characters long" in resp.json()["error"]["message"]
    assert len(calls) <= 1
    chat = {"messages": [{"role": "user", "content": "word "}] * 5000, "max_tokens": 1}
    resp = post(f"{server.url}/v1/chat/completions", chat)  # refused before validating 5,000 messages
    assert resp.status_code == 400 and "messages has 5,000 items; the limit is 4,096" in resp.text


def test_an_input_token_cap_applies_to_completions_and_chat(engine):
    capped = RunningServer(build_app(lambda: engine, max_input_tokens=32))
    try:
        long = post(f"{capped.url}/v1/completions", {"prompt": "one two three " * 20, "max_tokens": 1})
        assert long.status_code == 400 and "at most 32 input tokens" in long.json()["error"]["message"]
        ids = post(f"{capped.url}/v1/completions", {"prompt": list(range(5, 45)), "max_tokens": 1})
        assert ids.status_code == 400 and "40 tokens" in ids.json()["error"]["message"]
        chat = {"messages": [{"role": "user", "content": "hi " * 40}], "max_tokens": 1}
        assert post(f"{capped.url}/v1/chat/completions", chat).status_code == 400
        many = {"messages": [{"role": "user", "content": "hi"}] * 40, "max_tokens": 1}
        resp = post(f"{capped.url}/v1/chat/completions", many)
        assert resp.status_code == 400 and "40 messages cannot fit in 32 input tokens" in resp.text
        batch = {"prompt": [list(range(5, 25))] * 2, "max_tokens": 1}  # 20 tokens each, 40 together
        resp = post(f"{capped.url}/v1/completions", batch)
        assert resp.status_code == 400 and "40 tokens" in resp.json()["error"]["message"]
        text = "one two three " * 5
        each = len(engine.tokenizer(text)["input_ids"])
        assert each <= 32 < 3 * each  # each prompt fits the cap alone, the three together do not
        echo = {"prompt": [text] * 3, "max_tokens": 0, "echo": True, "logprobs": 1}
        resp = post(f"{capped.url}/v1/completions", echo)  # echo passes the same cap
        assert resp.status_code == 400 and "at most 32 input tokens" in resp.json()["error"]["message"]
        scored = {"prompt": "x " * 40, "max_tokens": 1, "prompt_logprobs": 1}
        assert post(f"{capped.url}/v1/completions", scored).status_code == 400
        response = post(f"{capped.url}/v1/responses", {"input": "hi " * 40, "max_output_tokens": 1})
        assert response.status_code == 400 and "at most 32 input tokens" in response.text
        counted = post(f"{capped.url}/tokenize", {"prompt": "hi " * 40})  # the same cap, the same words
        assert counted.status_code == 400 and "at most 32 input tokens" in counted.text
        assert post(f"{capped.url}/tokenize", {"prompt": "hi"}).json()["count"] >= 1
        assert post(f"{capped.url}/v1/completions", {"prompt": "hi", "max_tokens": 1}).status_code == 200
    finally:
        capped.stop()


def client_from(address: str) -> httpx.Client:
    """A client whose connections come from another loopback address: another client to the server."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=120)


def test_one_client_cannot_fill_the_waiting_queue(engine):
    """max_num_seqs=1 and a queue of 4; each client may have 2 waiting. The first client's stream runs,
    two more wait, its fourth is refused; a second client still gets in."""
    fair = RunningServer(build_app(lambda: engine, max_waiting_requests=4, clients=ClientLine(2)))
    body = {"prompt": "a b c", "max_tokens": 4000, "ignore_eos": True, "stream": True}
    url = f"{fair.url}/v1/completions"
    first, second = client_from("127.0.0.2"), client_from("127.0.0.3")
    try:
        with first.stream("POST", url, json=body) as running:
            lines = running.iter_lines()
            next(lines)  # it runs: no longer waiting
            with first.stream("POST", url, json=body) as w1, first.stream("POST", url, json=body) as w2:
                wait_until(lambda: engine.stats().num_requests_waiting == 2, what="two waiting requests")
                refused = first.post(url, json={"prompt": "hi", "max_tokens": 1})
                with second.stream("POST", url, json=body) as other:
                    assert other.status_code == 200  # another client still finds room
                assert w1.status_code == w2.status_code == 200
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        assert "Too many requests from this client" in refused.json()["error"]["message"]
    finally:
        first.close()
        second.close()
        fair.stop()


def test_a_batch_holds_one_waiting_place_per_prompt(engine):
    """max_num_seqs=1, each client may have 3 waiting: a batch of 4 prompts can never fit (400); a batch
    of 3 streams its first prompt and holds 2 places until the others start, so the same client's batch
    of 2 is refused (503) while another client's batch of 3 gets in; every place is given back."""
    line = ClientLine(3)
    fair = RunningServer(build_app(lambda: engine, max_waiting_requests=16, clients=line))
    body = {"prompt": ["a b c"] * 3, "max_tokens": 4000, "ignore_eos": True, "stream": True}
    url = f"{fair.url}/v1/completions"
    first, second = client_from("127.0.0.2"), client_from("127.0.0.3")
    try:
        too_many = first.post(url, json={"prompt": ["hi"] * 4, "max_tokens": 1})
        assert too_many.status_code == 400 and "send at most 3 prompts per request" in too_many.text
        with first.stream("POST", url, json=body) as running:
            lines = running.iter_lines()  # kept: a dropped iterator closes the stream
            next(lines)  # prompt 0 runs; prompts 1 and 2 wait behind it
            assert line.waiting("127.0.0.2") == 2
            refused = first.post(url, json={"prompt": ["hi"] * 2, "max_tokens": 1})
            assert refused.status_code == 503 and "this request's 2 prompts" in refused.text
            with second.stream("POST", url, json=body) as other:
                assert other.status_code == 200
                assert line.waiting("127.0.0.3") == 3
        wait_until(lambda: line.waiting("127.0.0.2") + line.waiting("127.0.0.3") == 0, what="places back")
    finally:
        first.close()
        second.close()
        fair.stop()


def test_the_client_behind_trusted_proxies_is_the_address_they_wrote():
    headers = {"x-forwarded-for": "6.6.6.6, 1.2.3.4"}  # the client wrote 6.6.6.6; our proxy added 1.2.3.4
    assert client_id("10.0.0.1", headers, 0) == "10.0.0.1"  # no trusted proxy: the peer
    assert client_id("10.0.0.1", headers, 1) == "1.2.3.4"
    assert client_id("10.0.0.1", {}, 1) == "10.0.0.1"  # no header: the peer
