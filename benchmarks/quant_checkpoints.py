"""GPTQ and AWQ checkpoints of a dense model, written by a packer that follows the published layouts (no
tool here packs them on a CPU without a GPU), plus the dense model their dequantized weights make; and
compressed-tensors checkpoints written by compressed-tensors itself. Used by the tests and by
`python -m benchmarks.quantized_formats`.

Layouts (backend/engine/quantization/gptq_awq.py has the reader): GPTQ as AutoGPTQ / GPTQModel `pack`
write checkpoint_format "gptq" (qweight packs input rows, qzeros packs output columns and stores zero - 1,
fp16 scales, g_idx), AWQ as AutoAWQ `WQLinear_GEMM.from_linear` (qweight [k, n / 8] and qzeros packed
along output columns in the order 0 2 4 6 1 3 5 7). tests/engine/test_engine_gptq_awq.py checks pack_rows /
pack_columns byte for byte against vLLM's own gptq_pack / awq_pack (vLLM's test helpers).
Quantization is round-to-nearest per group (the packing, not GPTQ's error feedback, is what a loader
must get right); scales are rounded to fp16 before quantizing, so the dequantized reference is exact.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Scheme:
    method: str  # "gptq" | "awq"
    bits: int
    group_size: int  # -1: per channel
    desc_act: bool = False
    sym: bool = False

    @property
    def name(self) -> str:
        act = "-desc_act" if self.desc_act else ""
        kind = "sym" if self.sym else "asym"
        return f"{self.method}-w{self.bits}-g{self.group_size}{act}-{kind}"


def pack_rows(q: torch.Tensor, bits: int) -> torch.Tensor:
    """[k, n] ints -> [k / f, n] int32, row r * f + i at bits i * bits of row r (GPTQ qweight)."""
    f = 32 // bits
    q = q.to(torch.int64).reshape(-1, f, q.shape[1])
    packed = sum(q[:, i] << (bits * i) for i in range(f))
    return torch.as_tensor(packed).to(torch.uint32).view(torch.int32)


def pack_columns(q: torch.Tensor, bits: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """[m, n] ints -> [m, n / f] int32, column c * f + order[i] at bits i * bits of column c."""
    f = 32 // bits
    order = order or tuple(range(f))
    q = q.to(torch.int64).reshape(q.shape[0], -1, f)
    packed = sum(q[..., order[i]] << (bits * i) for i in range(f))
    return torch.as_tensor(packed).to(torch.uint32).view(torch.int32)


def quantize(w: torch.Tensor, scheme: Scheme, seed: int):
    """w [n, k] -> (q [k, n], zeros [groups, n], fp16 scales [groups, n], g_idx [k], dequantized [n, k])."""
    k = w.shape[1]
    maxq = (1 << scheme.bits) - 1
    size = k if scheme.group_size == -1 else scheme.group_size
    order = torch.randperm(k, generator=torch.Generator().manual_seed(seed)) if scheme.desc_act else None
    g_idx = torch.arange(k) // size
    if order is not None:  # GPTQ's act order: groups over the permuted input rows, g_idx maps back
        g_idx = torch.empty(k, dtype=torch.long).scatter_(0, order, torch.arange(k) // size)
    wt = w.t().float()  # [k, n]
    groups = k // size
    lo = torch.stack([wt[g_idx == g].amin(0) for g in range(groups)]).clamp(max=0)
    hi = torch.stack([wt[g_idx == g].amax(0) for g in range(groups)]).clamp(min=0)
    if scheme.sym:
        hi = torch.maximum(hi, -lo)
        lo = -hi
    scales = ((hi - lo).clamp(min=1e-5) / maxq).half()
    if scheme.sym:
        zeros = torch.full_like(scales, (maxq + 1) // 2, dtype=torch.int64)
    else:  # the "gptq" format stores zero - 1, so a zero of 0 cannot be written: 1 at least
        zeros = (-lo / scales.float()).round().clamp(1 if scheme.method == "gptq" else 0, maxq).long()
    q = (wt / scales.float()[g_idx]).round().long() + zeros[g_idx]
    q = q.clamp(0, maxq)
    dequantized = ((q - zeros[g_idx]).float() * scales.float()[g_idx]).t().contiguous()
    return q, zeros, scales, g_idx.int(), dequantized


def packed_tensors(prefix: str, w: torch.Tensor, scheme: Scheme, seed: int) -> tuple[dict, torch.Tensor]:
    q, zeros, scales, g_idx, dequantized = quantize(w, scheme, seed)
    if scheme.method == "gptq":
        tensors = {
            "qweight": pack_rows(q, scheme.bits),
            "qzeros": pack_columns(zeros - 1, scheme.bits),
            "scales": scales,
            "g_idx": g_idx,
        }
    else:
        tensors = {
            "qweight": pack_columns(q, scheme.bits, AWQ_ORDER),
            "qzeros": pack_columns(zeros, scheme.bits, AWQ_ORDER),
            "scales": scales,
        }
    return {f"{prefix}.{name}": t.contiguous() for name, t in tensors.items()}, dequantized


def quantization_config(scheme: Scheme) -> dict:
    if scheme.method == "gptq":
        return {"quant_method": "gptq", "bits": scheme.bits, "group_size": scheme.group_size,
                "desc_act": scheme.desc_act, "sym": scheme.sym, "checkpoint_format": "gptq"}  # fmt: skip
    return {"quant_method": "awq", "bits": 4, "group_size": scheme.group_size, "zero_point": True,
            "version": "gemm"}  # fmt: skip


def write_checkpoint(
    dense_folder: str, out: Path, scheme: Scheme, plain_dtype: torch.dtype = torch.float32
) -> torch.nn.Module:
    """The dense model's linears packed as scheme into out/, its other tensors in plain_dtype; returns the
    dequantized dense model (fp32)."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(dense_folder, dtype=torch.float32).eval()
    state = {name: t.detach().clone().contiguous() for name, t in model.state_dict().items()}
    packed_state: dict[str, torch.Tensor] = {}
    for index, name in enumerate(sorted(state)):
        prefix = name.removesuffix(".weight")
        if name.endswith(".weight") and prefix.rsplit(".", 1)[-1] in LINEARS:
            tensors, dequantized = packed_tensors(prefix, state[name], scheme, seed=index)
            packed_state |= tensors
            state[name] = dequantized
        else:
            packed_state[name] = state[name].to(plain_dtype)
    out.mkdir(parents=True, exist_ok=True)
    save_file(packed_state, str(out / "model.safetensors"))
    config = json.loads((Path(dense_folder) / "config.json").read_text())
    config["quantization_config"] = quantization_config(scheme)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for file in Path(dense_folder).iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "generation_config")):
            shutil.copy(file, out / file.name)
    model.load_state_dict(state)
    return model


# Runs in .venv-vllm (vLLM's CPU build brings compressed-tensors 0.17.0): compressed-tensors' own qparams
# (calculate_qparams from per-group / per-channel / per-tensor min and max) and compressors write the
# checkpoint, and the same compressors' decompress gives the dequantized dense weights.
CT_WRITER = """
import json, shutil, sys
from pathlib import Path
from safetensors.torch import load_file, save_file
from compressed_tensors.compressors import FloatQuantizationCompressor, PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme
from compressed_tensors.quantization.utils import calculate_qparams

src, out, deq = (Path(arg) for arg in sys.argv[1:4])
spec, linears = json.loads(sys.argv[4]), sys.argv[5].split(",")
fmt = spec.pop("format")
args = QuantizationArgs(**spec)
scheme = QuantizationScheme(targets=["Linear"], weights=args)
compressor = PackedQuantizationCompressor if fmt == "pack-quantized" else FloatQuantizationCompressor
state = load_file(src / "model.safetensors")
packed, dense = {}, dict(state)
for name, w in state.items():
    prefix = name.removesuffix(".weight")
    if not (name.endswith(".weight") and prefix.rsplit(".", 1)[-1] in linears):
        packed[name] = w
        continue
    if args.strategy == "group":
        view = w.reshape(w.shape[0], -1, args.group_size)
        mins, maxs = view.amin(-1), view.amax(-1)
    elif args.strategy == "channel":
        mins, maxs = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
    else:
        mins, maxs = w.amin().reshape(1), w.amax().reshape(1)
    scale, zero_point = calculate_qparams(mins, maxs, args)
    module = {"weight": w, "weight_scale": scale, "weight_zero_point": zero_point}
    compressed = compressor.compress(module, scheme)
    dense[name] = compressor.decompress(dict(compressed), scheme)["weight"].to(w.dtype)
    packed |= {f"{prefix}.{key}": value.contiguous() for key, value in compressed.items()}
config = json.loads((src / "config.json").read_text())
for folder, tensors in ((out, packed), (deq, dense)):
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "model.safetensors"))
    for file in src.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "generation_config")):
            shutil.copy(file, folder / file.name)
quant = QuantizationConfig(
    config_groups={"group_0": scheme}, format=fmt, ignore=["lm_head"], quantization_status="compressed"
)
(deq / "config.json").write_text(json.dumps(config))
config["quantization_config"] = json.loads(quant.model_dump_json()) | {"quant_method": "compressed-tensors"}
(out / "config.json").write_text(json.dumps(config, indent=2))
"""


def write_compressed_tensors(python: Path, dense_folder: str, out: Path, spec: dict) -> str:
    """A compressed-tensors checkpoint of the dense model in out/; returns the folder of its dequantized
    dense weights (decompressed by compressed-tensors itself)."""
    import subprocess

    deq = out.parent / f"{out.name}-dequantized"
    command = [
        str(python),
        "-c",
        CT_WRITER,
        dense_folder,
        str(out),
        str(deq),
        json.dumps(spec),
        ",".join(LINEARS),
    ]
    subprocess.run(command, check=True, timeout=300)
    return str(deq)
