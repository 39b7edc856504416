"""Loading a model: a local HF folder (sharded safetensors), a GGUF file, or a Hub id.

GGUF files keep their quantized tensors as stored (quantization/), unless dequantize_weights: then
transformers (the reference implementation) dequantizes the whole file and we take its state dict.
GPTQ and AWQ folders (config.json's quantization_config) keep their packed linears as stored too, or
have them dequantized to float32 at load with dequantize_weights.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from backend.engine.gguf_cache import config_and_tokenizer
from backend.engine.load_phases import LoadPhases
from backend.engine.models.base import CausalLM
from backend.engine.models.registry import model_class, resolve_architecture, supported_architectures
from backend.engine.quantization import mxfp4
from backend.engine.quantization.compressed_tensors import Fp8Weight, take_compressed, weight_args
from backend.engine.quantization.gguf_reader import QuantizedWeight, read_gguf_tensors
from backend.engine.quantization.gptq_awq import METHODS, PackedWeight, take_packed
from backend.engine.quantization.install import install_quantized
from backend.engine.quantization.quantized_linear import Part, dequantize_part
from backend.errors import ModelNotFound
from backend.model_limits import check_config, read_config_json
from backend.model_names import served_model_name
from backend.model_support import refuse_unsupported

SUPPORTED_ARCHITECTURES = supported_architectures()  # models/registry.py
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
HUB_ALLOW_PATTERNS = ("*.json", "*.safetensors", "tokenizer*", "*.txt")  # what a Hub model download fetches


@dataclass(slots=True)
class LoadedModel:
    model: CausalLM
    hf_config: Any
    tokenizer: Any
    name: str
    eos_token_ids: list[int]
    quantization: str | None = None  # e.g. "gguf Q4_1 (210 tensors), Q8_0 (1)": what runs quantized


def resolve_model(model: str) -> tuple[str, str | None]:
    """(folder, gguf_file or None) for a local path or a Hub id (downloaded); clear errors otherwise."""
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotFound(f"Model path not found: {model} (no such GGUF file)")
        return str(path.parent), path.name
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFound(f"Model folder {model} has no config.json (not a Hugging Face model folder)")
        return str(path), None
    if path.exists() or not _HUB_ID.match(model):
        raise ModelNotFound(
            f"Model path not found: {model} (expected a local model folder, a .gguf file or a Hub id)"
        )
    refuse_unsupported(model)  # config.json alone first: an architecture we cannot run downloads nothing
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(model, allow_patterns=list(HUB_ALLOW_PATTERNS))
    except Exception as exc:
        raise OSError(
            f"Could not download {model} from the Hugging Face Hub ({type(exc).__name__}: {exc}). "
            "The Hub may be unreachable or offline; pass a local model folder or a .gguf file instead."
        ) from exc
    return folder, None


def architecture_of(hf_config: Any) -> str:
    """The registered architecture that runs hf_config (ValueError naming the supported ones)."""
    return resolve_architecture(hf_config)


def read_gguf(folder: str, gguf_file: str, trust_remote_code: bool) -> tuple[Any, dict[str, torch.Tensor]]:
    """(config, dequantized fp32 state dict) of a GGUF file, from one read of it by transformers."""
    from transformers import AutoModelForCausalLM

    hf_model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=gguf_file, dtype=torch.float32, trust_remote_code=trust_remote_code
    )
    return hf_model.config, hf_model.state_dict()


def part_kind(part: Part) -> str:
    if isinstance(part, QuantizedWeight):
        return part.qtype.upper()
    return f"{part.bits}-bit" if isinstance(part, PackedWeight) else "fp8 e4m3"


def describe_quantization(quantized: dict[str, Part], hf_config: Any = None) -> str | None:
    """What runs quantized, e.g. "gguf Q4_1 (210 tensors)", "gptq (group 128) 4-bit (14 tensors)"."""
    counts = Counter(part_kind(part) for part in quantized.values())
    if not counts:
        return None
    method = "gguf"
    if not any(isinstance(part, QuantizedWeight) for part in quantized.values()):
        config = hf_config.quantization_config
        method = config["quant_method"]
        if method == "compressed-tensors":
            args = weight_args(config)
            group = f" {args['group_size']}" if args["strategy"] == "group" else ""
            method += f" {config['format']} ({args['strategy']}{group})"
        else:
            group = config.get("group_size", config.get("q_group_size"))
            method += f" (group {'per-channel' if group == -1 else group})"
    return f"{method} " + ", ".join(f"{t} ({n} tensor{'' if n == 1 else 's'})" for t, n in counts.items())


def read_packed(state: dict[str, torch.Tensor], hf_config: Any, dequantize_weights: bool) -> dict[str, Part]:
    """The GPTQ / AWQ / compressed-tensors linears of state as stored (taken out of state), or dequantized
    into state."""
    config = getattr(hf_config, "quantization_config", None)
    if not config:
        return {}
    method = config.get("quant_method")
    if method == "gguf":  # transformers writes this when it saves a model loaded from a GGUF: dense tensors
        return {}
    if method == mxfp4.QTYPE:  # gpt-oss's experts: the MoE block keeps their blocks as stored (models/moe.py)
        if dequantize_weights:
            mxfp4.dequantize_checkpoint(state)
        return {}
    if method not in METHODS:
        raise ValueError(
            f"Unsupported quantization {method!r} in config.json; the engine runs {', '.join(METHODS)} and "
            "gpt-oss's mxfp4 checkpoints and GGUF files (or use vLLM for this one)"
        )
    take = take_compressed if method == "compressed-tensors" else take_packed
    packed: dict[str, Part] = dict(take(state, config))
    if dequantize_weights:
        state |= {name: dequantize_part(weight) for name, weight in packed.items()}
        return {}
    return packed


def read_state_dict(folder: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    root = Path(folder)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in root.glob("*.safetensors"))
    if files:
        state: dict[str, torch.Tensor] = {}
        for name in files:
            state.update(load_file(root / name))
        return state
    bins = sorted(root.glob("pytorch_model*.bin"))
    if not bins:
        raise ModelNotFound(f"No *.safetensors or pytorch_model*.bin weights in {folder}")
    state = {}
    for file in bins:
        state.update(torch.load(file, map_location="cpu", weights_only=True))
    return state


def load_model(
    model: str,
    dtype: torch.dtype,
    device: torch.device,
    trust_remote_code: bool = False,
    dequantize_weights: bool = False,
    phases: LoadPhases | None = None,
) -> LoadedModel:
    phases = phases if phases is not None else LoadPhases()
    folder, gguf_file = resolve_model(model)
    with phases.phase("read config and tokenizer"):
        hf_config, tokenizer = read_config_and_tokenizer(folder, gguf_file, trust_remote_code)
        architecture_of(hf_config)  # fail fast, before reading weights
    quantized: dict[str, Part] = {}
    kept_mxfp4 = 0  # gpt-oss's MXFP4 expert tensors, which the MoE blocks keep as stored
    with phases.phase("read weights"):
        if gguf_file:  # quantized tensors kept as stored, or decoded
            path = str(Path(folder) / gguf_file)
            state, gguf_quantized = read_gguf_tensors(path, hf_config, keep_blocks=not dequantize_weights)
            quantized = dict(gguf_quantized)
        else:
            state = read_state_dict(folder)
            quantized = read_packed(state, hf_config, dequantize_weights)
            kept_mxfp4 = len(mxfp4.checkpoint_experts(state))
    with phases.phase("build model and install weights"):
        net = build_model(hf_config, state, quantized, dtype, device)
    eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    eos |= generation_eos(folder, gguf_file, hf_config)
    # the name the server answers to: the GGUF's model name as llama.cpp names files (the export serves it)
    name = served_model_name(gguf_file) if gguf_file else Path(model.rstrip("/")).name
    description = describe_quantization(quantized, hf_config)
    if kept_mxfp4:
        description = f"mxfp4 MXFP4 ({kept_mxfp4} expert tensors)"
    return LoadedModel(net.eval(), hf_config, tokenizer, name, sorted(eos), description)


def read_config_and_tokenizer(folder: str, gguf_file: str | None, trust_remote_code: bool) -> tuple[Any, Any]:
    """A GGUF's from the conversion cache (gguf_cache.py); a folder's as transformers reads them."""
    from transformers import AutoConfig, AutoTokenizer

    if gguf_file:
        return config_and_tokenizer(str(Path(folder) / gguf_file), trust_remote_code)[:2]
    check_config(read_config_json(Path(folder) / "config.json"))  # bounded before transformers reads it
    config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    return config, AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)


def build_model(
    hf_config: Any,
    state: dict[str, torch.Tensor],
    quantized: dict[str, Part],
    dtype: torch.dtype,
    device: torch.device,
) -> CausalLM:
    """The registered class built on the meta device and checked against the checkpoint's names and shapes,
    then allocated and filled: quantized layers installed, the rest copied, constant factors folded."""
    cls = model_class(architecture_of(hf_config))
    args = cls.args_from_config(hf_config, {**state, **quantized})
    with torch.device("meta"):
        net = cls(args, hf_config)
    net.checkpoint_names().check({name: tuple(t.shape) for name, t in state.items()}, quantized)
    net = net.to_empty(device=device).to(dtype)
    for weight in quantized.values():
        if isinstance(weight, PackedWeight):
            weight.qweight, weight.qzeros = weight.qweight.to(device), weight.qzeros.to(device)
            weight.scales, weight.g_idx = weight.scales.to(device), weight.g_idx.to(device)
        elif isinstance(weight, Fp8Weight):
            weight.weight, weight.scale = weight.weight.to(device), weight.scale.to(device)
        elif isinstance(weight, QuantizedWeight):
            weight.data = weight.data.to(device)
    state |= install_quantized(net, net.take_quantized(quantized))
    net.load_hf_state_dict(state)
    state.clear()
    net.fold_scales()
    net.prepare_weights()
    return net


def generation_eos(folder: str, gguf_file: str | None, hf_config: Any) -> set[int]:
    """End-of-sequence ids from generation_config.json, else from the model config."""
    from transformers import GenerationConfig

    try:  # a GGUF's is its config's (gguf/hf_config.py): the file has no generation config
        gen_eos = GenerationConfig.from_pretrained(folder).eos_token_id if not gguf_file else None
    except OSError:
        gen_eos = None
    gen_eos = gen_eos if gen_eos is not None else getattr(hf_config, "eos_token_id", None)
    return set(gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
