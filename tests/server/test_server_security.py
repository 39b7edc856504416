"""Security and overload behaviour of the server, on a tiny random-weight model (fast to load): API key,
body-size limit, waiting-queue limit, no engine, loopback by default, no prompts in the logs."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import openai
import pytest

from app import build_parser
from backend.server import build_app
from backend.server.fairness import ClientLine
from tests.common_utils import ROOT, stop_process
from tests.engine_utils import tiny_model
from tests.server_utils import RunningServer, wait_until

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def keyed(engine):
    server = RunningServer(
        build_app(lambda: engine, served_model_name="tiny", api_key=KEY, max_body_bytes=2048)
    )
    yield server
    server.stop()


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/models", None),
        ("POST", "/v1/chat/completions", CHAT),
        ("POST", "/v1/completions", {"model": "tiny", "prompt": "hi"}),
        ("GET", "/metrics", None),
        ("POST", "/v1/responses", {"model": "tiny", "input": "hi", "max_output_tokens": 3}),
        ("POST", "/tokenize", {"model": "tiny", "prompt": "hi"}),
        ("POST", "/detokenize", {"model": "tiny", "tokens": [1, 2]}),
        ("GET", "/tokenizer_info", None),
        ("GET", "/version", None),
    ],
)
def test_every_endpoint_but_health_needs_the_key(keyed, method, path, body):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        resp = httpx.request(method, f"{keyed.url}{path}", json=body, headers=headers)
        assert resp.status_code == 401, headers
        error = resp.json()["error"]
        assert error["code"] == "invalid_api_key" and "Bearer" in error["message"]
    resp = httpx.request(method, f"{keyed.url}{path}", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert resp.status_code == 200
    assert httpx.get(f"{keyed.url}/health").status_code == 200


def test_the_openai_client_works_with_the_key(keyed):
    good = openai.OpenAI(base_url=f"{keyed.url}/v1", api_key=KEY, max_retries=0)
    assert good.chat.completions.create(**CHAT).usage.completion_tokens >= 1
    bad = openai.OpenAI(base_url=f"{keyed.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_oversized_bodies_get_413_with_or_without_content_length(keyed):
    auth = {"Authorization": f"Bearer {KEY}"}
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
    resp = httpx.post(f"{keyed.url}/v1/chat/completions", json=big, headers=auth)
    assert resp.status_code == 413
    assert "2048" in resp.json()["error"]["message"]

    def chunked():  # no Content-Length: the limit is enforced while reading
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(10):
            yield b"y" * 500
        yield b'"}'

    resp = httpx.post(f"{keyed.url}/v1/completions", content=chunked(), headers=auth)
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "request_too_large"


def test_full_waiting_queue_gets_503_with_retry_after(engine):
    # each client's share (fairness.py) set above the queue: this test fills the engine's own queue
    server = RunningServer(build_app(lambda: engine, max_waiting_requests=1, clients=ClientLine(8)))
    body = {"prompt": "a b c", "max_tokens": 8000, "ignore_eos": True, "stream": True}
    try:
        with httpx.Client(timeout=60) as http:
            with http.stream("POST", f"{server.url}/v1/completions", json=body) as running:
                lines = running.iter_lines()  # kept: dropping the iterator would close the stream
                next(lines)  # max_num_seqs=1: this one runs ...
                with http.stream("POST", f"{server.url}/v1/completions", json=body) as waiting:
                    wait_until(lambda: engine.stats().num_requests_waiting == 1, what="a waiting request")
                    refused = http.post(f"{server.url}/v1/completions", json={"prompt": "hi"})
                    assert waiting.status_code == 200
            assert refused.status_code == 503
            assert refused.headers["Retry-After"] == "1"
            assert (
                refused.json()["error"]["code"] == "queue_full"
                and "limit is 1" in refused.json()["error"]["message"]
            )
        wait_until(lambda: engine.stats().num_kv_blocks_used == 0, what="both dropped streams to be freed")
    finally:
        server.stop()


def test_no_engine_means_503_and_unhealthy():
    server = RunningServer(build_app(lambda: None))
    try:
        assert httpx.get(f"{server.url}/health").status_code == 503
        resp = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT)
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "engine_not_running"
        assert "Retry-After" in resp.headers
        assert httpx.get(f"{server.url}/metrics").status_code == 200
    finally:
        server.stop()


def test_serve_binds_loopback_by_default():
    args = build_parser().parse_args(["serve"])
    assert args.host == "127.0.0.1" and args.port == 8000 and args.enable_prefix_caching


def test_serve_command_prints_its_address_needs_the_key_and_logs_no_prompt(tmp_path):
    """`python app.py serve` in a subprocess at the default log level (info, with access logs)."""
    env = {**os.environ, "PLAYGROUND_TEST_KEY": KEY, "PYTHONUNBUFFERED": "1"}
    command = [
        sys.executable,
        "app.py",
        "serve",
        "--model",
        tiny_model("llama")[0],
        "--port",
        "0",
        "--api-key-env",
        "PLAYGROUND_TEST_KEY",
        "--served-model-name",
        "tiny",
        "--num-kv-blocks",
        "32",
    ]
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(
            lambda: "Serving tiny at http://127.0.0.1:" in log.read_text() or proc.poll() is not None,
            timeout_s=120,
            what="the server to print its address",
        )
        line = next(x for x in log.read_text().splitlines() if x.startswith("Serving tiny at "))
        url = line.split(" at ")[1].split("/v1")[0]
        marker = "PURPLE-ELEPHANT-1234"
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": marker}], max_tokens=2
        )
        assert httpx.get(f"{url}/v1/models").status_code == 401
        assert "POST /v1/chat/completions" in log.read_text()  # the access log is on ...
        assert marker not in log.read_text() and KEY not in log.read_text()  # ... but holds no prompt, no key
    finally:
        stop_process(proc)
