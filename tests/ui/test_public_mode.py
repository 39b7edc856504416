"""`python app.py --public` as a visitor and as its owner would use it: a real app process on 127.0.0.1,
driven through its Gradio API (gradio_client, the same calls any visitor can make) and plain HTTP.

The app serves a tiny random Llama given as its owner's `--model` (the app's own preset; visitors name
Hub ids only). A canary HTTP server stands for whatever sits on the host's loopback or private network:
every SSRF attempt must be refused with a message and the canary must receive nothing.
"""

from __future__ import annotations

import html
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.common_utils import ROOT, free_port, stop_process
from tests.engine_utils import tiny_model
from tests.security_utils import NON_PUBLIC_URLS, Canary, loopback_spellings

pytestmark = pytest.mark.slow
ADMIN = "owner-admin-token"
KEY = "api-key-for-v1"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_TOKENS = 16
MAX_INPUT_TOKENS = 64
MAX_UPLOADS = 3
# handlers a visitor must not reach: Plan's checkpoint path and its Launch-here chain, Compare's run
HIDDEN_HANDLERS = ("/check_plan", "/run_pending", "/checkpoint_hint", "/with_checkpoint", "/on_measure")
COMPARE_LABEL = "Targets (running engines)"


@dataclass
class PublicApp:
    url: str
    client: object  # gradio_client.Client
    log: Path
    model: str
    canary: Canary
    redirector: Canary

    def api(self, name: str, **by_label):
        """Call a Gradio endpoint, filling parameters by label (the rest keep their defaults)."""
        params = self.client.view_api(return_format="dict", print_info=False)["named_endpoints"][f"/{name}"]
        args = []
        for param in params["parameters"]:
            label = param["label"] or param["parameter_name"]
            key = next((k for k in by_label if label.startswith(k)), None)
            args.append(by_label[key] if key else param["parameter_default"])
        result = self.client.predict(*args, api_name=f"/{name}")
        if isinstance(result, tuple):
            return tuple(html.unescape(r) if isinstance(r, str) else r for r in result)
        return html.unescape(result) if isinstance(result, str) else result

    def launch(self, token: str, **form):
        return self.api("launch", **{"model": self.model, "kv_cache_memory": 8, "Admin token": token, **form})

    def chat_completion(self, max_tokens: int = 4) -> httpx.Response:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
        return httpx.post(f"{self.url}/v1/chat/completions", json=body, headers=AUTH, timeout=120)


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, f"app.py exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"the owner's model did not start:\n{log.read_text()[-3000:]}"
        time.sleep(0.3)


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    from gradio_client import Client

    canary = Canary()
    redirector = Canary(location=f"{canary.url}/metrics")
    model, port = tiny_model("llama")[0], free_port()
    log = tmp_path_factory.mktemp("public") / "app.log"
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
        "PLAYGROUND_ADMIN_TOKEN": ADMIN,
        "PLAYGROUND_API_KEY": KEY,
        "PLAYGROUND_ALLOWED_URLS": f"*,{redirector.url}",
        "PLAYGROUND_MAX_BENCH_REQUESTS": "8",
        "PLAYGROUND_MAX_TOKENS": str(MAX_TOKENS),
        "PLAYGROUND_MAX_INPUT_TOKENS": str(MAX_INPUT_TOKENS),
        "PLAYGROUND_MAX_UPLOADS": str(MAX_UPLOADS),
    }
    command = [sys.executable, "app.py", "--public", "--model", model, "--port", str(port)]
    with log.open("w") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        client = Client(url, verbose=False)
        yield PublicApp(url, client, log, model, canary, redirector)
        client.close()
    finally:
        stop_process(proc)
        canary.close()
        redirector.close()


def test_the_banner_says_where_it_listens_and_what_is_locked(app):
    text = app.log.read_text()
    port = app.url.rsplit(":", 1)[1]
    assert f"Listening on 127.0.0.1:{port} (this machine only)" in text
    assert "public mode: engine launch/stop admin token required; trust_remote_code refused" in text
    assert "/metrics: needs the API key" in text and KEY not in text and ADMIN not in text


def test_v1_and_metrics_need_the_key_the_ui_and_health_do_not(app):
    assert httpx.get(f"{app.url}/v1/models").status_code == 401
    assert httpx.get(f"{app.url}/metrics").status_code == 401
    for path in ("/tokenizer_info", "/version"):
        assert httpx.get(f"{app.url}{path}").status_code == 401
        assert httpx.get(f"{app.url}{path}", headers=AUTH).status_code == 200
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1]})):
        assert httpx.post(f"{app.url}{path}", json=body).status_code == 401
        assert httpx.post(f"{app.url}{path}", json=body, headers=AUTH).status_code == 200
    assert httpx.get(f"{app.url}/v1/models", headers=AUTH).json()["data"][0]["id"] == "llama"
    metrics = httpx.get(f"{app.url}/metrics", headers=AUTH).text
    assert "vllm:num_requests_running" in metrics and "prefix_cache" not in metrics  # no per-visitor hits
    assert httpx.get(f"{app.url}/health").status_code == 200 and httpx.get(f"{app.url}/").status_code == 200


def test_the_api_caps_max_tokens_like_the_ui(app):
    too_many = app.chat_completion(max_tokens=MAX_TOKENS + 1)
    assert too_many.status_code == 400 and f"at most {MAX_TOKENS}" in too_many.json()["error"]["message"]
    body = {"messages": [{"role": "user", "content": "hi"}], "ignore_eos": True}  # no max_tokens: capped
    capped = httpx.post(f"{app.url}/v1/chat/completions", json=body, headers=AUTH, timeout=120).json()
    assert capped["usage"]["completion_tokens"] == MAX_TOKENS


def test_the_responses_api_caps_max_output_tokens_likewise(app):
    body = {"input": "hi", "max_output_tokens": MAX_TOKENS + 1}
    too_many = httpx.post(f"{app.url}/v1/responses", json=body, headers=AUTH, timeout=120)
    assert too_many.status_code == 400 and f"at most {MAX_TOKENS}" in too_many.json()["error"]["message"]
    capped = httpx.post(f"{app.url}/v1/responses", json={"input": "hi"}, headers=AUTH, timeout=120).json()
    assert capped["usage"]["output_tokens"] <= MAX_TOKENS


def test_engine_control_without_the_admin_token_is_refused(app):
    for token in ("", "wrong-token"):
        assert "admin token" in app.launch(token, model="/etc")  # the token is checked before the model
        assert "admin token" in app.api("stop", **{"Admin token": token})[0]
    assert "admin token" in app.launch("", trust_remote_code=True)
    assert httpx.get(f"{app.url}/health").status_code == 200  # the engine kept serving throughout
    assert app.chat_completion().status_code == 200


def test_the_owner_cannot_enable_remote_code_or_name_local_paths_either(app):
    assert "trust_remote_code is refused in public mode" in app.launch(ADMIN, trust_remote_code=True)
    messages = {model: app.launch(ADMIN, model=model) for model in ("/etc", "/no/such/model", "tests/data")}
    for model, message in messages.items():
        assert "Hugging Face Hub only" in message, message
        assert message.replace(model, "X") == messages["/etc"].replace("/etc", "X")  # exists or not: same
    offline = app.launch(ADMIN, model="Qwen/Qwen2.5-0.5B-Instruct")
    assert "cannot read Qwen/Qwen2.5-0.5B-Instruct's file sizes from the Hub" in offline


def test_the_launch_form_names_the_owners_model_without_its_path(app):
    params = app.client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/launch"]
    shown = next(p["parameter_default"] for p in params["parameters"] if p["label"] == "model")
    assert shown == Path(app.model).name  # "llama", the folder's name: the page and its API show no path
    assert "Engine ready" in app.launch(ADMIN, model=shown)  # and that name launches the owner's model


def test_the_plan_tab_refuses_local_paths(app):
    for model in ("/etc/passwd", "../README.md", "tests/data"):
        message = app.api("on_change", Model=model)[5]
        assert "Hugging Face Hub only" in message and "not found" not in message


def test_ssrf_attempts_are_refused_and_the_canary_receives_nothing(app):
    targets = [*loopback_spellings(app.canary.port), *NON_PUBLIC_URLS[:3], f"{app.url}/gradio_api/info"]
    for url in targets:
        message = app.api("monitor_start", **{"Metrics URL": url})[1]
        assert "cannot read metrics" in message and "public app" in message, (url, message)
        base = url.removesuffix("/metrics") + "/v1"
        bench = app.api("benchmark", Target="Another server (URL)", **{"Server URL": base, "Model name": "x"})
        assert "msg-error" in bench[0] and "public app" in bench[0], (base, bench[0])
    message = app.api("monitor_start", **{"Metrics URL": f"{app.redirector.url}/metrics"})[1]
    assert "does not follow redirects" in message  # the owner listed the redirector, not its target
    assert app.canary.hits == [] and app.redirector.hits == ["/metrics"]


def test_the_apps_own_metrics_and_benchmark_work_within_the_limits(app):
    message = app.api("monitor_start", **{"Metrics URL": f"{app.url}/metrics"})[1]
    assert "msg-error" not in message and "prefix hits <b>–" in message  # the key went with it, hits did not
    run = app.api("benchmark", Requests=4, **{"Input tokens": 16, "Output tokens": 4, "Max concurrency": 2})
    assert "4 requests completed, 0 failed" in run[0], run[0]
    too_many = app.api("benchmark", Requests=9)
    assert "number of requests must be at most 8" in too_many[0]
    assert "at most 32" in app.api("fire_load", **{"Concurrent requests": 33, "Max tokens each": 4})
    too_long = app.api("fire_load", **{"Concurrent requests": 1, "Max tokens each": 99})
    assert f"at most {MAX_TOKENS}" in too_long


def test_a_visitor_chats_within_the_token_limit(app):
    result = app.api("chat", message="Hello!", **{"max tokens": MAX_TOKENS})
    assert result[0][-1]["role"] == "assistant" and result[3] == ""
    refused = app.api("chat", message="Hello!", **{"max tokens": MAX_TOKENS + 1})
    assert f"max tokens must be at most {MAX_TOKENS}" in refused[3]


def test_a_failed_relaunch_leaves_the_old_engine_serving(app):
    message = app.launch(ADMIN, kv_cache_memory=10**9)  # 10^9 MiB: the allocation fails
    assert "Launch failed" in message and "keeps serving" in message, message
    assert httpx.get(f"{app.url}/health").status_code == 200
    reply = app.chat_completion()
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]


def test_relaunch_during_traffic_answers_503_with_retry_after_never_500(app):
    statuses, stop = [], threading.Event()

    def client() -> None:
        while not stop.is_set():
            try:
                reply = app.chat_completion(max_tokens=8)
            except httpx.HTTPError as exc:  # a hang or a dropped connection is a failure too
                statuses.append(type(exc).__name__)
                continue
            if reply.status_code == 503 and not reply.headers.get("retry-after"):
                statuses.append("503 without Retry-After")
            else:
                statuses.append(reply.status_code)

    threads = [threading.Thread(target=client) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        assert "Engine ready" in app.launch(ADMIN, max_num_seqs=4)  # relaunch while requests run
        assert "Engine stopped" in app.api("stop", **{"Admin token": ADMIN})[0]
        time.sleep(1.0)  # requests keep coming while nothing serves
        assert "Engine ready" in app.launch(ADMIN)
        time.sleep(1.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=150)
    assert set(statuses) <= {200, 503}, statuses
    assert 503 in statuses and statuses[-1] == 200  # 503s while stopped, served again after the launch


def endpoint_labels(client) -> dict[str, list[str]]:
    endpoints = client.view_api(return_format="dict", print_info=False)["named_endpoints"]
    return {name: [p["label"] or "" for p in e["parameters"]] for name, e in endpoints.items()}


def test_handlers_a_visitor_must_not_reach_are_not_registered(app):
    """A hidden tab is not a gate: Compare, the checkpoint path and Plan → Launch are simply absent."""
    endpoints = endpoint_labels(app.client)
    assert not [name for name in endpoints if name.startswith(HIDDEN_HANDLERS)], sorted(endpoints)
    assert not [name for name, labels in endpoints.items() if COMPARE_LABEL in labels]
    assert "/launch" in endpoints and "/chat" in endpoints  # what a visitor uses is still there
    info = httpx.get(f"{app.url}/gradio_api/info").text
    assert "Quantized checkpoint" not in info and COMPARE_LABEL not in info


def test_the_input_cap_applies_to_v1_and_chat(app):
    body = {"messages": [{"role": "user", "content": "hi " * (MAX_INPUT_TOKENS + 10)}], "max_tokens": 2}
    resp = httpx.post(f"{app.url}/v1/chat/completions", json=body, headers=AUTH, timeout=120)
    assert resp.status_code == 400 and f"at most {MAX_INPUT_TOKENS} input tokens" in resp.text
    refused = app.api("chat", message="hi " * (MAX_INPUT_TOKENS + 10), **{"max tokens": 4})
    assert f"at most {MAX_INPUT_TOKENS} input tokens" in refused[3]
    huge = app.api("chat", message="word " * 200_000, **{"max tokens": 4})  # refused before tokenizing
    assert "characters long" in huge[3]
    assert app.chat_completion().status_code == 200


def upload(app, name: str, size: int) -> httpx.Response:
    files = {"files": (name, b"x" * size, "text/plain")}
    return httpx.post(f"{app.url}/gradio_api/upload", files=files, timeout=60)


def test_uploads_are_bounded_in_size_and_count_per_client(app):
    assert upload(app, "big.txt", 2 * 1024 * 1024).status_code == 413  # PLAYGROUND_MAX_UPLOAD_MB: 1
    answers = [upload(app, f"small-{i}.txt", 10) for i in range(MAX_UPLOADS + 1)]
    assert [r.status_code for r in answers] == [200] * MAX_UPLOADS + [429]
    assert int(answers[-1].headers["Retry-After"]) > 0 and "per client per hour" in answers[-1].text


def start_exposed(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen, Path, str]:
    """app.py bound to all interfaces (how a LAN or cloud machine serves it), with no public settings."""
    port, log = free_port(), tmp_path / "exposed.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLAYGROUND_", "SPACE_", "GRADIO_"))}
    command = [sys.executable, "app.py", "--host", "0.0.0.0", "--port", str(port), *flags]
    env |= {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    with log.open("w") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    return proc, log, f"http://127.0.0.1:{port}"


def wait_for_line(proc: subprocess.Popen, log: Path, text: str, timeout_s: float = 180) -> str:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.3)
    return log.read_text()


def test_an_exposed_app_is_public_unless_its_owner_says_unsafe_local(tmp_path):
    from gradio_client import Client

    model = tiny_model("llama")[0]
    proc, log, url = start_exposed(tmp_path, "--model", model)
    try:
        text = wait_for_line(proc, log, "Exposed by")
        assert "Exposed by --host 0.0.0.0 (other machines can connect): public mode is on" in text
        assert "* public mode: engine launch/stop disabled" in text
        wait_healthy(url, proc, log)  # public mode launches the owner's model itself
        with_client = Client(url, verbose=False)
        endpoints = endpoint_labels(with_client)
        with_client.close()
        assert not [name for name in endpoints if name.startswith(HIDDEN_HANDLERS)]
        assert not [name for name, labels in endpoints.items() if COMPARE_LABEL in labels]
    finally:
        stop_process(proc)
    proc, log, url = start_exposed(tmp_path, "--model", model, "--unsafe-local")
    try:
        text = wait_for_line(proc, log, "WARNING")
        assert "WARNING: exposed by --host 0.0.0.0 (other machines can connect) in local mode" in text
        assert "local mode (nothing locked" in text
    finally:
        stop_process(proc)
