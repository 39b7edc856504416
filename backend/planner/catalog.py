"""The data catalogs in presets/: GPUs, weight quantizations, KV cache dtypes and bundled model presets.

Each YAML/JSON file is read once (the UI recomputes estimates on every input change).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import yaml

from backend.planner.cpu_host import CPUHost, local_cpu_host
from backend.planner.cpu_speed import dram_bytes_s, gemm_flops

PRESETS_DIR = Path(__file__).resolve().parents[2] / "presets"
GIB = 1024**3
LOCAL_CPU = "local-CPU"  # this machine's CPU (cpu_host.local_cpu_host): plans of the engine that runs here


@dataclass(slots=True, frozen=True)
class GPU:
    name: str
    label: str
    memory_gb: float
    usable_bytes: int
    bandwidth_bytes_s: float
    flops_bf16: float
    flops_fp8: float | None
    ops_int8: float | None
    flops_fp4: float | None
    interconnect: str
    interconnect_bytes_s: float
    price_per_hour: float
    price_source: str
    fp4_native: bool = False  # FP4 tensor cores (Blackwell): vLLM runs MXFP4/NVFP4 weights as stored
    cpu: CPUHost | None = None  # a CPU host: its cores and ISA (the embedded engine's speed, cpu_speed.py)
    listed: bool = True  # offered in plans, charts and recommendations (False: kept for published runs only)

    @property
    def is_cpu(self) -> bool:
        return self.cpu is not None

    def flops(self, compute: str) -> float:
        """Dense FLOP/s for a matmul type, falling back to bf16 where the GPU lacks the unit."""
        value = {"fp8": self.flops_fp8, "int8": self.ops_int8, "fp4": self.flops_fp4}.get(compute)
        return value or self.flops_bf16


@dataclass(slots=True, frozen=True)
class Quantization:
    name: str
    label: str
    bits: float
    quantized: tuple[str, ...]
    compute: str
    engines: tuple[str, ...]
    vllm: str | None = None
    repacked_bits: float | None = None  # bits per quantized weight once vLLM repacks it without FP4 units


@dataclass(slots=True, frozen=True)
class KVCacheDtype:
    name: str
    label: str
    bytes: float
    engines: tuple[str, ...]


@cache
def _gpus() -> dict[str, GPU]:
    data = yaml.safe_load((PRESETS_DIR / "gpus.yaml").read_text())["gpus"]
    return {
        name: GPU(
            name=name,
            label=g["label"],
            memory_gb=g["memory_gb"],
            usable_bytes=int(g["usable_gib"] * GIB),
            bandwidth_bytes_s=g["bandwidth_tbs"] * 1e12,
            flops_bf16=g["tflops_bf16"] * 1e12,
            flops_fp8=g["tflops_fp8"] * 1e12 if g.get("tflops_fp8") else None,
            ops_int8=g["tops_int8"] * 1e12 if g.get("tops_int8") else None,
            flops_fp4=g["tflops_fp4"] * 1e12 if g.get("tflops_fp4") else None,
            interconnect=g["interconnect"],
            interconnect_bytes_s=g["interconnect_gbs"] * 1e9,
            price_per_hour=g["price_per_hour"],
            price_source=g["price_source"],
            fp4_native=bool(g.get("fp4_native", False)),
            cpu=_cpu_host(g),
            listed=bool(g.get("listed", True)),
        )
        for name, g in data.items()
    }


def _cpu_host(entry: dict) -> CPUHost | None:
    if "cpu_cores" not in entry:
        return None
    return CPUHost(entry["cpu_cores"], entry["cpu_isa"], entry["bandwidth_tbs"] * 1e12)


@cache
def local_cpu() -> GPU:
    """This machine's CPU as a catalog entry: the catalog CPU host's memory and price, this machine's cores
    and ISA, no bandwidth figure (cpu_speed.dram_bytes_s then assumes what the EPYC VM's cores draw)."""
    host, base = local_cpu_host(), _gpus()["CPU"]
    return replace(
        base,
        name=LOCAL_CPU,
        label=f"this machine's CPU ({host.cores} cores, {host.isa}; memory as the CPU entry)",
        bandwidth_bytes_s=dram_bytes_s(host),
        flops_bf16=gemm_flops(host, is_quantized=False),
        ops_int8=None,
        cpu=host,
    )


@cache
def _quant_data() -> dict:
    return yaml.safe_load((PRESETS_DIR / "quantizations.yaml").read_text())


@cache
def _quantizations() -> dict[str, Quantization]:
    return {
        name: Quantization(
            name=name,
            label=q["label"],
            bits=q["bits"],
            quantized=tuple(q["quantized"]),
            compute=q["compute"],
            engines=tuple(q["engines"]),
            vllm=q.get("vllm"),
            repacked_bits=q.get("repacked_bits"),
        )
        for name, q in _quant_data()["weight"].items()
    }


@cache
def _kv_dtypes() -> dict[str, KVCacheDtype]:
    return {
        name: KVCacheDtype(name=name, label=k["label"], bytes=k["bytes"], engines=tuple(k["engines"]))
        for name, k in _quant_data()["kv_cache"].items()
    }


@cache
def _presets() -> dict[str, Path]:
    return {json.loads(p.read_text())["hub_id"]: p for p in sorted((PRESETS_DIR / "models").glob("*.json"))}


def list_gpus() -> list[str]:
    """The GPUs plans and charts offer (get_gpu also finds the unlisted ones the validation runs use)."""
    return [name for name, gpu in _gpus().items() if gpu.listed]


def list_quantizations() -> list[str]:
    return list(_quantizations())


def list_kv_cache_dtypes() -> list[str]:
    return list(_kv_dtypes())


def list_presets() -> list[str]:
    return list(_presets())


def _lookup(table: dict, name: str, what: str):
    if name in table:
        return table[name]
    folded = {key.lower(): value for key, value in table.items()}
    if name.lower() in folded:
        return folded[name.lower()]
    raise ValueError(f"unknown {what} {name!r}; choose one of: {', '.join(table)}")


def get_gpu(name: str) -> GPU:
    if name.lower() == LOCAL_CPU.lower():
        return local_cpu()
    return _lookup(_gpus(), name, "GPU")


def get_quantization(name: str) -> Quantization:
    return _lookup(_quantizations(), name, "quantization")


def get_kv_cache_dtype(name: str) -> KVCacheDtype:
    aliases = {"bfloat16": "bf16", "float16": "fp16", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "q8_0": "int8"}
    return _lookup(_kv_dtypes(), aliases.get(name, name), "KV cache dtype")


@cache
def preset_document(hub_id: str) -> dict | None:
    """The preset JSON for a Hub id (case-insensitive), or None."""
    path = _presets().get(hub_id) or {k.lower(): v for k, v in _presets().items()}.get(hub_id.lower())
    return json.loads(path.read_text()) if path else None
