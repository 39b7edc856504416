"""vLLM's memory terms one by one, each against the figure a published startup log printed for it
(tests/data/vllm_logs.yaml), and the version families that decide them (backend/planner/vllm_versions.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from backend.planner import PlanRequest, estimate
from backend.planner.catalog import GIB
from backend.planner.validation import load_runs
from backend.planner.vllm_versions import FAMILIES, family_for

ROOT = Path(__file__).resolve().parents[2]
RUNS = {r.id: r for r in load_runs()}


def terms_of(run_id: str) -> dict:
    est = estimate(RUNS[run_id].request())
    return {t.name: t for t in est.memory_terms}


def test_sort_sampler_term_matches_a_24_gb_log():
    """Qwen3-8B FP8 on a 24 GB card, vLLM 0.10.2 (sort sampler): 256 requests x 151,936 logits x 38 bytes
    = 1.38 GiB; the log's torch peak increase is 1.40 GiB (the sampler dominates a 2048-token forward)."""
    terms = terms_of("rtx4090-qwen3-8b-fp8-v0.11")
    assert terms["profile sampler"].bytes == 256 * 151936 * 38
    assert terms["profile sampler"].bytes / GIB == pytest.approx(1.40, abs=0.03)
    assert terms["profile forward pass"].bytes < terms["profile sampler"].bytes
    assert terms["activation peak"].bytes == terms["profile sampler"].bytes


def test_triton_sampler_term_matches_the_0_19_logs():
    """vLLM 0.19 on an H100 (1024 default sequences): Qwen3-8B logs 2.21 GiB, Llama-3.1-8B 1.89 GiB."""
    assert terms_of("llmdp-h100-qwen3-8b")["activation peak"].bytes / GIB == pytest.approx(2.21, rel=0.03)
    llama = terms_of("llmdp-h100-llama3.1-8b-kv-fp8")
    assert llama["activation peak"].bytes / GIB == pytest.approx(1.89, rel=0.02)
    assert (
        "1024 dummy requests" in llama["profile sampler"].how and "(sampler)" in llama["activation peak"].how
    )


def test_forward_term_is_per_rank_and_the_sampler_is_not():
    """At TP=2 the forward pass's MLP activations are sharded, the gathered logits are not."""
    tp1, tp2 = terms_of("llmdp-h100-qwen3-8b"), terms_of("llmdp-2xh100-qwen2.5-7b-tp2")
    assert tp2["profile sampler"].bytes == 1024 * 152064 * 15.5
    one = estimate(PlanRequest(model="Qwen/Qwen2.5-7B-Instruct", max_model_len=8192, vllm_version="0.19.0"))
    forward_tp1 = {t.name: t for t in one.memory_terms}["profile forward pass"].bytes
    assert tp2["profile forward pass"].bytes < forward_tp1 and tp1["budget"].bytes > 0


@pytest.mark.parametrize(
    ("run_id", "logged_gib"),
    [
        ("h100-llama3-8b-tp2-v0", 3.58),  # V0 0.6.4, TP=2 over NVLink (vllm#10511)
        ("2x4090-r1-distill-qwen-14b-tp2", 0.25),  # V0 0.7.2, TP=2 over PCIe (vllm#13061)
        ("llmd-2xh100-qwen3-32b-tp2", 0.54),  # 0.11.0, TP=2 on H100s (llm-d)
        ("llmdp-2xh100-llama3.1-8b-tp2", 2.07),  # 0.19.0, TP=2 on H100s
        ("llmdp-2xh100-llama3.1-8b-pp2", 0.07),  # 0.19.0, PP=2 alone
    ],
)
def test_non_torch_term_by_family_and_link(run_id, logged_gib):
    assert terms_of(run_id)["non-torch"].bytes / GIB == pytest.approx(logged_gib, abs=0.05)


def test_the_terms_add_up_to_the_kv_cache():
    """budget - every subtracted term = KV cache, to within one block (vLLM floors to whole blocks)."""
    for run_id in ("llmdp-h100-qwen3-8b", "rtx4090-qwen3-8b-fp8-v0.11", "l40s-qwen3-8b-awq-tp2-v0.17"):
        est = estimate(RUNS[run_id].request())
        terms = {t.name: t for t in est.memory_terms}
        left = terms["budget"].bytes - sum(t.bytes for t in est.memory_terms if t.subtracted)
        assert 0 <= left - est.kv_cache_bytes < est.kv_bytes_per_token * 16 + 1, run_id
    v21 = estimate(PlanRequest(model="Qwen/Qwen3-8B", max_model_len=8192, vllm_version="0.21.0"))
    graphs = {t.name: t for t in v21.memory_terms}["CUDA graphs"]
    assert graphs.subtracted and graphs.bytes > 0  # from 0.21 V1's estimate comes out of the budget


def test_families_are_ordered_and_each_cites_its_source():
    assert [f.since for f in FAMILIES] == sorted(f.since for f in FAMILIES)
    assert all(f.source for f in FAMILIES)
    assert family_for((0, 5, 4)).name.startswith("0.6") and not family_for((0, 7, 3)).is_v1
    assert family_for((0, 10, 1)).large_gpu_defaults and not family_for((0, 8, 5)).large_gpu_defaults
    assert family_for((0, 33, 0)).subtracts_cuda_graphs and not family_for((0, 20, 1)).subtracts_cuda_graphs
    # FlashInfer's sampler: off by default before 0.22 (unset = a pip install without FlashInfer up to
    # 0.11.0, then vllm#26859), on from 0.22 (vllm#40376)
    assert (
        not family_for((0, 21, 0)).flashinfer_sampler_default
        and family_for((0, 22, 0)).flashinfer_sampler_default
    )


def test_the_sampler_path_sets_the_profile_sampler_term():
    """The same run with FlashInfer's sampler and without: 14 bytes a logit against the sort's 38 (0.10)."""
    base = dict(model="Qwen/Qwen2.5-7B-Instruct", gpu="A100-80GB", vllm_version="0.10.1")
    terms = {}
    for fi in (True, False, None):
        est = estimate(PlanRequest(**base, flashinfer_sampler=fi, max_model_len=16384))
        terms[fi] = {t.name: t for t in est.memory_terms}["profile sampler"]
    logits = 256 * 152_064
    assert terms[True].bytes == int(logits * 14) and "FlashInfer" in terms[True].how
    assert terms[False].bytes == terms[None].bytes == int(logits * 38)


def test_custom_all_reduce_off_charges_the_nccl_only_non_torch():
    """TP=2 A100s without P2P (vLLM: "Custom allreduce is disabled") get the PCIe figure, not NVLink's."""
    base = dict(model="Qwen/Qwen2.5-7B-Instruct", gpu="A100-80GB", num_gpus=2, vllm_version="0.10.1")
    on = estimate(PlanRequest(**base, max_model_len=16384))
    off = estimate(PlanRequest(**base, max_model_len=16384, disable_custom_all_reduce=True))
    nt_on = {t.name: t for t in on.memory_terms}["non-torch"]
    nt_off = {t.name: t for t in off.memory_terms}["non-torch"]
    assert nt_on.bytes > nt_off.bytes and "NCCL only" in nt_off.how


ESTIMATE = [sys.executable, "app.py", "estimate", "--model", "Qwen/Qwen3-8B", "--max-model-len", "8192"]


def test_cli_json_reports_each_term_and_the_family():
    out = subprocess.run(
        [*ESTIMATE, "--vllm-version", "0.11.0", "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    names = [t["name"] for t in data["memory_terms"]]
    assert names == [
        "budget",
        "weights",
        "profile forward pass",
        "profile sampler",
        "activation peak",
        "non-torch",
        "CUDA graphs",
        "KV cache",
    ]
    assert data["vllm_family"] == "0.11-0.16"
    table = subprocess.run(
        ESTIMATE,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert "profile sampler" in table.stdout and "vLLM 0.29+" in table.stdout


def test_model_runner_v2_profiles_a_plain_sampler_and_keeps_penalty_bins():
    """Dense models on 0.25+ go through Model Runner V2: a 6-byte-a-logit dummy sampler (no top-k/top-p),
    max_num_seqs x vocabulary penalty bins at 4.125 bytes held all along, and no CUDA-graph estimate taken
    from the budget (profile_cudagraph_memory returns 0); MoE models stay on V1 until 0.29."""
    dense = estimate(
        PlanRequest(
            model="Qwen/Qwen3-32B",
            gpu="RTX-PRO-6000",
            num_gpus=2,
            max_model_len=32768,
            gpu_memory_utilization=0.426,
            vllm_version="0.27.1",
        )
    )
    terms = {t.name: t for t in dense.memory_terms}
    logits = 1024 * 151_936  # >= 70 GiB card: 1024 sequences
    assert terms["profile sampler"].bytes == int(logits * 6)
    assert terms["sampler state"].bytes == int(logits * 4.125)
    assert not terms["CUDA graphs"].subtracted
    moe = estimate(PlanRequest(model="Qwen/Qwen3-30B-A3B", max_model_len=8192, vllm_version="0.27.1"))
    moe_terms = {t.name: t for t in moe.memory_terms}
    assert "sampler state" not in moe_terms and moe_terms["CUDA graphs"].subtracted
    late = estimate(PlanRequest(model="Qwen/Qwen3-30B-A3B", max_model_len=8192, vllm_version="0.29.0"))
    assert "sampler state" in {t.name for t in late.memory_terms}


def test_v0_samples_the_profile_on_the_driver_even_with_chunked_prefill():
    """vLLM 0.7.2, TP=2 on RTX 4090s at 131,072 tokens (chunked prefill on): the driver worker samples the
    256 dummy requests (vllm/worker/model_runner.py profile_run, top_k = vocab - 1) and the engine keeps the
    smallest block count, so the refusal's 81,536 tokens sit 1.2 GiB under the other rank's 8.69 GiB line."""
    run = RUNS["2x4090-r1-distill-qwen-14b-tp2"]
    terms = terms_of(run.id)
    assert terms["profile sampler"].bytes == 256 * 152064 * 38
    assert terms["activation peak"].bytes == terms["profile sampler"].bytes
    est = estimate(run.request())
    assert est.kv_cache_bytes / GIB == pytest.approx(run.logged["kv_tokens"] * 96 / 1024**2, rel=0.05)
    assert not est.fits


def test_an_unlisted_gpu_serves_the_published_runs_but_no_plan_offers_it():
    """The memory-modified RTX 2080 Ti 22GB: get_gpu finds it (runs 4x2080ti22g-*), list_gpus leaves it out
    of charts and recommendations; Turing stays on V0 before 0.11."""
    from backend.planner.catalog import get_gpu, list_gpus

    assert "RTX-2080Ti-22GB" not in list_gpus() and {"RTX-4080", "RTX-6000-Ada"} <= set(list_gpus())
    assert get_gpu("RTX-2080Ti-22GB").usable_bytes == int(21.66 * GIB)
    req = PlanRequest(model="Qwen/Qwen3-30B-A3B", gpu="RTX-2080Ti-22GB", num_gpus=4, vllm_version="0.8.5")
    assert "V0" in estimate(req).vllm_family
