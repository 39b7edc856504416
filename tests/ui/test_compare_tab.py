"""The Compare tab's handler and `app.py compare` send the same prompts for one workload: with the dataset
"random" both send vLLM's random token-id prompts of the served model's tokenizer, exactly input_len tokens
each. Both run for real against the app's own API (a real server over a tiny random Llama in the engine
holder), the tab as the embedded engine beside that API's URL, the CLI with two URLs of it."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from backend.bench.datasets import SampleRequest, load_tokenizer, sample_requests
from backend.bench.serve import BenchConfig
from backend.engine.config import EngineConfig
from backend.server import build_app
from backend.server.engine_holder import EngineHolder
from tests.common_utils import ROOT
from tests.engine_utils import tiny_model
from tests.server_utils import RunningServer
from ui import bench_tab, compare_tab
from ui.common import AppContext

pytestmark = pytest.mark.usefixtures("one_torch_thread")
WORKLOAD = dict(num_prompts=4, concurrency=2, input_len=24, output_len=4, seed=3)


@pytest.fixture(scope="module")
def app_api():
    """(AppContext, URL): the engine holder running a tiny model, served as the app serves it."""
    model = tiny_model("llama")[0]
    holder = EngineHolder()
    status = holder.launch(
        EngineConfig(model=model, dtype="float32", device="cpu", kv_cache_memory_bytes=8 << 20)
    )
    assert status.state == "ready", status.error
    server = RunningServer(build_app(engine_provider=holder.get))
    yield AppContext(holder, model, f"{server.url}/v1"), server.url
    server.stop()
    holder.shutdown()


def sent_prompts(report: dict) -> dict[str, list[SampleRequest]]:
    """target -> the prompts its run sent (the requests of the bench config the report records)."""
    prompts = {}
    for target, result in report["results"].items():
        config = BenchConfig(**(result["config"] | {"request_rate": math.inf}))
        prompts[target] = sample_requests(config)
    return prompts


def cli_report(url: str, model: str, out: Path) -> dict:
    command = [sys.executable, "app.py", "compare", "--target", f"{url}/v1", "--target", url]
    command += ["--model", model, "--dataset", "random", "--out", str(out)]
    command += [
        "--num-prompts",
        str(WORKLOAD["num_prompts"]),
        "--max-concurrency",
        str(WORKLOAD["concurrency"]),
    ]
    command += ["--input-len", str(WORKLOAD["input_len"]), "--output-len", str(WORKLOAD["output_len"])]
    command += ["--seed", str(WORKLOAD["seed"])]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads((out / "compare.json").read_text())


@pytest.mark.slow
def test_tab_sends_the_random_token_prompts_the_cli_sends(app_api, tmp_path):
    ctx, url = app_api
    form = dict(chosen=[compare_tab.EMBEDDED], url=f"{url}/v1", dataset="random", quality=True, **WORKLOAD)
    message, *_, files = compare_tab.run(ctx, form)
    assert "msg-error" not in message, message
    tab = json.loads(Path(next(f for f in files if f.endswith(".json"))).read_text())
    cli = cli_report(url, ctx.default_model, tmp_path)
    assert tab["workload"]["tokenizer"] == cli["workload"]["tokenizer"] == ctx.default_model
    tab_prompts, cli_prompts = sent_prompts(tab), sent_prompts(cli)
    assert list(tab_prompts) == [compare_tab.EMBEDDED, f"{url}/v1"]
    salts = [r["prompt_salt"] for r in [*tab["rows"], *cli["rows"]]]
    assert len(set(salts)) == 4  # each target its own: one server given twice shares no prefix cache
    reference = [r.prompt.removeprefix(salts[-1]) for r in cli_prompts[url]]
    for salt, prompts in zip(salts, [*tab_prompts.values(), *cli_prompts.values()], strict=True):
        assert all(r.prompt.startswith(salt) for r in prompts)
        assert [r.prompt.removeprefix(salt) for r in prompts] == reference  # the same prompts after it
    tokenizer = load_tokenizer(ctx.default_model)
    assert len(set(reference)) == WORKLOAD["num_prompts"]
    for prompt in reference:  # token ids of the model's tokenizer, not corpus words
        assert len(tokenizer(prompt, add_special_tokens=False)["input_ids"]) == WORKLOAD["input_len"]
    salt_tokens = len(tokenizer(salts[0], add_special_tokens=False)["input_ids"])
    for result in [*tab["results"].values(), *cli["results"].values()]:  # as the server counted them
        lengths = [WORKLOAD["input_len"] + salt_tokens] * WORKLOAD["num_prompts"]
        assert result["input_lens"] == lengths, result["errors"]
    assert "salt of its own" in message and "prefix-cache hits during each run" in message
    # quality: the tab's reference is the embedded engine (whole rows), the CLI's the model in fp32 here;
    # the URL serves the same fp32 engine, so its perplexity is the reference's, its top-1 the same
    for report, reference in ((tab, compare_tab.EMBEDDED), (cli, f"{ctx.default_model}@dtype=float32")):
        assert report["quality_reference"]["model"].startswith(reference)
        for quality in (r["quality"] for r in report["rows"]):
            assert quality["ppl"] == pytest.approx(report["quality_reference"]["ppl"], rel=1e-4)
            assert quality["same_top_p"] == 1.0
    assert tab["rows"][0]["quality"]["kld_kind"] == "exact" and tab["rows"][0]["quality"]["kld_mean"] == 0
    assert tab["rows"][1]["quality"]["kld_kind"] == "lower bound" and "quality: 508 tokens" in message


def test_embedded_target_plans_the_engine_as_it_runs(app_api):
    """The tab's plan row for the embedded engine is the planner's view of the running engine: its weights
    (dtype or as stored) and its own KV pool, in the planner's tokens (equal when the bytes a token agree)."""
    ctx, _ = app_api
    stats = ctx.holder.stats()
    target = compare_tab.embedded_target(ctx)
    assert target.planned["weights_bytes"] == stats.weights_bytes
    assert target.planned["kv_cache_tokens"] == stats.num_kv_blocks_total * stats.block_size


def test_one_plan_of_the_running_engine_for_every_tab(app_api):
    """Launch card, Benchmark and Compare plan the running engine from its config and stats alike: its
    max_num_seqs, and its captured decode step's bytes (none when it captured nothing) exactly."""
    from backend.planner import estimate
    from backend.planner.launch_here import running_engine_plan

    ctx, _ = app_api
    config, stats = ctx.holder.status().config, ctx.holder.stats()
    req = running_engine_plan(config, stats, input_len=64, output_len=16, concurrency=2)
    assert req.max_num_seqs == config.max_num_seqs and req.enforce_eager == (stats.decode_graph_bytes == 0)
    assert estimate(req).cuda_graph_bytes == stats.decode_graph_bytes
    bench = bench_tab.plan_for(
        ctx,
        bench_tab.EMBEDDED,
        None,
        SimpleNamespace(input_len=64, output_len=16, max_concurrency=2, num_prompts=4),
    )
    assert bench == req.to_dict()


def test_running_engine_request_keeps_a_quantized_checkpoint_as_stored():
    from backend.planner.launch_here import running_engine_request

    assert running_engine_request("m.gguf", "bfloat16", quantized=True).quant == "auto"
    assert running_engine_request("m", "torch.bfloat16", quantized=False).quant == "bf16"
    fp8_kv = running_engine_request("m", "float32", quantized=False, kv_cache_dtype="fp8")
    assert fp8_kv.kv_cache_dtype == "fp8"
