"""Every tab's handler, called as the UI calls it: bad input comes back as a visible message (never an
exception), good input as real results. The engine is a real one on a tiny random Llama built locally."""

from __future__ import annotations

import asyncio
import contextvars
import html
import re
import threading
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import plotly.graph_objects as go
import pytest

from backend.default_model import packaged_gguf
from backend.engine.config import EngineConfig
from backend.engine.load_phases import LoadPhases
from backend.export.supervisor import ExternalServers
from backend.model_names import display_name
from backend.planner import PlanRequest
from backend.planner import recommendation as recommend_for
from backend.server.engine_holder import EngineHolder, build_engine
from tests.common_utils import free_port
from tests.engine_utils import tiny_model
from tests.ui_utils import EXPORT_FORM, PLAN_FORM
from ui import bench_tab, chat_tab, compare_tab, export_tab, external, launch_tab, load, monitor_tab, plan_tab
from ui.common import AppContext

LAUNCH_FORM = {  # the Launch form as it is sent, every EngineConfig field but the model
    **launch_tab.form_defaults(),
    **dict(
        dtype="float32",
        device="cpu",
        block_size=16,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        max_model_len=0,
        num_kv_blocks=None,
        kv_cache_memory_bytes=8,  # MiB in the form
        enable_prefix_caching=True,
        seed=0,
        trust_remote_code=False,
    ),
}
CHAT_FORM = dict(  # the Chat form as it is sent, by field name
    message="hello",
    history=[],
    system="",
    temperature=0.0,
    top_p=1.0,
    top_k=-1,
    max_tokens=8,
    seed=-1,
    stop="",
    use_schema=False,
    schema="",
)


def is_error(message: object, *words: str) -> bool:
    """An inline error message (ui.common.error_message) that names every one of words."""
    text = html.unescape(message) if isinstance(message, str) else ""
    return "msg-error" in text and all(w in text for w in words)


def drain(agen) -> list:
    async def run():
        return [update async for update in agen]

    return asyncio.run(run())


@pytest.fixture(scope="module")
def tiny() -> str:
    return tiny_model("llama")[0]


@pytest.fixture(scope="module")
def ctx(tiny):
    holder = EngineHolder()
    status = holder.launch(
        EngineConfig(model=tiny, dtype="float32", device="cpu", kv_cache_memory_bytes=8 << 20)
    )
    assert status.state == "ready", status.error
    yield AppContext(holder, tiny, f"http://127.0.0.1:{free_port()}/v1")
    holder.shutdown()


# --- Plan -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("input_len", -5, ["input length", "-5"]),
        ("output_len", 2.5, ["output length", "whole number"]),
        ("num_gpus", 0, ["number of GPUs"]),
        ("gpu", "NoSuchGPU", ["unknown GPU", "H100-80GB"]),
        ("quant", "int3", ["unknown quantization"]),
        ("max_len", 10_000_000, ["max_model_len", "131072"]),
        ("model", " ", ["model is required"]),
    ],
)
def test_plan_rejects_bad_input(field, value, words):
    outputs = plan_tab.estimate_plan({**PLAN_FORM, field: value})
    assert is_error(outputs[5], *words), outputs[5]


def test_plan_of_llama_8b_on_h100():
    badge, kpis, memory, compare, recommendation, message, plan = plan_tab.estimate_plan(PLAN_FORM)
    assert "Fits" in badge and message == ""
    # KV capacity, vLLM 0.33 accounting (Model Runner V2): 0.92 x 79.22 GiB - 14.96 weights - 1.38 activation
    # peak (the 0.88 GiB forward pass, larger than the 0.73 GiB dummy sampler of 1024 default sequences x
    # 128256 logits x 6 bytes, + 0.50 GiB of penalty bins at 4.125 bytes) - 0.25 non-torch = 56.3 GiB at
    # 128 KiB per token; MRV2 takes no CUDA-graph estimate from the budget
    assert "461,168 tokens" in kpis
    assert isinstance(memory, go.Figure) and memory.layout.xaxis.title.text == "GiB per GPU"
    assert {t.name for t in memory.data} >= {"Weights", "KV cache", "Activations"}
    assert "tok/s" in compare.layout.xaxis.title.text and "$" in compare.layout.xaxis2.title.text
    assert plan["model"] == PLAN_FORM["model"] and plan["gpu"] == "H100-80GB"
    assert "Recommendation" in recommendation
    assert "Where the memory goes (vLLM 0.29+)" in kpis and "profile sampler" in kpis


def test_plan_follows_the_vllm_version_of_the_form():
    """vLLM 0.11 on an H100 (sort sampler, no CUDA-graph estimate in the budget): 1024 x 128,256 x 38 B."""
    plan_new = plan_tab.estimate_plan(PLAN_FORM)[6]
    outputs = plan_tab.estimate_plan({**PLAN_FORM, "vllm_version": "0.11.0"})
    assert outputs[6]["vllm_version"] == "0.11.0" and plan_new["vllm_version"] == "0.33.0"
    assert "(vLLM 0.11-0.16)" in outputs[1] and "x 38 bytes" in outputs[1]
    bad = plan_tab.estimate_plan({**PLAN_FORM, "vllm_version": "latest"})
    assert is_error(bad[5], "vllm_version", "0.11.2"), bad[5]


def test_plan_recommendation_is_the_charts_configuration_for_a_gguf():
    """A Q4_1 GGUF on an L4: the Recommendation names the GGUF's quantization and the chart's figures for
    the GPU it picks (it named a bf16 configuration's throughput and cost beside a chart of the GGUF's)."""
    form = {**PLAN_FORM, "model": str(packaged_gguf()), "gpu": "L4", "quant": "auto"}
    badge, _, _, compare, recommendation, message, _ = plan_tab.estimate_plan(form)
    assert message == "" and "Fits" in badge
    count, gpu, quant = re.search(r"(\d+) × ([\w-]+), (\S+) ", recommendation).groups()
    assert (count, quant) == ("1", "gguf-q4_1")
    assert "the plan's quantization, as in the chart" in recommendation
    throughput, cost = compare.data[0], compare.data[1]  # every GPU fits: one trace per panel
    row = list(throughput.y).index(gpu)
    assert plan_tab.tok_s(throughput.x[row]) in recommendation
    assert plan_tab.usd_per_m(cost.x[row]) in recommendation
    advice = recommend_for(PlanRequest(model="Qwen/Qwen2.5-72B-Instruct", max_model_len=8192, concurrency=32))
    text = plan_tab.recommendation_text(advice)  # another quantization is said to be one, with its reason
    assert f"{advice.best.quant} instead of the plan's bf16" in text and advice.reason() in text


# --- Launch -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("block_size", -16, ["block_size", "-16"]),
        ("max_num_seqs", 0, ["max_num_seqs"]),
        ("kv_cache_memory_bytes", -1, ["kv_cache_memory (MiB)"]),
        ("max_model_len", -3, ["max_model_len"]),
        ("num_kv_blocks", 2.5, ["num_kv_blocks", "whole number"]),
        ("device", "mps", ["device", "cuda"]),
    ],
)
def test_launch_rejects_bad_form_without_touching_the_engine(ctx, field, value, words):
    engine = ctx.holder.get()
    message, status = launch_tab.launch_engine(
        ctx.holder, {**LAUNCH_FORM, "model": ctx.default_model, field: value}
    )
    assert is_error(message, *words), message
    assert ctx.holder.get() is engine and "data-state='ready'" in status


def test_failed_load_shows_the_error_and_relaunch_works(tiny):
    holder = EngineHolder()
    message, status = launch_tab.launch_engine(holder, {**LAUNCH_FORM, "model": "/no/such/model"})
    assert is_error(message, "Launch failed", "/no/such/model"), message
    assert "data-state='failed'" in status and holder.get() is None
    message, status = launch_tab.launch_engine(holder, {**LAUNCH_FORM, "model": tiny})
    assert "msg-ok" in message and "data-state='ready'" in status
    message, status = launch_tab.stop_engine(holder)
    assert "msg-ok" in message and holder.get() is None and "data-state='stopped'" in status


def test_the_progress_label_follows_every_load_phase_gradio_queue_recorded(tiny):
    """The real gr.Progress, which finds its event through Gradio's context variables, in a handler's
    context; only the queue that would send the label to the browser records instead. The phases after the
    first begin on the engine's loading thread: each one still reaches the label, in order."""
    from gradio.context import LocalContext

    labels: list[str] = []

    class RecordingQueue:  # Blocks._queue: what the browser's progress label would show
        def set_progress(self, event_id: str, iterables: list) -> None:
            labels.append(iterables[-1].desc)

    def handler() -> tuple[str, str]:
        LocalContext.blocks.set(SimpleNamespace(_queue=RecordingQueue()))
        LocalContext.event_id.set("launch-event")
        return launch_tab.launch_engine(holder, {**LAUNCH_FORM, "model": tiny}, progress=gr.Progress())

    holder = EngineHolder()
    message, _ = contextvars.copy_context().run(handler)  # the test's own context stays clean
    assert "msg-ok" in message, message
    phases = [p.name for p in holder.status().phases]
    assert len(phases) >= 4 and phases[-1] == "allocate KV cache", phases
    name = display_name(tiny)
    assert labels == [f"{name}: {phase} …" for phase in phases]
    holder.shutdown()


def test_second_launch_while_loading_is_refused_with_a_message_slow_factory(tiny):
    release = threading.Event()

    def slow_factory(config: EngineConfig, phases: LoadPhases):
        release.wait(30)
        return build_engine(config, phases)

    holder = EngineHolder(engine_factory=slow_factory)
    config = EngineConfig(model=tiny, dtype="float32", device="cpu", kv_cache_memory_bytes=8 << 20)
    first = threading.Thread(target=holder.launch, args=(config,))
    first.start()
    while holder.status().state != "loading":
        pass
    message, _ = launch_tab.launch_engine(holder, {**LAUNCH_FORM, "model": tiny})
    assert is_error(message, "another launch is still loading"), message
    release.set()
    first.join()
    assert holder.status().state == "ready"
    holder.shutdown()


# --- Chat and load ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("temperature", -1.0, ["temperature must be >= 0"]),
        ("top_p", 0.0, ["top_p"]),
        ("top_k", -7, ["top_k"]),
        ("max_tokens", -5, ["max tokens", "-5"]),
        ("seed", 1.5, ["seed"]),
    ],
)
def test_chat_rejects_bad_sampling_values(ctx, field, value, words):
    updates = drain(chat_tab.chat(ctx, {**CHAT_FORM, field: value}))
    assert len(updates) == 1 and is_error(updates[0][3], *words), updates


def test_chat_streams_a_reply_with_its_stats(ctx):
    updates = drain(chat_tab.chat(ctx, {**CHAT_FORM, "message": "Hi there", "system": "Be brief."}))
    final_chat, _, stats, message = updates[-1]
    assert message == "" and final_chat[-1]["role"] == "assistant" and final_chat[-1]["content"]
    assert re.search(r"\d+ tokens", stats) and "TTFT" in stats and "tok/s" in stats


def test_chat_with_no_engine_launches_the_default_model_first(ctx):
    fresh = AppContext(EngineHolder(), ctx.default_model, ctx.api_base)
    updates = drain(chat_tab.chat(fresh, CHAT_FORM))
    assert "starting the engine" in updates[0][0][-1]["content"]
    assert updates[-1][3] == "" and "TTFT" in updates[-1][2]
    assert fresh.holder.status().state == "ready" and fresh.holder.status().config.model == ctx.default_model
    fresh.holder.shutdown()


def test_chat_prompt_longer_than_the_model_limit_is_a_message(ctx):
    long_text = "word " * 2000  # the tiny model's max_model_len is 512
    updates = drain(chat_tab.chat(ctx, {**CHAT_FORM, "message": long_text}))
    assert is_error(updates[-1][3], "512"), updates[-1][3]
    assert ctx.holder.stats().num_kv_blocks_used == 0


def test_stop_cancels_a_long_reply_and_frees_its_blocks(ctx):
    """Stop cancels the chat handler (`cancels=`), as Gradio does: the generator is closed mid-reply."""

    async def run() -> list:
        updates = []
        replies = chat_tab.chat(ctx, {**CHAT_FORM, "message": "Tell a story", "max_tokens": 400})
        async for update in replies:
            updates.append(update)
            if len(updates) == 4:
                assert ctx.holder.stats().num_kv_blocks_used > 0  # the reply holds blocks while it runs
                break
        await replies.aclose()
        for _ in range(100):  # the engine thread frees them on its next step
            if ctx.holder.stats().num_kv_blocks_used == 0:
                break
            await asyncio.sleep(0.05)
        return updates

    updates = asyncio.run(run())
    assert len(updates) == 4 and "TTFT" not in updates[-1][2]  # stopped long before 400 tokens
    assert ctx.holder.stats().num_kv_blocks_used == 0 and ctx.holder.stats().num_requests_running == 0


def test_history_sent_back_to_the_model_drops_the_stats_line():
    shown = [
        {"role": "assistant", "content": [{"type": "text", "text": f"Paris.{chat_tab.STATS_MARK}TTFT</sub>"}]}
    ]
    assert chat_tab.message_text(shown[0]["content"]) == "Paris."


@pytest.mark.parametrize(
    ("n", "tokens", "words"),
    [(-3, 8, ["number of requests"]), (100_000, 8, ["at most 256"]), (4, 0, ["max tokens per request"])],
)
def test_load_rejects_bad_input(ctx, n, tokens, words):
    assert is_error(drain(load.fire_load(ctx, n, tokens))[-1], *words)


def test_load_without_engine_and_with_one(ctx):
    idle = AppContext(EngineHolder(), ctx.default_model, ctx.api_base)
    assert is_error(drain(load.fire_load(idle, 4, 8))[-1], "no engine running")
    final = drain(load.fire_load(ctx, 4, 8))[-1]
    assert "msg-ok" in final and "4 requests, 32 tokens" in final
    assert ctx.holder.stats().num_kv_blocks_used == 0


# --- Benchmark, Monitor, Export ---------------------------------------------------------------------

BENCH = dict(
    plan=None,
    target="Another server (URL)",
    url="http://127.0.0.1:{port}/v1",
    model="m",
    num_prompts=4,
    input_len=16,
    output_len=8,
    concurrency=2,
)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("url", "http://127.0.0.1:{port}/v1", ["cannot reach"]),
        ("url", "localhost:8000/v1", ["must start with http"]),
        ("num_prompts", -1, ["number of requests"]),
        ("output_len", 0, ["output length"]),
        ("model", "", ["model is required"]),
    ],
)
def test_benchmark_rejects_bad_input(ctx, field, value, words):
    form = {**BENCH, field: value}
    form["url"] = form["url"].format(port=free_port())
    outputs = bench_tab.run(ctx, form)
    assert is_error(outputs[0], *words), outputs[0]


def test_benchmark_of_embedded_engine_that_is_not_running(ctx):
    idle = AppContext(EngineHolder(), ctx.default_model, ctx.api_base)
    outputs = bench_tab.run(idle, {**BENCH, "target": bench_tab.EMBEDDED, "model": ""})
    assert is_error(outputs[0], "not running"), outputs[0]


COMPARE = dict(
    chosen=["embedded"],
    url="",
    dataset="chat",
    num_prompts=4,
    concurrency=2,
    input_len=64,
    output_len=8,
    seed=0,
)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("num_prompts", 0, ["requests"]),
        ("seed", -1, ["seed", ">= 0"]),
        ("chosen", ["embedded"], ["at least two targets"]),
        ("chosen", ["embedded", "vllm"], ["vllm is not running"]),
    ],
)
def test_compare_rejects_bad_input(ctx, field, value, words):
    outputs = compare_tab.run(ctx, {**COMPARE, field: value})
    assert is_error(outputs[0], *words), outputs[0]


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("ftp://host/metrics", ["must start with http"]),
        ("http://127.0.0.1:{port}/metrics", ["cannot read metrics"]),
    ],
)
def test_monitor_rejects_bad_urls(url, words):
    _, message, samples, poller = monitor_tab.start_monitor(url.format(port=free_port()))
    assert is_error(message, *words) and samples == [] and poller is None


@pytest.mark.parametrize(
    ("plan", "field", "value", "words"),
    [
        (None, "port", 8000, ["no plan yet"]),
        ("plan", "port", -1, ["port"]),
        ("plan", "engines", [], ["choose at least one engine"]),
        ("plan", "api_key", "MY KEY", ["api_key_env", "environment variable"]),
        ("plan", "speculative", "eagle3", ["speculative model"]),
        ("plan", "host", "-rf", ["host"]),
    ],
)
def test_export_rejects_bad_input(plan, field, value, words):
    current = plan_tab.estimate_plan(PLAN_FORM)[6] if plan else None
    outputs = export_tab.export_plan({**EXPORT_FORM, "plan": current, field: value})
    assert is_error(outputs[4], *words), outputs[4]


def test_export_previews_the_launch_command_and_zips_everything():
    plan = plan_tab.estimate_plan(PLAN_FORM)[6]
    _, picker, preview, archive, message = export_tab.export_plan({**EXPORT_FORM, "plan": plan})
    assert "msg-ok" in message and picker["value"] == "vllm/launch.sh"
    assert (
        "vllm serve meta-llama/Llama-3.1-8B-Instruct" in preview["value"] and preview["language"] == "shell"
    )
    names = zipfile.ZipFile(Path(archive)).namelist()
    assert {"vllm/launch.sh", "vllm/docker-compose.yml", "README.md"} <= set(names)


def test_external_server_runs_the_exported_command_fake_vllm_executable(tmp_path, monkeypatch):
    """vLLM cannot run here; a stand-in `vllm` on PATH records the command line the UI runs."""
    record = tmp_path / "argv.txt"
    fake = tmp_path / "vllm"
    fake.write_text(f'#!/bin/sh\necho "$@" > {record}\nexec sleep 60\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    servers = ExternalServers()
    plan = plan_tab.estimate_plan(PLAN_FORM)[6]
    assert is_error(external.start(servers, None, "vllm", 8011), "no plan yet")
    assert is_error(external.start(servers, plan, "vllm", -1), "port")
    assert is_error(external.start(servers, plan, "llamacpp", 8011), "llama-server")
    assert "msg-ok" in external.start(servers, plan, "vllm", 8011)
    assert is_error(external.start(servers, plan, "vllm", 8011), "already running")
    for _ in range(100):
        if record.exists() and record.read_text():
            break
        time.sleep(0.05)
    argv = record.read_text()
    assert argv.startswith("serve meta-llama/Llama-3.1-8B-Instruct") and "--port 8011" in argv
    process = servers.get("vllm").process
    assert "msg-ok" in external.stop(servers, "vllm") and process.poll() is not None
    assert is_error(external.stop(servers, "vllm"), "no vllm server")


def test_external_server_of_a_local_model_is_asked_for_the_name_it_serves_fake_vllm_executable(
    tmp_path, monkeypatch
):
    """A local folder launched here is served under its name (the exported --served-model-name, no longer
    its path), and the server's served_name, which the Chat, Benchmark and Compare tabs send, is that name."""
    record, fake = tmp_path / "argv.txt", tmp_path / "vllm"
    fake.write_text(f'#!/bin/sh\necho "$@" > {record}\nexec sleep 60\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    folder = tmp_path / "My-Model"
    folder.mkdir()
    servers = ExternalServers()
    server = servers.start(PlanRequest(model=str(folder), max_model_len=4096), "vllm", port=8012)
    try:
        assert server.served_name == "My-Model"
        assert f"vllm serve {folder} " in server.command and "--served-model-name My-Model" in server.command
    finally:
        servers.stop_all()
