"""Quality (backend/quality): perplexity, KL and top-1 agreement equal the same figures computed directly
from transformers' fp32 logits on the same chunks (second halves only, as llama.cpp scores them); a model
against itself has KL 0 and 100% agreement; a quantized model (GPTQ) and fp8 KV have KL > 0; the CLI
writes its table and JSON and refuses bad input with a clear message."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from app import main as app_main
from backend.errors import UserError
from backend.quality.config import QualityConfig
from backend.quality.measure import run_quality
from backend.quality.specs import parse_spec
from backend.quality.text import DEFAULT_TEXT, make_chunks, read_text, shipped_text
from tests.engine_utils import tiny_model
from tests.quant_pack_utils import tiny_dense_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CTX, CHUNKS = 64, 3
TOLERANCE = 1e-4


def fp32(arch: str) -> str:
    return f"{tiny_model(arch)[0]}@dtype=float32,device=cpu"


def hand_figures(folder: str, reference, model, chunks: int = CHUNKS) -> dict[str, float]:
    """The figures computed directly from transformers' fp32 logits of the two models: each chunk of CTX
    tokens of the shipped text, positions CTX/2 .. CTX-2 scored, plain formulas (numpy's percentile)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(shipped_text())["input_ids"]
    nll, nll_ref, kld, same = [], [], [], []
    for i in range(chunks):
        chunk = torch.tensor([ids[i * CTX : (i + 1) * CTX]])
        with torch.inference_mode():
            p = reference(chunk).logits[0].double().log_softmax(-1)
            q = model(chunk).logits[0].double().log_softmax(-1)
        for position in range(CTX // 2, CTX - 1):
            target = int(chunk[0, position + 1])
            nll.append(-float(q[position, target]))
            nll_ref.append(-float(p[position, target]))
            kld.append(float((p[position].exp() * (p[position] - q[position])).sum()))
            same.append(int(p[position].argmax()) == int(q[position].argmax()))
    return {
        "count": len(nll),
        "ln_ppl": float(np.mean(nll)),
        "ln_ppl_error": float(np.std(nll) / math.sqrt(len(nll) - 1)),
        "ln_ppl_ref": float(np.mean(nll_ref)),
        "kld_mean": float(np.mean(kld)),
        "kld_median": float(np.median(kld)),
        "kld_p99": float(np.percentile(kld, 99)),
        "same": float(np.mean(same)),
    }


def test_figures_equal_the_ones_computed_from_transformers_logits():
    config = QualityConfig(model=(fp32("llama_mqa_tied"),), reference=fp32("llama"), ctx=CTX, chunks=CHUNKS)
    report = run_quality(config)
    hand = hand_figures(tiny_model("llama")[0], tiny_model("llama")[1], tiny_model("llama_mqa_tied")[1])
    (result,) = report.results
    assert report.num_chunks == CHUNKS and report.tokens_per_chunk == CTX - 1 - CTX // 2
    assert result.num_tokens == hand["count"] == CHUNKS * (CTX // 2 - 1)  # second halves only
    assert math.log(result.ppl) == pytest.approx(hand["ln_ppl"], abs=TOLERANCE)
    assert result.ppl_uncertainty / result.ppl == pytest.approx(hand["ln_ppl_error"], abs=TOLERANCE)
    assert math.log(result.reference_ppl) == pytest.approx(hand["ln_ppl_ref"], abs=TOLERANCE)
    assert result.ln_ppl_ratio == pytest.approx(hand["ln_ppl"] - hand["ln_ppl_ref"], abs=TOLERANCE)
    assert result.kld_kind == "exact"
    assert result.kld_mean == pytest.approx(hand["kld_mean"], abs=TOLERANCE)
    assert result.kld_median == pytest.approx(hand["kld_median"], abs=TOLERANCE)
    assert result.kld_p99 == pytest.approx(hand["kld_p99"], abs=TOLERANCE)
    assert result.same_top_p == pytest.approx(hand["same"], abs=1e-9)
    assert hand["kld_mean"] > 0.1  # two different models: the test can tell


def test_a_model_against_itself_has_kl_zero_and_full_agreement():
    spec = fp32("llama")
    (result,) = run_quality(QualityConfig(model=(spec,), reference=spec, ctx=CTX, chunks=2)).results
    assert result.kld_kind == "exact" and result.kld_max == 0.0 and result.kld_mean == 0.0
    assert result.same_top_p == 1.0 and result.ln_ppl_ratio == 0.0 and result.rms_delta_p == 0.0
    assert result.ppl == result.reference_ppl


def test_quantized_weights_and_fp8_kv_have_kl_above_zero(tmp_path):
    """GPTQ run as stored against the dense model: KL, PPL and top-1 as transformers computes them from
    the checkpoint's dequantized weights; fp8 KV: KL above zero."""
    from transformers import AutoModelForCausalLM

    from benchmarks.quant_checkpoints import Scheme, write_checkpoint

    dense = tiny_dense_model(tmp_path / "dense")
    dequantized = write_checkpoint(dense, tmp_path / "gptq", Scheme("gptq", 4, 128, sym=True))
    config = QualityConfig(
        model=(f"{tmp_path / 'gptq'}@dtype=float32", f"{dense}@dtype=float32,kv=fp8"),
        reference=f"{dense}@dtype=float32",
        ctx=CTX,
        chunks=2,
    )
    report = run_quality(config)
    gptq, fp8_kv = report.results
    dense_model = AutoModelForCausalLM.from_pretrained(dense, dtype=torch.float32).eval()
    hand = hand_figures(dense, dense_model, dequantized, chunks=2)
    assert math.log(gptq.ppl) == pytest.approx(hand["ln_ppl"], abs=TOLERANCE)
    assert gptq.kld_mean == pytest.approx(hand["kld_mean"], abs=TOLERANCE)
    assert gptq.same_top_p == pytest.approx(hand["same"], abs=1e-9)
    assert 0 < hand["same"] < 1
    assert report.models[0].quantization and report.models[0].quantization.startswith("gptq")
    assert report.models[1].kv_cache_dtype == "fp8" and report.reference.kv_cache_dtype == "auto"
    for result in (gptq, fp8_kv):
        assert result.kld_kind == "exact" and result.kld_mean > 1e-4 and result.kld_p99 >= result.kld_median


def test_cli_writes_the_table_and_json(tmp_path, capsys):
    out = tmp_path / "quality.json"
    spec = fp32("llama")
    argv = ["quality", "--reference", spec, "--model", spec, "--model", fp32("llama_mqa_tied")]
    assert app_main([*argv, "--ctx", "32", "--chunks", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "(reference)" in printed and "same top-1" in printed and fp32("llama_mqa_tied") in printed
    data = json.loads(out.read_text())
    assert data["n_ctx"] == 32 and data["num_chunks"] == 2 and data["tokens_per_chunk"] == 15
    assert [r["model"] for r in data["results"]] == [spec, fp32("llama_mqa_tied")]
    assert data["results"][0]["kld_mean"] == 0.0 and data["results"][1]["kld_mean"] > 0
    assert data["reference"]["dtype"] == "float32" and data["text_source"].endswith("CC0 1.0)")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "default"], "give --model and --reference together"),
        (["--reference", "default", "--model", "default@bogus=1"], "unknown option 'bogus=1'"),
        (["--reference", "default", "--model", "default@kv=fp4"], "kv_cache_dtype must be one of"),
        (["--reference", "default", "--model", "default@block_size=x"], "block_size takes an integer"),
        (["--reference", "default", "--model", "default", "--ctx", "4"], "ctx must be in [8, 8192]"),
        (["--reference", "default", "--model", "m", "--text", "/nonexistent"], "is not a file"),
    ],
)
def test_cli_refuses_bad_input(argv, message, capsys):
    assert app_main(["quality", *argv]) == 2
    assert message in capsys.readouterr().err


def test_text_shorter_than_two_chunks_is_refused():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model("llama")[0])
    text, source = read_text(None)
    assert len(tokenizer(text)["input_ids"]) >= 3000  # the shipped text: a few thousand tokens
    assert text.startswith("The Keeper of the Small Light\n") and "CC0 1.0" in DEFAULT_TEXT.read_text()
    with pytest.raises(UserError, match=r"needs at least 10000 \(two chunks\)"):
        make_chunks(tokenizer, text, source, 5000)


def test_specs_carry_engine_options():
    spec = parse_spec("model.gguf@dequantized,kv=fp8,dtype=float32,block_size=32")
    assert spec.model == "model.gguf"
    assert spec.options == {
        "dequantize_weights": True,
        "kv_cache_dtype": "fp8",
        "dtype": "float32",
        "block_size": 32,
    }
    kwargs = spec.engine_kwargs(512, {"dtype": "bfloat16", "kv_cache_dtype": "auto"})
    assert kwargs["dtype"] == "float32" and kwargs["kv_cache_dtype"] == "fp8"  # the spec wins
    assert kwargs["max_model_len"] == 513 and kwargs["num_kv_blocks"] == 18  # one chunk's sequence
    assert parse_spec("default", default_model="/m.gguf").model == "/m.gguf"
