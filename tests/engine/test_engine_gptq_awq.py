"""GPTQ and AWQ (GEMM) checkpoints run as stored: greedy tokens equal transformers' on the dequantized dense
model, and the engine's own dequantize-at-load path; the packer the checkpoints are written with matches
vLLM's gptq_pack / awq_pack byte for byte, so the loader is checked against an independent layout."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from backend.engine import LLM, SamplingParams
from backend.engine.quantization.quantized_linear import QuantizedLinear
from backend.engine.quantization.row_packed import RowPacked
from benchmarks.quant_checkpoints import (
    AWQ_ORDER,
    Scheme,
    pack_columns,
    pack_rows,
    write_checkpoint,
)
from tests.common_utils import ROOT
from tests.engine_utils import assert_engine_clean, hf_greedy, prompts
from tests.quant_pack_utils import NATIVE, count_calls

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SCHEMES = [
    Scheme("gptq", 4, 128, desc_act=False, sym=True),
    Scheme("gptq", 4, 32, desc_act=True, sym=False),
    Scheme("gptq", 4, -1, desc_act=False, sym=False),
    Scheme("gptq", 8, 64, desc_act=True, sym=True),
    Scheme("gptq", 8, -1, desc_act=False, sym=False),
    Scheme("awq", 4, 128),
    Scheme("awq", 4, 64),
]
TOKENS = 12


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.name)
def test_checkpoint_runs_as_stored_and_matches_transformers_on_its_dequantized_weights(
    scheme, dense_folder, tmp_path, monkeypatch
):
    calls = count_calls(monkeypatch, "packed_gemv")
    reference = write_checkpoint(dense_folder, tmp_path / scheme.name, scheme)
    batch = prompts(lengths=(1, 9, 17, 40), seed=5)
    params = SamplingParams(temperature=0.0, max_tokens=TOKENS)
    llm = LLM(str(tmp_path / scheme.name), dtype="float32", device="cpu", max_num_batched_tokens=32)
    layers = [m for m in llm.llm_engine.runner.model.modules() if isinstance(m, QuantizedLinear)]
    assert len(layers) == 2 * 4  # qkv, o, gate_up, down in each of 2 layers
    kind = f"w{scheme.bits}"  # re-laid out for the packed_rows kernels, which decoding uses
    assert all(
        isinstance(p, RowPacked) and (p.source, p.kind) == (scheme.method, kind)
        for m in layers
        for p in m.parts
    )
    assert all(m.has_gemv and m.use_kernel == NATIVE for m in layers)
    assert llm.stats().quantization.startswith(scheme.method)
    outs = llm.generate(batch, params)
    for prompt, out in zip(batch, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(reference, prompt, TOKENS)
    assert_engine_clean(llm)
    assert (calls[0] > 0) == NATIVE
    dense = LLM(str(tmp_path / scheme.name), dtype="float32", device="cpu", dequantize_weights=True)
    assert dense.stats().quantization is None
    assert dense.stats().weights_bytes > llm.stats().weights_bytes
    assert [o.outputs[0].token_ids for o in dense.generate(batch, params)] == [
        o.outputs[0].token_ids for o in outs
    ]


@pytest.mark.parametrize("scheme", [SCHEMES[0], SCHEMES[5]], ids=lambda s: s.name)
def test_planner_counts_the_bytes_the_engine_holds(scheme, dense_folder, tmp_path):
    from backend.planner import PlanRequest, estimate
    from backend.planner.catalog import LOCAL_CPU

    write_checkpoint(dense_folder, tmp_path / "q", scheme, plain_dtype=torch.bfloat16)
    stats = LLM(str(tmp_path / "q"), dtype="bfloat16", device="cpu").stats()
    plan = (
        estimate(  # this machine's CPU: without bf16 units the engine keeps fp32 copies of dense weights too
            PlanRequest(
                model=str(tmp_path / "q"),
                gpu=LOCAL_CPU,
                engine="embedded",
                quant="auto",
                input_len=64,
                output_len=64,
            )
        )
    )
    assert not any("dequantizes" in w for w in plan.warnings)
    assert plan.weights_bytes == pytest.approx(stats.weights_bytes, rel=1e-3)


def test_unsupported_quantization_is_refused_with_what_runs(dense_folder, tmp_path):
    write_checkpoint(dense_folder, tmp_path / "q", Scheme("gptq", 4, 128))
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes"}
    (tmp_path / "q" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"Unsupported quantization 'bitsandbytes'.*gptq, awq"):
        LLM(str(tmp_path / "q"), device="cpu")


VLLM_PACK = """
import sys, torch
from vllm.model_executor.layers.quantization.utils.quant_utils import awq_pack, gptq_pack
q = torch.load(sys.argv[1])
out = {}
for bits in (4, 8):
    w = q[bits]
    out[f"gptq{bits}"] = gptq_pack(w, bits, *w.shape)
out["awq4"] = awq_pack(q[4], 4, *q[4].shape)
torch.save(out, sys.argv[2])
"""


def test_packers_match_vllms_gptq_pack_and_awq_pack(tmp_path):
    python = ROOT / ".venv-vllm" / "bin" / "python"
    if not python.exists():
        pytest.fail("no .venv-vllm: run `make vllm` (make test does it first)")
    gen = torch.Generator().manual_seed(0)
    q = {bits: torch.randint(0, 1 << bits, (64, 48), generator=gen, dtype=torch.int32) for bits in (4, 8)}
    torch.save(q, tmp_path / "q.pt")
    subprocess.run(
        [str(python), "-c", VLLM_PACK, str(tmp_path / "q.pt"), str(tmp_path / "packed.pt")],
        check=True,
        timeout=300,
    )
    theirs = torch.load(tmp_path / "packed.pt")
    for bits in (4, 8):
        assert torch.equal(pack_rows(q[bits], bits), theirs[f"gptq{bits}"])
    assert torch.equal(pack_columns(q[4], 4, AWQ_ORDER), theirs["awq4"])
