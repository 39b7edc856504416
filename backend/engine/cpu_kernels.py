"""The engine's native CPU kernels (csrc/): paged decode and prefill attention (sliding windows, soft-caps and
sinks: csrc/attention_features.h), RoPE with the KV-cache write, RMSNorm, SiLU- and GELU(tanh)-and-multiply
and a bf16 matrix-vector product for small batches.

They are compiled on first use with the system C++ compiler (a few seconds: no torch headers) into a cache
folder keyed by the sources, the flags and the CPU, and called through ctypes with raw pointers. They link
the OpenMP runtime torch has already loaded, so they share torch's threads. When no compiler is found the
engine keeps its pure-PyTorch paths (the ones CUDA uses) and says why once; the same for any other
failure (no compiler, a cache folder that cannot be written or executed from, a build that fails or
times out, a library that does not load). A cached library is loaded only when it and its folder belong
to the current user and nobody else may write them; otherwise it is rebuilt (or the build is skipped).
Set PLAYGROUND_CPU_KERNELS=0 to force the pure-PyTorch paths, PLAYGROUND_CPU_KERNELS_MARCH to build
for another -march than native (haswell: the AVX2 paths; x86-64: the plain C++ ones; PLAYGROUND_CPU_ISA=avx2
builds for haswell and hides the CPU's AVX-512 and AMX from the engine: backend/cpu_features.py),
PLAYGROUND_PREFILL_ATTENTION=0 to keep PyTorch's attention for prefill chunks only, PLAYGROUND_INT8_DOT=0 to
keep the exact bf16 (AVX2: fp32) products where GGUF Q4_0 / Q6_K rows would round activations to int8
(csrc/int8_dot.h, csrc/int8_avx2.h, docs/int8_activations.md).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shlex
import shutil
import stat
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from backend.cpu_features import cpu_features, cpu_isa

log = logging.getLogger(__name__)
CSRC = Path(__file__).parent / "csrc"
SOURCES = [CSRC / name for name in ("paged_attention.cpp", "layers.cpp", "quantized.cpp", "packed_rows.cpp")]
SOURCES += [CSRC / "gemm_bf16.cpp", CSRC / "prefill_attention.cpp", CSRC / "interleaved.cpp"]
SOURCES += [CSRC / "step_graph.cpp", CSRC / "moe.cpp", CSRC / "q6_k_gemm.cpp"]
FLAGS = ["-O3", "-fno-trapping-math", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]
BUILD_TIMEOUT_S = 300  # per compile step; a hung compiler must not hang the engine's start
SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
CACHE_SUFFIX = {torch.float8_e4m3fn: "_fp8_e4m3", torch.float8_e5m2: "_fp8_e5m2"}  # an fp8 KV pool's kernels
PTR, INT, FLOAT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
SIGNATURES = {
    "paged_decode_attention": [PTR] * 7 + [INT] * 9 + [FLOAT] * 3,
    "paged_prefill_attention": [PTR] * 8 + [INT] * 9 + [FLOAT] * 3,
    "rope_and_cache": [PTR] * 7 + [INT] * 6 + [FLOAT] * 3,
    "rms_norm": [PTR, PTR, PTR, INT, INT, FLOAT],
    "add_rms_norm": [PTR] * 5 + [INT, INT, FLOAT],
    "qk_norm": [PTR] * 3 + [INT] * 5 + [FLOAT],
    "silu_and_mul": [PTR, PTR, INT, INT],
    "gelu_tanh_and_mul": [PTR, PTR, INT, INT],
    "argmax": [PTR, PTR, INT, INT],
}
QUANT_TYPES = ("q4_0", "q4_1", "q8_0", "q4_k", "q6_k")  # csrc/quantized.cpp
QUANT_SIGNATURES = {"quant_gemv": [PTR] * 4 + [INT] * 4, "quant_dequant": [PTR, PTR, INT, INT]}
QUANT_GEMV_MAX_ROWS = 8  # csrc/quantized.cpp MAX_ROWS (and csrc/packed_rows.cpp's)
QUANT_GEMM_TYPES = ("q4_0", "q4_1", "q8_0")  # quant_gemm: bf16 activations, builds with AVX512_BF16
# csrc/q6_k_gemm.cpp: quant_gemm_q6_k_{f32,bf16} in every build, 1..Q6_K_GEMM_MAX_ROWS rows (quant_gemv's up
# to QUANT_GEMV_MAX_ROWS): the Q6_K output matrix of llama-quantize's mixes in a batched decode step
Q6_K_GEMM_MAX_ROWS = 64
Q6_K_PATHS = ("portable", "lanes", "int8")  # quant_gemm_q6_k_{path}_bf16: one path at any rows
# csrc/int8_dot.h (AVX512_VNNI builds): bf16 activations rounded to int8 per block, integer dot products,
# from these rows (interleaved_gemm_q4_0 for GGUF Q4_0, quant_gemm_q6_k_bf16): python -m
# benchmarks.int8_bench on a 2-core EPYC (1 thread): Llama-3.2-1B's Q4_0 layers 0.77x at 2 rows, 0.80x at 3,
# 1.34-1.59x at 4-64; its Q6_K lm_head 1.10x at 2 rows, 1.77-2.42x at 4-16, and 3.5x at one row (a kernel
# of its own, weights in lanes: csrc/q6_k_int8.h gemv_row; 2 threads, a CI run beside it)
# (docs/int8_activations.md)
INT8_Q4_0_MIN_ROWS = 4
INT8_Q6_K_MIN_ROWS = 1
# csrc/int8_avx2.h (AVX2 builds without AVX-512): fp32 or bf16 activations rounded to int8 the same way,
# VPMADDUBSW products on Q4_0 in 8-column tiles (q4_0x8_gemm, when Q4_0 starts at row 1: column_tiles) or
# as stored (quant_gemv / quant_gemm_q4_0) and on Q6_K as stored (quant_gemm_q6_k), from these rows:
# python -m benchmarks.int8_bench on a 2-core EPYC with AVX2 only (docs/int8_activations.md)
INT8_AVX2_Q4_0_MIN_ROWS = 1
INT8_AVX2_Q6_K_MIN_ROWS = 1
INT8_KINDS = {1: "avx512_vnni", 2: "avx2"}  # int8_dot_available()'s codes
INT8_MAX_ROWS = 64  # csrc/int8_dot.h Int8Rows::MAX_ROWS: batched decode steps (and prefill chunks that short)
# csrc/interleaved.cpp (bf16 activations, AVX512_BF16 builds): GGUF types, then packed kinds (group_scales)
INTERLEAVED_TYPES = ("q4_0", "q4_1", "q8_0", "w4", "w4_zp", "w8", "w8_zp", "fp8", "mxfp4")
INTERLEAVED_SIGNATURE = [PTR] * 4 + [INT] * 4 + [PTR, INT]  # x, w, bias, y, rows, n, k, ldy, groups, fp32 y
PACKED_KINDS = ("w4", "w8", "fp8")  # csrc/packed_rows.cpp: GPTQ / AWQ / compressed-tensors ints, fp8
PACKED_SIGNATURES = {
    "packed_gemv": [PTR] * 7 + [INT, INT, PTR],
    "packed_dequant": [PTR] * 5 + [INT, INT, PTR],
}
# rows from which gemm_bf16 takes AMX tiles where it has them (csrc/gemm_amx.h): fewer rows are bound by
# reading the weights (kernel_bench --only gemm on a 2-core Xeon with AMX, see the README)
GEMM_AMX_MIN_ROWS = 8
INTERLEAVED_AMX_MIN_ROWS = 8  # the same for csrc/interleaved.cpp's quantized GEMM (interleaved_amx.h)
GEMM_BF16_PANEL = 16  # output columns a panel of gemm_bf16_pack's layout (csrc/gemm_bf16.cpp PANEL)


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "llm-playground" / "kernels"


def _cpu_id() -> str:
    """The CPU's flags as /proc/cpuinfo spells its line: part of the built library's cache key
    (-march=native). Spelled as before cpu_features existed, so libraries already built stay valid."""
    flags = cpu_features().flags
    return "flags\t\t: " + " ".join(flags) if flags else "unknown"


class KernelsUnavailable(Exception):
    """Why the native kernels cannot be used here (logged once; the engine uses PyTorch)."""


@cache
def load_library() -> ctypes.CDLL | None:
    """The compiled kernel library, or None (one warning, saying why) when it cannot be used here."""
    try:
        return _load_or_build()
    except KernelsUnavailable as exc:
        log.warning("CPU kernels unavailable (%s): the engine uses its slower pure-PyTorch paths", exc)
        return None


def find_compiler() -> str:
    """$CXX (which must exist when set), else g++ or c++ on PATH."""
    if os.environ.get("CXX"):
        words = shlex.split(os.environ["CXX"])
        found = shutil.which(words[0]) if words else None
        if found is None:
            raise KernelsUnavailable(f"CXX={os.environ['CXX']!r} is not an executable")
        return found
    found = shutil.which("g++") or shutil.which("c++")
    if found is None:
        raise KernelsUnavailable("no C++ compiler found (set CXX or install g++)")
    return found


def compiler_flags() -> list[str]:
    """FLAGS and the -march: PLAYGROUND_CPU_KERNELS_MARCH, else haswell for a CPU acting as an AVX2 one
    (PLAYGROUND_CPU_ISA=avx2), else native."""
    default = "haswell" if cpu_isa() == "avx2" else "native"
    return [*FLAGS, f"-march={os.environ.get('PLAYGROUND_CPU_KERNELS_MARCH', default)}"]


def library_path(compiler: str) -> Path:
    """Where the library built by this compiler for these sources, flags and CPU is cached."""
    source = b"".join(path.read_bytes() for path in sorted(CSRC.iterdir()))
    text = " ".join([compiler, *compiler_flags(), _cpu_id()])
    key = hashlib.sha256(source + text.encode()).hexdigest()[:16]
    return cache_dir() / f"cpu_kernels-{key}.so"


def is_trusted(path: Path) -> bool:
    """Owned by the current user and writable by nobody else (a planted library is never loaded)."""
    info = path.stat()
    return info.st_uid == os.getuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _load_or_build() -> ctypes.CDLL:
    compiler = find_compiler()
    path = library_path(compiler)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if path.parent.stat().st_uid != os.getuid():
            raise KernelsUnavailable(f"{path.parent} belongs to another user")
        path.parent.chmod(0o700)  # our own folder: nobody else may add or swap a library in it
        if not path.exists() or not is_trusted(path):  # missing, or possibly planted: build afresh
            _build(compiler, path)
        return _open(path)
    except OSError as exc:  # unwritable or noexec folder, a library that does not load
        raise KernelsUnavailable(f"{type(exc).__name__}: {exc}") from None


def _build(compiler: str, path: Path) -> None:
    """Compile each source on its own core (largest first: one source takes a third of a cold build), then
    link; the library appears at path only when complete."""
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:  # build, then move: atomic for peers
        sources = sorted(SOURCES, key=lambda source: source.stat().st_size, reverse=True)
        objects = [str(Path(tmp) / f"{source.stem}.o") for source in sources]
        flags = [flag for flag in compiler_flags() if flag != "-shared"]
        steps = [[compiler, *flags, "-c", "-o", o, str(s)] for s, o in zip(sources, objects, strict=True)]
        with ThreadPoolExecutor(max(1, min(len(steps), len(os.sched_getaffinity(0))))) as pool:
            list(pool.map(_run_build_step, steps))  # raises the first failure
        built = Path(tmp) / path.name
        _run_build_step([compiler, *compiler_flags(), "-o", str(built), *objects])
        built.chmod(0o755)
        os.replace(built, path)


def _run_build_step(command: list[str]) -> None:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise KernelsUnavailable(f"the build took over {BUILD_TIMEOUT_S} s") from None
    if result.returncode != 0:
        raise KernelsUnavailable(f"the build failed:\n{result.stderr[-2000:]}")


def _open(path: Path) -> ctypes.CDLL:
    library = ctypes.CDLL(str(path))
    try:
        for name, argtypes in SIGNATURES.items():
            for suffix in SUFFIX.values():
                getattr(library, f"{name}_{suffix}").argtypes = argtypes
                getattr(library, f"{name}_{suffix}").restype = None
        for name in ("paged_decode_attention", "paged_prefill_attention", "rope_and_cache"):
            for suffix in SUFFIX.values():
                for cache_suffix in CACHE_SUFFIX.values():
                    getattr(library, f"{name}_{suffix}{cache_suffix}").argtypes = SIGNATURES[name]
                    getattr(library, f"{name}_{suffix}{cache_suffix}").restype = None
        library.linear_bf16_small.argtypes = [PTR] * 4 + [INT] * 3
        library.linear_bf16_small.restype = None
        library.linear_f32.argtypes = [PTR] * 4 + [INT] * 4
        library.linear_f32.restype = None
        for name, argtypes in QUANT_SIGNATURES.items():
            for qtype in (*QUANT_TYPES, "mxfp4"):  # MXFP4: MoE experts (layers/fused_moe) only
                for suffix in SUFFIX.values():
                    getattr(library, f"{name}_{qtype}_{suffix}").argtypes = argtypes
                    getattr(library, f"{name}_{qtype}_{suffix}").restype = None
        for name, argtypes in PACKED_SIGNATURES.items():
            for kind in PACKED_KINDS:
                for suffix in SUFFIX.values():
                    getattr(library, f"{name}_{kind}_{suffix}").argtypes = argtypes
                    getattr(library, f"{name}_{kind}_{suffix}").restype = None
        library.gemm_bf16.argtypes = [PTR] * 4 + [INT] * 5
        library.gemm_bf16.restype = None
        library.gemm_bf16_silu_and_mul.argtypes = [PTR] * 4 + [INT] * 4
        library.gemm_bf16_silu_and_mul.restype = None
        library.gemm_bf16_available.restype = ctypes.c_int
        library.gemm_amx_ready.restype = ctypes.c_int
        library.gemm_amx_set_min_rows.argtypes = [INT]
        library.gemm_amx_set_min_rows.restype = None
        library.interleaved_amx_set_min_rows.argtypes = [INT]
        library.interleaved_amx_set_min_rows.restype = None
        library.amx_tile_runs.restype = ctypes.c_int64
        library.interleaved_available.restype = ctypes.c_int
        library.interleaved_embedding_q8_0.argtypes = [PTR] * 3 + [INT] * 2
        library.interleaved_embedding_q8_0.restype = None
        for qtype in INTERLEAVED_TYPES:
            getattr(library, f"interleaved_gemm_{qtype}").argtypes = INTERLEAVED_SIGNATURE
            getattr(library, f"interleaved_gemm_{qtype}").restype = None
        library.run_step_graph.argtypes = [PTR, INT, INT]
        library.widen_bf16_rows.argtypes = [PTR, INT, INT]
        library.widen_bf16_rows.restype = None
        library.run_step_graph.restype = None
        library.step_graph_op_size.restype = ctypes.c_int64
        library.quant_vector_width.restype = ctypes.c_int
        library.prefill_attention_bf16_dot.restype = ctypes.c_int
        library.packed_bf16_dot.restype = ctypes.c_int
        library.quant_gemm_max_rows.restype = ctypes.c_int
        library.quant_gemm_q6_k_max_rows.restype = ctypes.c_int
        for variant in ("f32", "bf16", "portable_bf16", "lanes_bf16", "int8_bf16"):
            name = f"quant_gemm_q6_k_{variant}"
            getattr(library, name).argtypes = QUANT_SIGNATURES["quant_gemv"]
            getattr(library, name).restype = None
        library.int8_dot_available.restype = ctypes.c_int
        library.int8_dot_set_rows.argtypes = [INT, INT]
        library.int8_dot_set_rows.restype = None
        library.int8_dot_q4_0_rows.restype = ctypes.c_int64
        if library.quant_gemm_q6_k_max_rows() != Q6_K_GEMM_MAX_ROWS:
            raise AttributeError("quant_gemm_q6_k_max_rows differs from Q6_K_GEMM_MAX_ROWS")
        library.q4_0x8_available.restype = ctypes.c_int
        if library.int8_dot_available() == 2:  # csrc/int8_avx2.h's Q4_0 rows, as stored and in tiles
            for suffix in ("f32", "bf16"):
                for name in ("quant_gemm_q4_0", "q4_0x8_gemm"):
                    getattr(library, f"{name}_{suffix}").argtypes = QUANT_SIGNATURES["quant_gemv"]
                    getattr(library, f"{name}_{suffix}").restype = None
                getattr(library, f"q4_0x8_dequant_{suffix}").argtypes = QUANT_SIGNATURES["quant_dequant"]
                getattr(library, f"q4_0x8_dequant_{suffix}").restype = None
        if library.quant_gemm_max_rows():
            for qtype in QUANT_GEMM_TYPES:
                getattr(library, f"quant_gemm_{qtype}_bf16").argtypes = QUANT_SIGNATURES["quant_gemv"]
                getattr(library, f"quant_gemm_{qtype}_bf16").restype = None
    except AttributeError as exc:  # a stale or foreign library
        raise KernelsUnavailable(f"{path} lacks a kernel: {exc}") from None
    library.gemm_amx_set_min_rows(gemm_amx_min_rows(library))
    library.interleaved_amx_set_min_rows(interleaved_amx_min_rows(library))
    library.int8_dot_set_rows(*int8_dot_rows(library))
    return library


def build_flags() -> str:
    """The instruction sets the kernels were built for (the compiler's -march=native), for reports."""
    library = load_library()
    if library is None:
        return "not built (pure PyTorch)"
    wanted = ("avx512f", "avx512bw", "avx512_bf16", "avx512_vnni", "avx2", "fma", "f16c", "amx_bf16")
    present = set(_cpu_id().split())
    width = {16: "AVX-512", 8: "AVX2+FMA", 1: "scalar"}[library.quant_vector_width()]
    if library.quant_gemm_max_rows():
        width += " (bf16 dot products)"
    if library.packed_bf16_dot():  # csrc/packed_rows.cpp: 4-bit GPTQ / AWQ / compressed-tensors in bf16
        width += "; packed 4-bit: bf16 dot products"
    if gemm_amx_min_rows(library) or interleaved_amx_min_rows(library):
        width += (
            f"; AMX tiles from {gemm_amx_min_rows(library)} rows (dense bf16), "
            f"{interleaved_amx_min_rows(library)} (interleaved quantized)"
        )
    return f"quantized kernels: {width}; cpu flags: {' '.join(f for f in wanted if f in present)}"


def supports(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the kernels serve this device and dtype (read when an engine starts)."""
    if os.environ.get("PLAYGROUND_CPU_KERNELS", "1") == "0":
        return False
    return device.type == "cpu" and dtype in SUFFIX and load_library() is not None


def prefill_attention_enabled(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether prefill chunks take paged_prefill_attention (read when an engine starts): wherever the
    kernels serve, unless PLAYGROUND_PREFILL_ATTENTION=0 keeps PyTorch's attention per chunk (A/B runs)."""
    return os.environ.get("PLAYGROUND_PREFILL_ATTENTION", "1") != "0" and supports(device, dtype)


def sinks_pointer(sinks: torch.Tensor | None, num_heads: int) -> int | None:
    """The kernels' sinks argument: [num_heads] fp32 contiguous (None: no sinks)."""
    if sinks is None:
        return None
    assert sinks.dtype == torch.float32 and sinks.is_contiguous() and sinks.shape == (num_heads,)
    return sinks.data_ptr()


def paged_decode_attention(
    q: torch.Tensor,  # [T, H, D], heads contiguous (any token stride)
    k_cache: torch.Tensor,  # [KVH, num_blocks, block_size, D]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [T, max_blocks] int64
    context_lens: torch.Tensor,  # [T] int64
    scale: float,
    out: torch.Tensor,  # [T, H, D], contiguous, written
    kv_scales: tuple[float, float] = (1.0, 1.0),  # an fp8 pool's (k_scale, v_scale)
    *,
    sliding_window: int | None = None,  # keys len - W .. len - 1 only (the rest of a table is never read)
    soft_cap: float | None = None,  # scores -> cap * tanh(scores / cap)
    sinks: torch.Tensor | None = None,  # [H] fp32: one more logit per head in the softmax's denominator
) -> None:
    """Each query token (at position len - 1) against its sequence's keys, read in place from the pool
    (csrc/paged_attention.cpp; window, soft-cap and sinks as transformers computes them)."""
    kv_heads, num_blocks, block_size, head_dim = k_cache.shape
    assert q.stride(2) == 1 and q.stride(1) == head_dim and out.is_contiguous()
    name = kernel_name("paged_decode_attention", q.dtype, k_cache.dtype)
    function = getattr(load_library(), name)
    function(
        q.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        block_tables.data_ptr(),
        context_lens.data_ptr(),
        out.data_ptr(),
        sinks_pointer(sinks, q.shape[1]),
        q.shape[0],
        q.shape[1],
        kv_heads,
        head_dim,
        num_blocks,
        block_size,
        block_tables.shape[1],
        q.stride(0),
        sliding_window or 0,
        scale * kv_scales[0],
        kv_scales[1],
        soft_cap or 0.0,
    )


@dataclass(slots=True)
class PrefillKernelInputs:
    """The step's prefill chunks as the CPU prefill kernel reads them (vLLM's names)."""

    query_start_loc: torch.Tensor  # [num_chunks + 1] int64: chunk i's rows are [i] .. [i + 1] - 1
    seq_lens: torch.Tensor  # [num_chunks] int64: cached prefix + chunk, the keys each chunk attends to
    block_tables: torch.Tensor  # [num_chunks, max_blocks] int64, padded with block 0


def paged_prefill_attention(
    q: torch.Tensor,  # [T, H, D], heads contiguous (any token stride)
    k_cache: torch.Tensor,  # [KVH, num_blocks, block_size, D]: every chunk's keys already written
    v_cache: torch.Tensor,
    meta: PrefillKernelInputs,
    scale: float,
    out: torch.Tensor,  # [T, H, D], contiguous: the chunks' rows written
    kv_scales: tuple[float, float] = (1.0, 1.0),  # an fp8 pool's (k_scale, v_scale)
    *,
    sliding_window: int | None = None,  # a query at p sees keys p - W + 1 .. p (earlier ones never read)
    soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,  # [H] fp32
) -> None:
    """Causal attention of every prefill chunk of a step in one call (csrc/prefill_attention.cpp; window,
    soft-cap and sinks as paged_decode_attention's)."""
    kv_heads, num_blocks, block_size, head_dim = k_cache.shape
    assert q.stride(2) == 1 and q.stride(1) == head_dim and out.is_contiguous()
    name = kernel_name("paged_prefill_attention", q.dtype, k_cache.dtype)
    getattr(load_library(), name)(
        q.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        meta.block_tables.data_ptr(),
        meta.query_start_loc.data_ptr(),
        meta.seq_lens.data_ptr(),
        out.data_ptr(),
        sinks_pointer(sinks, q.shape[1]),
        meta.seq_lens.shape[0],
        q.shape[1],
        kv_heads,
        head_dim,
        num_blocks,
        block_size,
        meta.block_tables.shape[1],
        q.stride(0),
        sliding_window or 0,
        scale * kv_scales[0],
        kv_scales[1],
        soft_cap or 0.0,
    )


def prefill_attention_bf16_dot() -> bool:
    """Whether the prefill kernel's products take VDPBF16PS for bf16 activations in this build."""
    library = load_library()
    return library is not None and library.prefill_attention_bf16_dot() == 1


def kernel_name(base: str, dtype: torch.dtype, cache_dtype: torch.dtype | None = None) -> str:
    """The library's symbol of a kernel for dtype activations (and a KV pool of cache_dtype)."""
    return f"{base}_{SUFFIX[dtype]}{CACHE_SUFFIX.get(cache_dtype, '') if cache_dtype else ''}"


def cache_limit(cache_dtype: torch.dtype) -> float:
    """rope_and_cache's clamp: an fp8 pool's largest value (0.0: no clamp)."""
    return torch.finfo(cache_dtype).max if cache_dtype in CACHE_SUFFIX else 0.0


def kernel_address(name: str) -> int:
    """A kernel's address, for the prepared calls of a captured decode step (decode_graph.py)."""
    address = ctypes.cast(getattr(load_library(), name), ctypes.c_void_p).value
    assert address, name
    return address


def step_graph_op_size() -> int:
    """sizeof(Op) in csrc/step_graph.cpp (graph_ops.Op must match it)."""
    library = load_library()
    return 0 if library is None else library.step_graph_op_size()


def run_step_graph(ops: ctypes.Array, rows: int) -> None:
    """Every prepared call of ops in order, each with rows in its rows slot (csrc/step_graph.cpp)."""
    library = load_library()
    assert library is not None, "a graph is captured only where the library loaded"
    library.run_step_graph(ctypes.addressof(ops), len(ops), rows)


def rotary_width(rotary_dim: int | None, head_dim: int, cos: torch.Tensor | None) -> int:
    """The rotated elements of each head: rotary_dim (None: head_dim), checked against head_dim and the
    tables' width [max_positions, rotary_dim] (no tables: rotary_dim 0)."""
    width = head_dim if rotary_dim is None else rotary_dim
    assert 0 <= width <= head_dim and width % 2 == 0, f"rotary_dim {width} for heads of {head_dim}"
    assert width == 0 or (cos is not None and cos.shape[-1] == width and cos.is_contiguous())
    return width


def rope_and_cache(
    qkv: torch.Tensor,  # [T, (H + 2 * KVH) * D], contiguous: q and k rotated in place
    positions: torch.Tensor,  # [T] int64
    cos: torch.Tensor | None,  # [max_positions, rotary_dim] (None with rotary_dim 0)
    sin: torch.Tensor | None,
    slot_mapping: torch.Tensor,  # [T] int64
    k_cache: torch.Tensor,  # [KVH, num_blocks, block_size, D]: k and v written at slot_mapping
    v_cache: torch.Tensor,
    num_heads: int,
    kv_scales: tuple[float, float] = (1.0, 1.0),  # an fp8 pool's (k_scale, v_scale)
    rotary_dim: int | None = None,  # the first rotary_dim of each head rotate (None: all; 0: none, NoPE)
) -> None:
    """RoPE (rotate-half within the first rotary_dim elements of each q and k head, as transformers' Phi-3
    and Llama) and the cache write of k and v, in one call (csrc/layers.cpp); the tables are the layer's."""
    kv_heads, num_blocks, block_size, head_dim = k_cache.shape
    assert qkv.is_contiguous() and qkv.shape[1] == (num_heads + 2 * kv_heads) * head_dim
    width = rotary_width(rotary_dim, head_dim, cos)
    getattr(load_library(), kernel_name("rope_and_cache", qkv.dtype, k_cache.dtype))(
        qkv.data_ptr(),
        positions.data_ptr(),
        None if cos is None else cos.data_ptr(),
        None if sin is None else sin.data_ptr(),
        slot_mapping.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        qkv.shape[0],
        num_heads,
        kv_heads,
        head_dim,
        num_blocks * block_size,
        width,
        *kv_scales,
        cache_limit(k_cache.dtype),
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm of x [rows, dim] (contiguous) in one call."""
    out = torch.empty_like(x)
    function = getattr(load_library(), f"rms_norm_{SUFFIX[x.dtype]}")
    function(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], eps)
    return out


def qk_norm(
    qkv: torch.Tensor,  # [T, (H + 2 KVH) * D], contiguous: q and k normed in place
    q_weight: torch.Tensor,  # [D], or [H * D] across heads
    k_weight: torch.Tensor,  # [D], or [KVH * D] across heads
    num_heads: int,
    num_kv_heads: int,
    across_heads: bool,  # one RMSNorm over all of a row's q heads, one over its k heads (OLMo 2)
    eps: float,
) -> None:
    """transformers' q/k RMSNorm before RoPE, per head (Qwen3) or across heads, in place in qkv."""
    assert qkv.is_contiguous() and q_weight.dtype == k_weight.dtype == qkv.dtype
    head_dim = qkv.shape[1] // (num_heads + 2 * num_kv_heads)
    getattr(load_library(), f"qk_norm_{SUFFIX[qkv.dtype]}")(
        qkv.data_ptr(),
        q_weight.data_ptr(),
        k_weight.data_ptr(),
        qkv.shape[0],
        num_heads,
        num_kv_heads,
        head_dim,
        int(across_heads),
        eps,
    )


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual) for x, residual [rows, dim] (contiguous) in one call."""
    out, residual_out = torch.empty_like(x), torch.empty_like(x)
    function = getattr(load_library(), f"add_rms_norm_{SUFFIX[x.dtype]}")
    function(
        x.data_ptr(),
        residual.data_ptr(),
        weight.data_ptr(),
        out.data_ptr(),
        residual_out.data_ptr(),
        x.shape[0],
        x.shape[1],
        eps,
    )
    return out, residual_out


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up [rows, 2 * dim] (contiguous) in one call."""
    rows, dim = gate_up.shape[0], gate_up.shape[1] // 2
    out = gate_up.new_empty(rows, dim)
    getattr(load_library(), f"silu_and_mul_{SUFFIX[gate_up.dtype]}")(
        gate_up.data_ptr(), out.data_ptr(), rows, dim
    )
    return out


def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gelu(gate, approximate="tanh") * up for gate_up [rows, 2 * dim] (contiguous) in one call (Gemma's
    gelu_pytorch_tanh MLP)."""
    rows, dim = gate_up.shape[0], gate_up.shape[1] // 2
    out = gate_up.new_empty(rows, dim)
    getattr(load_library(), f"gelu_tanh_and_mul_{SUFFIX[gate_up.dtype]}")(
        gate_up.data_ptr(), out.data_ptr(), rows, dim
    )
    return out


def argmax(logits: torch.Tensor) -> list[int]:
    """logits.argmax(-1).tolist() for logits [rows, n] (contiguous): the first largest, or the first NaN,
    per row. No torch call (the sampler's every step: each costs tens of microseconds on cold caches)."""
    rows, n = logits.shape
    out = (ctypes.c_int64 * rows)()
    getattr(load_library(), f"argmax_{SUFFIX[logits.dtype]}")(logits.data_ptr(), out, rows, n)
    return list(out)


def linear_bf16_small(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [rows, k] @ weight [n, k]^T + bias, all bf16 and contiguous, for a few rows."""
    out = x.new_empty(x.shape[0], weight.shape[0])
    bias_ptr = None if bias is None else bias.data_ptr()
    lib = load_library()
    assert lib is not None, "called only where supports() found the library"
    lib.linear_bf16_small(
        x.data_ptr(), weight.data_ptr(), bias_ptr, out.data_ptr(), x.shape[0], weight.shape[0], x.shape[1]
    )
    return out


def linear_f32(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [rows, k] @ weight [n, k]^T + bias, all fp32 and contiguous (a MoE router: csrc/layers.cpp)."""
    assert x.is_contiguous() and weight.is_contiguous() and (bias is None or bias.is_contiguous())
    out = x.new_empty(x.shape[0], weight.shape[0])
    bias_ptr = None if bias is None else bias.data_ptr()
    n, k = weight.shape
    lib = load_library()
    assert lib is not None, "called only where supports() found the library"
    lib.linear_f32(x.data_ptr(), weight.data_ptr(), bias_ptr, out.data_ptr(), x.shape[0], n, k, n)
    return out


def _call_quant_matmul(name: str, x, data, bias, out) -> None:
    """quant_gemv / quant_gemm: y [rows, n] (row stride ldy) = x [rows, k] @ W^T (+ bias)."""
    bias_ptr = None if bias is None else bias.data_ptr()
    getattr(load_library(), name)(
        x.data_ptr(),
        data.data_ptr(),
        bias_ptr,
        out.data_ptr(),
        x.shape[0],
        data.shape[0],
        x.shape[1],
        out.stride(0),
    )


def quant_gemv(
    x: torch.Tensor,  # [rows, k], rows <= QUANT_GEMV_MAX_ROWS, contiguous
    data: torch.Tensor,  # [n, k / block_size * type_size] uint8: GGUF blocks
    qtype: str,  # one of QUANT_TYPES
    bias: torch.Tensor | None,  # [n], x's dtype
    out: torch.Tensor,  # [rows, >= n] view of a contiguous [rows, ldy] tensor: columns 0..n-1 written
) -> None:
    assert x.is_contiguous() and x.shape[0] <= QUANT_GEMV_MAX_ROWS and out.stride(1) == 1
    _call_quant_matmul(f"quant_gemv_{qtype}_{SUFFIX[x.dtype]}", x, data, bias, out)


@cache
def quant_gemm_max_rows() -> int:
    """The most rows quant_gemm takes (0: not in this build, which lacks AVX512_BF16)."""
    library = load_library()
    return 0 if library is None else library.quant_gemm_max_rows()


def quant_gemm_rows(qtype: str, dtype: torch.dtype) -> int:
    """The most rows quant_gemm takes for GGUF blocks of qtype and activations of dtype (0: none)."""
    if qtype == "q6_k":
        return Q6_K_GEMM_MAX_ROWS
    if qtype == "q4_0" and int8_dot_kind() == "avx2" and int8_dot_rows()[0]:  # csrc/int8_avx2.h, fp32 or bf16
        return INT8_MAX_ROWS
    return quant_gemm_max_rows() if qtype in QUANT_GEMM_TYPES and dtype == torch.bfloat16 else 0


def quant_gemm(
    x: torch.Tensor,  # [rows, k], rows <= quant_gemm_rows(qtype, x.dtype), contiguous
    data: torch.Tensor,  # [n, k / block_size * type_size] uint8: GGUF blocks
    qtype: str,  # QUANT_GEMM_TYPES (bf16 x) or q6_k (fp32 or bf16 x)
    bias: torch.Tensor | None,  # [n], x's dtype
    out: torch.Tensor,  # [rows, >= n] view of a contiguous [rows, ldy] tensor: columns 0..n-1 written
    path: str = "",  # q6_k, bf16 x, one path at any rows (tests, benches): "portable", "lanes" or "int8"
) -> None:
    assert x.is_contiguous() and x.shape[0] <= quant_gemm_rows(qtype, x.dtype)
    assert out.stride(1) == 1
    assert not path or (qtype == "q6_k" and x.dtype == torch.bfloat16 and path in Q6_K_PATHS)
    suffix = f"{path}_bf16" if path else SUFFIX[x.dtype]
    _call_quant_matmul(f"quant_gemm_{qtype}_{suffix}", x, data, bias, out)


@cache
def interleaved_available() -> bool:
    """Whether this build has csrc/interleaved.cpp's kernels (AVX512_BF16)."""
    library = load_library()
    return library is not None and library.interleaved_available() == 1


def interleaved_gemm(
    x: torch.Tensor,  # [rows, k] bf16, contiguous
    part,  # interleaved.Interleaved
    bias: torch.Tensor | None,  # [n] bf16
    out: torch.Tensor,  # [rows, >= n] bf16 view of a contiguous [rows, ldy] tensor: columns 0..n-1 written
) -> None:
    """y = x @ W^T + bias on the interleaved layout (the decode hot path: its function looked up once).
    An fp32 out takes the bf16 results widened (an lm_head's logits, as gemm_bf16's float_out)."""
    assert x.is_contiguous() and x.dtype == torch.bfloat16 and out.stride(1) == 1
    assert out.dtype in (torch.bfloat16, torch.float32)
    _interleaved_function(part.qtype)(
        x.data_ptr(),
        part.data.data_ptr(),
        None if bias is None else bias.data_ptr(),
        out.data_ptr(),
        x.shape[0],
        part.shape[0],
        x.shape[1],
        out.stride(0),
        None if part.groups is None else part.groups.address,
        int(out.dtype == torch.float32),
    )


def interleaved_embedding_q8_0(ids: torch.Tensor, part, out: torch.Tensor) -> torch.Tensor:
    """out [T, k] bf16 = rows ids [T] (int64) of an interleaved Q8_0 part, decoded as quant_dequant_q8_0
    decodes their GGUF blocks (what a captured decode step's embedding call runs)."""
    assert ids.dtype == torch.int64 and ids.is_contiguous() and out.is_contiguous()
    assert part.qtype == "q8_0" and out.dtype == torch.bfloat16 and out.shape == (ids.shape[0], part.shape[1])
    library = load_library()
    assert library is not None, "called only where the interleaved layout is in use"
    library.interleaved_embedding_q8_0(ids.data_ptr(), part.data.data_ptr(), out.data_ptr(), *out.shape)
    return out


def column_tiles_available() -> bool:
    """Whether GGUF Q4_0 takes 8-column tiles at load (quantization/column_tiles.py): AVX2 builds without
    AVX-512 whose Q4_0 products round x to int8 from one row now (csrc/quantized.cpp q4_0x8_gemm); with the
    int8 paths off (PLAYGROUND_INT8_DOT=0, set_int8_dot_rows(0, _)) the blocks stay as stored. Read when a
    layer loads; tiles loaded before the int8 paths are set off compute the exact function (slower)."""
    library = load_library()
    return library is not None and library.q4_0x8_available() == 1 and library.int8_dot_q4_0_rows() == 1


def column_tiles_gemm(
    x: torch.Tensor,  # [rows, k], 1 <= rows <= INT8_MAX_ROWS, contiguous, fp32 or bf16
    part,  # column_tiles.ColumnTiles
    bias: torch.Tensor | None,  # [n], x's dtype
    out: torch.Tensor,  # [rows, >= n] view of a contiguous [rows, ldy] tensor: columns 0..n-1 written
) -> None:
    """y = x @ W^T + bias, W in 8-column tiles: x rounded to int8 per block (csrc/int8_avx2.h) where the
    int8 paths take these rows, else exact."""
    assert x.is_contiguous() and 0 < x.shape[0] <= INT8_MAX_ROWS and out.stride(1) == 1
    getattr(load_library(), f"q4_0x8_gemm_{SUFFIX[x.dtype]}")(
        x.data_ptr(),
        part.data.data_ptr(),
        _pointer(bias),
        out.data_ptr(),
        x.shape[0],
        part.shape[0],
        x.shape[1],
        out.stride(0),
    )


def column_tiles_dequant(part, first: int, last: int, out: torch.Tensor) -> torch.Tensor:
    """Rows first..last-1 (multiples of 8) of a column_tiles.ColumnTiles decoded into out
    [last - first, k] (contiguous, fp32 or bf16), as quant_dequant_q4_0 decodes the blocks as stored."""
    assert first % 8 == 0 and last % 8 == 0 and out.is_contiguous()
    data = part.data[first // 8 : -(-last // 8)]
    getattr(load_library(), f"q4_0x8_dequant_{SUFFIX[out.dtype]}")(
        data.data_ptr(), out.data_ptr(), last - first, out.shape[1]
    )
    return out


@cache
def _interleaved_function(qtype: str):
    return getattr(load_library(), f"interleaved_gemm_{qtype}")


def quant_dequant(data: torch.Tensor, qtype: str, out: torch.Tensor) -> torch.Tensor:
    """GGUF blocks data [n, row_bytes] (contiguous) decoded into out [n, k] (contiguous, fp32 or bf16)."""
    assert data.is_contiguous() and out.is_contiguous()
    getattr(load_library(), f"quant_dequant_{qtype}_{SUFFIX[out.dtype]}")(
        data.data_ptr(), out.data_ptr(), out.shape[0], out.shape[1]
    )
    return out


def _pointer(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None or not tensor.numel() else tensor.data_ptr()


def packed_gemv(
    x: torch.Tensor,  # [rows, k], rows <= QUANT_GEMV_MAX_ROWS, contiguous
    part,  # row_packed.RowPacked
    bias: torch.Tensor | None,  # [n], x's dtype
    out: torch.Tensor,  # [rows, >= n] view of a contiguous [rows, ldy] tensor: columns 0..n-1 written
) -> None:
    assert x.is_contiguous() and x.shape[0] <= QUANT_GEMV_MAX_ROWS and out.stride(1) == 1
    getattr(load_library(), f"packed_gemv_{part.kind}_{SUFFIX[x.dtype]}")(
        x.data_ptr(),
        part.qweight.data_ptr(),
        part.scales.data_ptr(),
        _pointer(part.zeros),
        _pointer(part.perm),
        _pointer(bias),
        out.data_ptr(),
        x.shape[0],
        out.stride(0),
        ctypes.addressof(part.layout),
    )


def packed_dequant(part, first: int, last: int, out: torch.Tensor) -> torch.Tensor:
    """Rows first..last-1 of a row_packed.RowPacked decoded into out [last - first, k] (contiguous)."""
    assert out.is_contiguous() and out.shape == (last - first, part.shape[1])
    getattr(load_library(), f"packed_dequant_{part.kind}_{SUFFIX[out.dtype]}")(
        part.qweight.data_ptr(),
        part.scales.data_ptr(),
        _pointer(part.zeros),
        _pointer(part.perm),
        out.data_ptr(),
        first,
        last,
        ctypes.addressof(part.layout),
    )
    return out


def gemm_bf16_enabled() -> bool:
    """Whether dense bf16 projections take gemm_bf16 rather than oneDNN (read when a model is prepared):
    the build has AVX512_BF16, and on a CPU with AMX also the AMX tiles for many rows (csrc/gemm_amx.h;
    without them oneDNN's AMX GEMM is the faster one for prefill). Set PLAYGROUND_GEMM_BF16=0 to keep
    oneDNN."""
    if os.environ.get("PLAYGROUND_GEMM_BF16", "1") == "0" or not supports(
        torch.device("cpu"), torch.bfloat16
    ):
        return False
    return _gemm_bf16_built() and ("amx_bf16" not in _cpu_id().split() or gemm_amx_min_rows() > 0)


def gemm_amx_min_rows(library: ctypes.CDLL | None = None) -> int:
    """From how many rows gemm_bf16 computes on AMX tiles (0: never; the CPU has no AMX, the build was
    not for it, or Linux did not grant the tile state). PLAYGROUND_GEMM_AMX_MIN_ROWS sets it (0: off)."""
    return _amx_min_rows(library, "PLAYGROUND_GEMM_AMX_MIN_ROWS", GEMM_AMX_MIN_ROWS)


def interleaved_amx_min_rows(library: ctypes.CDLL | None = None) -> int:
    """The same for the interleaved quantized GEMM (PLAYGROUND_INTERLEAVED_AMX_MIN_ROWS)."""
    return _amx_min_rows(library, "PLAYGROUND_INTERLEAVED_AMX_MIN_ROWS", INTERLEAVED_AMX_MIN_ROWS)


def int8_dot_available(library: ctypes.CDLL | None = None) -> bool:
    """Whether this build has csrc/int8_dot.h's int8-activation kernels (AVX512_VNNI and AVX512BW)."""
    return int8_dot_kind(library) == "avx512_vnni"


def int8_dot_kind(library: ctypes.CDLL | None = None) -> str:
    """Which int8-activation kernels this build has: "avx512_vnni" (csrc/int8_dot.h: Q4_0 interleaved and
    Q6_K, bf16 x), "avx2" (csrc/int8_avx2.h: Q4_0 and Q6_K as stored, fp32 or bf16 x), or "" (none)."""
    library = library or load_library()
    return "" if library is None else INT8_KINDS.get(library.int8_dot_available(), "")


def int8_dot_rows(library: ctypes.CDLL | None = None) -> tuple[int, int]:
    """From which rows (Q4_0, Q6_K) the kernels round activations to int8: (0, 0) where the build has no
    int8 kernels or PLAYGROUND_INT8_DOT=0 (the exact paths)."""
    kind = "" if os.environ.get("PLAYGROUND_INT8_DOT", "1") == "0" else int8_dot_kind(library)
    if kind == "avx512_vnni":
        return INT8_Q4_0_MIN_ROWS, INT8_Q6_K_MIN_ROWS
    if kind == "avx2":
        return INT8_AVX2_Q4_0_MIN_ROWS, INT8_AVX2_Q6_K_MIN_ROWS
    return 0, 0


def takes_int8(qtype: str, rows: int, dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether a product of rows activation rows of dtype with GGUF qtype weights takes the int8 path as set
    at load: AVX512_VNNI builds, bf16 x, Q4_0 interleaved (on CPUs with AMX calls of AMX rows stay on the
    tiles, exact) and Q6_K; AVX2 builds, fp32 or bf16 x, Q4_0 and Q6_K as stored."""
    if int8_dot_kind() == "avx512_vnni" and dtype != torch.bfloat16:
        return False
    first = dict(zip(("q4_0", "q6_k"), int8_dot_rows(), strict=True)).get(qtype, 0)
    return 0 < first <= rows <= INT8_MAX_ROWS


def set_int8_dot_rows(q4_0: int, q6_k: int) -> None:
    """Set from which rows the int8 paths run (0: never) in this process (benches, tests)."""
    library = load_library()
    assert library is not None, "called only where the kernels are built"
    library.int8_dot_set_rows(q4_0, q6_k)


def _amx_min_rows(library: ctypes.CDLL | None, variable: str, default: int) -> int:
    """0 where AMX tiles cannot run here, else the row count in variable (a whole number; a value that is
    not one is said in the log and ignored), else default."""
    library = library or load_library()
    if library is None or not library.gemm_amx_ready():
        return 0
    value = os.environ.get(variable, "").strip()
    if value.isdigit():
        return int(value)
    if value:
        log.warning(
            "%s=%r is not a row count (a whole number, 0 turns AMX tiles off): using %d",
            variable,
            value,
            default,
        )
    return default


@cache
def _gemm_bf16_built() -> bool:
    library = load_library()
    return library is not None and library.gemm_bf16_available() == 1


def gemm_bf16_pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [n, k] (bf16, k even) laid out for gemm_bf16: [ceil(n / 16), k / 2, 16, 2], zero columns
    past n (see csrc/gemm_bf16.cpp)."""
    n, k = weight.shape
    assert weight.dtype == torch.bfloat16 and k % 2 == 0
    panels = -(-n // GEMM_BF16_PANEL)
    padded = weight.new_zeros(panels * GEMM_BF16_PANEL, k)
    padded[:n] = weight
    return padded.view(panels, GEMM_BF16_PANEL, k // 2, 2).transpose(1, 2).contiguous()


def gemm_bf16(
    x: torch.Tensor,  # [rows, k] bf16, contiguous
    packed: torch.Tensor,  # gemm_bf16_pack(weight [n, k])
    n: int,
    bias: torch.Tensor | None,  # [n] bf16
    out_dtype: torch.dtype = torch.bfloat16,  # float32: the bf16 result widened (its .float()), in one pass
) -> torch.Tensor:
    """x @ weight^T + bias: [rows, n], sums in fp32, rounded to bf16."""
    rows, k = x.shape
    assert x.is_contiguous() and x.dtype == torch.bfloat16 and packed.shape[1] * 2 == k
    out = x.new_empty(rows, n, dtype=out_dtype)
    bias_ptr = None if bias is None else bias.data_ptr()
    lib = load_library()
    assert lib is not None, "called only where gemm_bf16_enabled() found the library"
    float_out = out_dtype == torch.float32
    lib.gemm_bf16(x.data_ptr(), packed.data_ptr(), bias_ptr, out.data_ptr(), rows, n, k, n, float_out)
    return out


def pack_gate_up(
    weight: torch.Tensor,  # [2 * I, k] bf16: gate rows, then up rows (I a multiple of GEMM_BF16_PANEL)
    bias: torch.Tensor | None,  # [2 * I]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A gate_up projection laid out for gemm_bf16_silu_and_mul: gemm_bf16_pack of its rows with gate and
    up panels in turn (gate rows 16j..16j+15, then the same up rows), and its bias in the same order."""
    n = weight.shape[0]
    panels = n // (2 * GEMM_BF16_PANEL)
    assert n == panels * 2 * GEMM_BF16_PANEL, "I must be a multiple of the panel width"

    def interleave(t: torch.Tensor) -> torch.Tensor:
        return t.view(2, panels, GEMM_BF16_PANEL, -1).transpose(0, 1).reshape(t.shape)

    packed = gemm_bf16_pack(interleave(weight))
    return packed, None if bias is None else interleave(bias.view(n, 1)).view(n).contiguous()


def gemm_bf16_silu_and_mul(
    x: torch.Tensor,  # [rows, k] bf16, contiguous
    packed: torch.Tensor,  # pack_gate_up(weight [n, k])[0]
    n: int,
    bias: torch.Tensor | None,  # pack_gate_up's bias [n]
) -> torch.Tensor:
    """silu(gate) * up of x @ weight^T + bias: [rows, n / 2] bf16, equal bit for bit to silu_and_mul of
    gemm_bf16's output (one pass: the [rows, n] product is never stored)."""
    rows, k = x.shape
    assert x.is_contiguous() and x.dtype == torch.bfloat16 and packed.shape[1] * 2 == k
    out = x.new_empty(rows, n // 2)
    bias_ptr = None if bias is None else bias.data_ptr()
    lib = load_library()
    assert lib is not None, "called only where gemm_bf16_enabled() found the library"
    lib.gemm_bf16_silu_and_mul(x.data_ptr(), packed.data_ptr(), bias_ptr, out.data_ptr(), rows, n, k, n // 2)
    return out
