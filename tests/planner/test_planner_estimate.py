"""The estimate: fit and fixes, engine accounting, speed and cost, validation, CLI, local hardware."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from backend.default_model import packaged_gguf
from backend.planner import (
    PlanRequest,
    compare_gpus,
    detect_local_hardware,
    estimate,
    get_quantization,
    list_gpus,
    recommend,
    recommendation,
)
from backend.planner.catalog import get_gpu

GIB = 1024**3
CLI_KEYS = {
    "weights_bytes",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "kv_cache_tokens",
    "activation_bytes",
    "overhead_bytes",
    "total_bytes_per_gpu",
    "fits",
    "max_concurrency",
    "max_model_len_single",
    "prefill_tokens_per_s",
    "ttft_s",
    "decode_tokens_per_s_per_seq",
    "decode_tokens_per_s_total",
    "cost_per_million_output_tokens",
    "warnings",
}
LLAMA8 = PlanRequest(model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100-80GB", max_model_len=8192)


def test_breakdown_adds_up_and_concurrency_follows_kv_capacity():
    est = estimate(LLAMA8)
    assert est.fits and set(est.to_dict()) >= CLI_KEYS
    parts = (
        est.weights_bytes
        + est.kv_cache_bytes
        + est.activation_bytes
        + est.overhead_bytes
        + est.cuda_graph_bytes
    )
    assert est.total_bytes_per_gpu == parts
    budget = est.gpu_memory_bytes * LLAMA8.gpu_memory_utilization
    # vLLM 0.21-0.24 (Model Runner V1) fills its budget with everything, CUDA-graph estimate included
    v21 = estimate(replace(LLAMA8, vllm_version="0.21.0"))
    assert budget - 16 * v21.kv_bytes_per_token <= v21.total_bytes_per_gpu <= budget
    # before 0.21, and on Model Runner V2 (dense models from 0.25, the default target), they sit outside it
    for other in (estimate(replace(LLAMA8, vllm_version="0.11.2")), est):
        parts_other = other.total_bytes_per_gpu - other.cuda_graph_bytes
        assert budget - 16 * other.kv_bytes_per_token <= parts_other <= budget
    assert est.kv_cache_tokens == est.kv_cache_bytes // est.kv_bytes_per_token
    per_seq = -(-(LLAMA8.input_len + LLAMA8.output_len) // 16) * 16 * est.kv_bytes_per_token
    assert est.max_num_seqs == 1024  # vLLM's default on a >= 70 GiB GPU that is not an A100
    assert est.max_concurrency == min(est.kv_cache_bytes // per_seq, est.max_num_seqs)
    assert est.max_model_len_single == min(est.kv_cache_tokens, 131072)  # the model's own limit caps it
    assert est.cost_per_million_output_tokens == pytest.approx(
        3.5 / (est.decode_tokens_per_s_total * 3600) * 1e6
    )


def test_fp8_kv_cache_doubles_capacity_and_tp_splits_weights():
    base = estimate(LLAMA8)
    fp8 = estimate(replace(LLAMA8, kv_cache_dtype="fp8"))
    assert fp8.kv_bytes_per_token == base.kv_bytes_per_token / 2
    assert fp8.kv_cache_tokens == pytest.approx(2 * base.kv_cache_tokens, rel=0.01)
    tp2 = estimate(replace(LLAMA8, num_gpus=2))
    assert tp2.tp == 2 and tp2.weights_bytes == base.weights_bytes // 2
    assert tp2.kv_bytes_per_token == base.kv_bytes_per_token / 2


def test_decode_is_memory_bound_and_moe_reads_only_active_experts():
    h100 = get_gpu("H100-80GB")
    est = estimate(replace(LLAMA8, concurrency=1, input_len=128, output_len=128))
    weights_read = est.weights_bytes - 128256 * 4096 * 2  # the input embedding is a lookup, not a read
    ideal = h100.bandwidth_bytes_s * 0.8 / weights_read
    assert est.decode_tokens_per_s_per_seq == pytest.approx(ideal, rel=0.02)
    mixtral = estimate(
        PlanRequest(
            model="mistralai/Mixtral-8x7B-Instruct-v0.1",
            gpu="H200",
            concurrency=1,
            max_model_len=8192,
            input_len=128,
            output_len=128,
        )
    )
    # batch 1 reads the 2 routed experts of 8 (12.9B active parameters), not all 46.7B
    h200 = get_gpu("H200")
    active_read = (mixtral.params_active - 32000 * 4096) * 2
    assert mixtral.decode_tokens_per_s_per_seq == pytest.approx(
        h200.bandwidth_bytes_s * 0.8 / active_read, rel=0.02
    )
    assert mixtral.decode_tokens_per_s_per_seq > 3 * h200.bandwidth_bytes_s * 0.8 / mixtral.weights_bytes


def test_a_model_that_does_not_fit_is_an_answer_with_fixes():
    est = estimate(PlanRequest(model="meta-llama/Llama-3.1-70B-Instruct", gpu="L40S", max_model_len=8192))
    assert not est.fits and "exceed" in est.fit_reason
    assert any("TP=" in fix for fix in est.fixes) and any("quantize to" in fix for fix in est.fixes)
    for fix in est.fixes:  # each suggested TP actually fits
        if "TP=" in fix:
            tp = int(fix.split("TP=")[1].split()[0])
            assert estimate(PlanRequest(model=est.model, gpu="L40S", max_model_len=8192, num_gpus=tp)).fits


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(num_gpus=0), r"num_gpus must be an integer >= 1"),
        (dict(num_gpus=-2), r"num_gpus must be an integer >= 1"),
        (dict(gpu_memory_utilization=0.0), r"gpu_memory_utilization must be in \(0, 1\]"),
        (dict(gpu_memory_utilization=1.5), r"gpu_memory_utilization must be in \(0, 1\]"),
        (dict(max_model_len=200_000), r"max_model_len must be an integer in \[1, 131072\]"),
        (dict(input_len=8000, output_len=1000), r"exceeds max_model_len 8192"),
        (dict(gpu="H900"), r"unknown GPU 'H900'; choose one of: .*H100-80GB"),
        (dict(quant="int3"), r"unknown quantization 'int3'; choose one of: .*awq-int4"),
        (
            dict(num_gpus=3),
            r"tp=3 must divide the model's 32 attention heads; allowed: \[1, 2, 4, 8, 16, 32\]",
        ),
        (dict(num_gpus=4, tp=3), r"must be a multiple of tp x pp"),
        (dict(engine="foo"), r"unknown engine 'foo'; choose one of: vllm"),
    ],
)
def test_bad_input_names_the_allowed_range(changes, message):
    with pytest.raises(ValueError, match=message):
        estimate(replace(LLAMA8, **changes))


def test_engines_account_memory_their_own_way():
    sglang = estimate(replace(LLAMA8, engine="sglang", gpu_memory_utilization=0.88))
    assert sglang.kv_cache_bytes + sglang.weights_bytes == pytest.approx(
        sglang.gpu_memory_bytes * 0.88, abs=16 * sglang.kv_bytes_per_token
    )
    llama_cpp = estimate(
        PlanRequest(
            model="meta-llama/Llama-3.1-8B-Instruct",
            gpu="RTX-4090",
            engine="llamacpp",
            quant="gguf-q4_k_m",
            kv_cache_dtype="q4_0",
            max_model_len=8192,
            concurrency=4,
        )
    )
    assert llama_cpp.fits and llama_cpp.kv_cache_bytes == 4 * 8192 * llama_cpp.kv_bytes_per_token
    assert llama_cpp.kv_bytes_per_token == 32 * 2 * 8 * 128 * 0.5625
    warned = estimate(replace(LLAMA8, quant="gguf-q4_k_m", engine="trtllm"))
    assert any("trtllm does not load gguf-q4_k_m" in w for w in warned.warnings)


def test_compare_and_recommend():
    rows = compare_gpus(LLAMA8)
    assert [r.gpu for r in rows] == [g for g in list_gpus() if g != "CPU"]
    assert not next(r for r in rows if r.gpu == "T4").fits
    req = PlanRequest(model="Qwen/Qwen2.5-72B-Instruct", max_model_len=8192, concurrency=32)
    best = recommend(req)
    assert best is not None and best.fits and best.max_concurrency >= 32
    cheaper = [
        r
        for r in compare_gpus(replace(req, quant=best.quant, num_gpus=best.num_gpus, tp=best.tp))
        if r.fits and r.max_concurrency >= 32 and r.price_per_hour < best.price_per_hour
    ]
    assert cheaper == []
    fast = recommend(req, tpot_s=0.02)
    assert fast.tpot_s <= 0.02 and fast.price_per_hour >= best.price_per_hour
    assert recommend(req, tokens_per_s=1e9) is None


def test_recommendation_keeps_the_plans_quantization_unless_another_is_cheaper():
    """A Q4_1 GGUF: recommended as stored (bf16 would only dequantize it), with the chart's estimate for that
    GPU; a bf16 72B: AWQ is recommended because it is cheaper per hour, and the reason says so."""
    gguf = PlanRequest(model=str(packaged_gguf()), gpu="L4")
    advice = recommendation(gguf)
    assert advice.plan_quant == advice.best.quant == "gguf-q4_1" and not advice.changes_quant
    chart = next(r for r in compare_gpus(replace(gguf, gpu=advice.best.gpu)) if r.gpu == advice.best.gpu)
    assert advice.best.to_dict() == chart.to_dict()  # the chart's row, not another configuration
    big = recommendation(PlanRequest(model="Qwen/Qwen2.5-72B-Instruct", max_model_len=8192, concurrency=32))
    assert big.changes_quant and big.plan_quant == big.as_planned.quant == "bf16"
    assert get_quantization(big.best.quant).bits < 16
    assert big.best.price_per_hour < big.as_planned.price_per_hour
    reason = big.reason()
    assert f"${big.as_planned.price_per_hour:.2f}/h" in reason and big.best.quant in reason


def test_local_hardware_detection_answers_without_a_gpu():
    hw = detect_local_hardware()
    assert hw.ram_total_bytes > 0 and hw.cpu_cores_logical >= 1
    assert hw.gpus or hw.gpu_note  # no GPU is an answer with a reason


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "app.py", "estimate", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=__import__("pathlib").Path(__file__).resolve().parents[2],
    )


def test_cli_json_table_list_and_errors():
    out = _cli("--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "L4", "--max-model-len", "8192", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert (
        set(data) >= CLI_KEYS and data["fits"] is True and data["kv_bytes_per_token"] == 28 * 2 * 4 * 128 * 2
    )
    table = _cli("--model", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "L4")
    assert table.returncode == 0 and "fits              NO" in table.stdout and "fix" in table.stdout
    listing = _cli("--list-gpus")
    assert listing.returncode == 0 and "H100-80GB" in listing.stdout and "A100-80GB" in listing.stdout
    bad = _cli("--model", "meta-llama/Llama-3.1-8B-Instruct", "--num-gpus", "0")
    assert bad.returncode == 2 and "num_gpus must be an integer >= 1" in bad.stderr
