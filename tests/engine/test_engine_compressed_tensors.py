"""compressed-tensors checkpoints written by compressed-tensors itself (W4A16 / W8A16 pack-quantized, fp8
float-quantized per channel and per tensor) run as stored: greedy tokens equal transformers' on the
weights compressed-tensors' own decompress gives back."""

from __future__ import annotations

import pytest
import torch

from backend.engine import LLM, SamplingParams
from backend.engine.quantization.quantized_linear import QuantizedLinear
from backend.engine.quantization.row_packed import RowPacked
from benchmarks.quant_checkpoints import write_compressed_tensors
from tests.common_utils import ROOT
from tests.engine_utils import assert_engine_clean, hf_greedy, prompts
from tests.quant_pack_utils import NATIVE, count_calls

pytestmark = pytest.mark.usefixtures("one_torch_thread")
INT = dict(format="pack-quantized", type="int")
FP8 = dict(format="float-quantized", type="float", num_bits=8, symmetric=True)
SPECS = {
    "w4a16-group128-sym": INT | dict(num_bits=4, symmetric=True, strategy="group", group_size=128),
    "w4a16-group32-asym": INT | dict(num_bits=4, symmetric=False, strategy="group", group_size=32),
    "w8a16-channel-sym": INT | dict(num_bits=8, symmetric=True, strategy="channel"),
    "fp8-channel": FP8 | dict(strategy="channel"),
    "fp8-tensor": FP8 | dict(strategy="tensor"),
}
TOKENS = 12


@pytest.mark.parametrize("name", SPECS)
def test_checkpoint_by_compressed_tensors_runs_as_stored_and_matches_its_decompressed_weights(
    name, dense_folder, tmp_path, monkeypatch
):
    calls = count_calls(monkeypatch, "packed_gemv")
    from transformers import AutoModelForCausalLM

    python = ROOT / ".venv-vllm" / "bin" / "python"
    if not python.exists():
        pytest.fail("no .venv-vllm (it brings compressed-tensors): run `make vllm` (make test does it first)")
    spec = SPECS[name]
    dequantized = write_compressed_tensors(python, dense_folder, tmp_path / name, dict(spec))
    reference = AutoModelForCausalLM.from_pretrained(dequantized, dtype=torch.float32).eval()
    llm = LLM(str(tmp_path / name), dtype="float32", device="cpu", max_num_batched_tokens=32)
    assert llm.stats().quantization.startswith(f"compressed-tensors {spec['format']}")
    layers = [m for m in llm.llm_engine.runner.model.modules() if isinstance(m, QuantizedLinear)]
    assert len(layers) == 2 * 4
    kind = "fp8" if spec["format"] == "float-quantized" else f"w{spec['num_bits']}"
    assert all(isinstance(p, RowPacked) and p.kind == kind for m in layers for p in m.parts)
    assert all(m.has_gemv and m.use_kernel == NATIVE for m in layers)
    batch = prompts(lengths=(1, 9, 17, 40), seed=6)
    outs = llm.generate(batch, SamplingParams(temperature=0.0, max_tokens=TOKENS))
    for prompt, out in zip(batch, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(reference, prompt, TOKENS)
    assert_engine_clean(llm)
    assert (calls[0] > 0) == NATIVE  # decode steps went through the packed_rows GEMV kernel
