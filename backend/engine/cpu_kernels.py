"""The engine's native CPU kernels (csrc/): paged decode attention, RMSNorm, SiLU-and-multiply and a
bf16 matrix-vector product for small batches.

They are compiled on first use with the system C++ compiler (a few seconds: no torch headers) into a cache
folder keyed by the sources, the flags and the CPU, and called through ctypes with raw pointers. They link
the OpenMP runtime torch has already loaded, so they share torch's threads. When no compiler is found the
engine keeps its pure-PyTorch paths (the ones CUDA uses) and says why once.
Set PLAYGROUND_CPU_KERNELS=0 to force the pure-PyTorch paths.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

log = logging.getLogger(__name__)
CSRC = Path(__file__).parent / "csrc"
SOURCES = [CSRC / "paged_attention.cpp", CSRC / "layers.cpp"]
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]
SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
PTR, INT, FLOAT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
SIGNATURES = {
    "paged_decode_attention": [PTR] * 6 + [INT] * 8 + [FLOAT],
    "rope_and_cache": [PTR] * 7 + [INT] * 5,
    "rms_norm": [PTR, PTR, PTR, INT, INT, FLOAT],
    "silu_and_mul": [PTR, PTR, INT, INT],
}


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "llm-playground" / "kernels"


def _cpu_id() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    return next((line for line in text.splitlines() if line.startswith("flags")), "unknown")


@cache
def load_library() -> ctypes.CDLL | None:
    """The compiled kernel library, or None (logged once) when it cannot be built here."""
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        log.warning("no C++ compiler found: CPU decode attention uses the slower pure-PyTorch path")
        return None
    source = b"".join(path.read_bytes() for path in sorted(CSRC.iterdir()))
    key = hashlib.sha256(source + " ".join([compiler, *FLAGS, _cpu_id()]).encode()).hexdigest()[:16]
    path = cache_dir() / f"cpu_kernels-{key}.so"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:  # build, then move: atomic for peers
            built = Path(tmp) / path.name
            result = subprocess.run(
                [compiler, *FLAGS, "-o", str(built), *map(str, SOURCES)], capture_output=True, text=True
            )
            if result.returncode != 0:
                log.warning("building the CPU kernels failed; using PyTorch:\n%s", result.stderr)
                return None
            os.replace(built, path)
    library = ctypes.CDLL(str(path))
    for name, argtypes in SIGNATURES.items():
        for suffix in SUFFIX.values():
            getattr(library, f"{name}_{suffix}").argtypes = argtypes
            getattr(library, f"{name}_{suffix}").restype = None
    library.linear_bf16_small.argtypes = [PTR] * 4 + [INT] * 3
    library.linear_bf16_small.restype = None
    return library


def supports(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the kernels serve this device and dtype (read when an engine starts)."""
    if os.environ.get("PLAYGROUND_CPU_KERNELS", "1") == "0":
        return False
    return device.type == "cpu" and dtype in SUFFIX and load_library() is not None


def paged_decode_attention(
    q: torch.Tensor,  # [T, H, D], heads contiguous (any token stride)
    k_cache: torch.Tensor,  # [KVH, num_blocks, block_size, D]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [T, max_blocks] int64
    context_lens: torch.Tensor,  # [T] int64
    scale: float,
    out: torch.Tensor,  # [T, H, D], contiguous, written
) -> None:
    kv_heads, num_blocks, block_size, head_dim = k_cache.shape
    assert q.stride(2) == 1 and q.stride(1) == head_dim and out.is_contiguous()
    function = getattr(load_library(), f"paged_decode_attention_{SUFFIX[q.dtype]}")
    function(
        q.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        block_tables.data_ptr(),
        context_lens.data_ptr(),
        out.data_ptr(),
        q.shape[0],
        q.shape[1],
        kv_heads,
        head_dim,
        num_blocks,
        block_size,
        block_tables.shape[1],
        q.stride(0),
        scale,
    )


def rope_and_cache(
    qkv: torch.Tensor,  # [T, (H + 2 * KVH) * D], contiguous: q and k rotated in place
    positions: torch.Tensor,  # [T] int64
    cos: torch.Tensor,  # [max_positions, D]
    sin: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] int64
    k_cache: torch.Tensor,  # [KVH, num_blocks, block_size, D]: k and v written at slot_mapping
    v_cache: torch.Tensor,
    num_heads: int,
) -> None:
    kv_heads, num_blocks, block_size, head_dim = k_cache.shape
    assert qkv.is_contiguous() and qkv.shape[1] == (num_heads + 2 * kv_heads) * head_dim
    getattr(load_library(), f"rope_and_cache_{SUFFIX[qkv.dtype]}")(
        qkv.data_ptr(),
        positions.data_ptr(),
        cos.data_ptr(),
        sin.data_ptr(),
        slot_mapping.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        qkv.shape[0],
        num_heads,
        kv_heads,
        head_dim,
        num_blocks * block_size,
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm of x [rows, dim] (contiguous) in one call."""
    out = torch.empty_like(x)
    function = getattr(load_library(), f"rms_norm_{SUFFIX[x.dtype]}")
    function(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], eps)
    return out


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up [rows, 2 * dim] (contiguous) in one call."""
    rows, dim = gate_up.shape[0], gate_up.shape[1] // 2
    out = gate_up.new_empty(rows, dim)
    getattr(load_library(), f"silu_and_mul_{SUFFIX[gate_up.dtype]}")(
        gate_up.data_ptr(), out.data_ptr(), rows, dim
    )
    return out


def linear_bf16_small(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [rows, k] @ weight [n, k]^T + bias, all bf16 and contiguous, for a few rows."""
    out = x.new_empty(x.shape[0], weight.shape[0])
    bias_ptr = None if bias is None else bias.data_ptr()
    load_library().linear_bf16_small(
        x.data_ptr(), weight.data_ptr(), bias_ptr, out.data_ptr(), x.shape[0], weight.shape[0], x.shape[1]
    )
    return out
