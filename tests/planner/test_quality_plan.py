"""Plan's measured quality (backend/quality/plan_figures.py): what is offered for each kind of local
checkpoint, a measurement of a tiny dense model whose figures equal app.py quality's on the same specs,
the cache read back (and missed once the model changes), and the panel's text for a model not here."""

from __future__ import annotations

import json

import pytest

from backend.errors import UserError
from backend.quality import plan_figures
from backend.quality.config import QualityConfig
from backend.quality.measure import run_quality
from tests.quant_pack_utils import tiny_dense_model
from ui import plan_tab

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CTX, CHUNKS = 32, 2


def test_offers_follow_the_checkpoint(tmp_path):
    gguf = tmp_path / "m.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")  # offers look at the path only
    run = plan_figures.plan_run(str(gguf))
    assert run.reference == ("dequantized", f"{gguf}@dequantized")
    assert run.offered == [("as stored", str(gguf)), ("as stored, fp8 KV", f"{gguf}@kv=fp8")]
    quantized = tmp_path / "gptq"
    quantized.mkdir()
    (quantized / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "gptq"}}))
    assert plan_figures.plan_run(str(quantized)).offered == [("as stored, fp8 KV", f"{quantized}@kv=fp8")]
    with pytest.raises(UserError, match="needs the model on this machine"):
        plan_figures.plan_run("meta-llama/Llama-3.1-8B-Instruct")
    assert "needs the model on this machine" in plan_tab.quality_view("meta-llama/Llama-3.1-8B-Instruct")


def test_a_dense_models_measurement_is_cached_and_equals_app_py_quality(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    dense = tiny_dense_model(tmp_path / "dense")
    assert plan_figures.cached(dense, CTX, CHUNKS) is None
    assert "Not measured yet" in plan_figures.view(dense)
    data = plan_figures.measure(dense, ctx=CTX, chunks=CHUNKS)
    assert [m["label"] for m in data["models"]] == [spec for _, spec in plan_figures.plan_run(dense).offered]
    assert plan_figures.cached(dense, CTX, CHUNKS) == json.loads(json.dumps(data))
    # the same figures as app.py quality on the same specs
    config = QualityConfig(
        model=tuple(m["label"] for m in data["models"]),
        reference=f"{dense}@dtype=float32",
        ctx=CTX,
        chunks=CHUNKS,
    )
    for mine, direct in zip(data["results"], run_quality(config).results, strict=True):
        assert mine["ppl"] == pytest.approx(direct.ppl, rel=1e-9)
        assert mine["kld_mean"] == pytest.approx(direct.kld_mean, rel=1e-9)
    bf16, fp16, fp8_kv = data["results"]
    assert 0 < fp16["kld_mean"] < bf16["kld_mean"]  # fp16 keeps 3 more mantissa bits than bf16
    assert fp8_kv["kld_mean"] > 0 and data["models"][2]["kv_cache_dtype"] == "fp8"
    table = plan_figures.table_markdown(data)
    assert "| fp32 (reference) | float32 weights, KV float32 |" in table
    assert f"| bf16 | bfloat16 weights, KV bfloat16 | {bf16['ppl']:.3f} |" in table
    # a changed checkpoint is a cache miss
    (tmp_path / "dense" / "config.json").touch()
    assert plan_figures.cached(dense, CTX, CHUNKS) is None


def test_a_public_app_measures_nothing_and_names_no_path(tmp_path):
    from types import SimpleNamespace

    from backend.public_policy import PublicPolicy

    ctx = SimpleNamespace(policy=PublicPolicy(is_public=True), default_model="/bundled/model.gguf")
    dense = tiny_dense_model(tmp_path / "dense")
    assert "local paths and files are not allowed" in plan_tab.quality_view(dense, ctx)
    assert "Not measured yet" in plan_tab.quality_view(dense)  # the owner's app names paths
    assert "shows cached figures only" in plan_tab.measure_quality(dense, ctx=ctx)
