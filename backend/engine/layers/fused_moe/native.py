"""The native MoE block (csrc/moe.cpp): each projection's experts in a format whose moe_panels_* function
computes them (csrc/moe.h), the layer's numbers in a MoeLayerArgs the kernel reads, and the call.

Formats, chosen per projection when a model is prepared (`native_experts`):
  gemm_bf16      dense bf16 experts, each packed for csrc/gemm_bf16.cpp (AVX512_BF16 builds)
  interleaved_*  GGUF Q4_0 / Q4_1 / Q8_0 and MXFP4 blocks in csrc/interleaved.cpp's 16-row panels (bf16,
                 AVX512_BF16 builds): the same bytes, moved
  tiles_q4_0_{f32,bf16}  GGUF Q4_0 in 8-column tiles (quantization/column_tiles.py, csrc/int8_avx2.h): AVX2
                 builds without AVX-512, int8 activations: the same bytes, moved
  rows_*_{f32,bf16}  GGUF blocks of any kept type and MXFP4 row by row (csrc/quantized.cpp's column loop):
                 fp32 models, and CPUs without AVX512_BF16
Dense experts elsewhere (fp32, or bf16 without AVX512_BF16) stay on the PyTorch path (experts.py).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch

from backend.engine import cpu_kernels
from backend.engine.layers.fused_moe.config import MoEConfig
from backend.engine.quantization import column_tiles, mxfp4
from backend.engine.quantization.gguf_reader import QuantizedWeight
from backend.engine.quantization.interleaved import PANEL, TYPES, interleave
from backend.engine.quantization.quantized_linear import interleaves

ROUTING = {"softmax_topk": 0, "topk_softmax": 1}  # csrc/moe.cpp Routing
ACTIVATION = {"silu": 0, "swigluoai": 1}  # csrc/moe.cpp Activation
PTR, INT = ctypes.c_void_p, ctypes.c_int64


class MoeLayerArgs(ctypes.Structure):  # csrc/moe.cpp MoeLayer, field by field
    _fields_ = [
        ("gate_up", PTR),
        ("down", PTR),
        ("w13", PTR),
        ("w2", PTR),
        ("b13", PTR),
        ("b2", PTR),
        ("w13_stride", INT),
        ("w2_stride", INT),
        ("experts", INT),
        ("top_k", INT),
        ("hidden", INT),
        ("inter", INT),
        ("routing", INT),
        ("renormalize", INT),
        ("activation", INT),
        ("alpha", ctypes.c_float),
        ("limit", ctypes.c_float),
        ("scale", ctypes.c_float),
        ("counts", PTR),
    ]


@dataclass(slots=True)
class NativeExperts:
    """One projection's experts as a moe_panels_* function reads them: expert e's at data + e * stride."""

    function: str  # the library's moe_panels_* symbol
    data: torch.Tensor
    stride: int  # bytes


def native_experts(weight: torch.Tensor | QuantizedWeight, num_experts: int, dtype: torch.dtype):
    """weight (dense [E, n, k] or GGUF blocks [E * n, row bytes]) in the fastest format the kernels here
    serve for dtype activations, or None (the PyTorch path)."""
    device = torch.device("cpu")
    if not cpu_kernels.supports(device, dtype):
        return None
    if isinstance(weight, torch.Tensor):
        if weight.dtype != torch.bfloat16 or weight.shape[2] % 2 or not cpu_kernels.gemm_bf16_enabled():
            return None
        packed = torch.stack([cpu_kernels.gemm_bf16_pack(w) for w in weight.unbind(0)])
        return NativeExperts("moe_panels_gemm_bf16", packed, packed[0].nbytes)
    n, k = weight.shape[0] // num_experts, weight.shape[1]
    fits_panels = n % PANEL == 0 and k % 32 == 0
    if fits_panels and interleaves(device, dtype) and weight.qtype in (*TYPES, mxfp4.QTYPE):
        part = mxfp4.interleave(weight) if weight.qtype == mxfp4.QTYPE else interleave(weight)
        return NativeExperts(
            f"moe_panels_interleaved_{weight.qtype}", part.data, part.data.nbytes // num_experts
        )
    each_expert = QuantizedWeight(weight.qtype, weight.data[:n], (n, k))
    if column_tiles.can_tile(each_expert) and cpu_kernels.column_tiles_available():
        # whole groups of 8 rows an expert: expert e's tiles where its blocks were
        tiles = column_tiles.tile(weight)
        function = f"moe_panels_tiles_q4_0_{cpu_kernels.SUFFIX[dtype]}"
        return NativeExperts(function, tiles.data, tiles.data.nbytes // num_experts)
    if weight.qtype in (*cpu_kernels.QUANT_TYPES, mxfp4.QTYPE):
        function = f"moe_panels_rows_{weight.qtype}_{cpu_kernels.SUFFIX[dtype]}"
        return NativeExperts(function, weight.data, n * weight.data.shape[1])
    return None


@cache
def _library() -> ctypes.CDLL:
    library = cpu_kernels.load_library()
    assert library is not None, "called only where cpu_kernels.supports() found the library"
    for suffix in cpu_kernels.SUFFIX.values():
        getattr(library, f"moe_forward_{suffix}").argtypes = [PTR] * 7 + [INT]
        getattr(library, f"moe_forward_{suffix}").restype = None
        getattr(library, f"moe_route_{suffix}").argtypes = [PTR, PTR, INT, PTR, PTR]
        getattr(library, f"moe_route_{suffix}").restype = None
    library.moe_workspace_bytes.argtypes = [PTR, INT, INT]
    library.moe_workspace_bytes.restype = ctypes.c_int64
    return library


def _pointer(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


class NativeMoE:
    """A FusedMoE's experts on csrc/moe.cpp: holds what the kernel reads (the args point into it)."""

    def __init__(
        self,
        config: MoEConfig,
        projections: tuple[NativeExperts, NativeExperts],  # gate_up, down
        biases: tuple[torch.Tensor | None, torch.Tensor | None],  # [E, 2 I], [E, H] in dtype
        dtype: torch.dtype,
        scale: float = 1.0,  # on the block's output (FusedMoE.output_scale)
        counts: np.ndarray | None = None,  # int64 [E]: each call adds its assignments per expert
    ) -> None:
        self.gate_up, self.down = projections
        self.counts = counts  # held: the args point into it
        self.biases, self.dtype = biases, dtype
        self.args = MoeLayerArgs(
            cpu_kernels.kernel_address(self.gate_up.function),
            cpu_kernels.kernel_address(self.down.function),
            self.gate_up.data.data_ptr(),
            self.down.data.data_ptr(),
            _pointer(biases[0]),
            _pointer(biases[1]),
            self.gate_up.stride,
            self.down.stride,
            config.num_experts,
            config.top_k,
            config.hidden_size,
            config.intermediate_size,
            ROUTING[config.scoring],
            int(config.renormalize),
            ACTIVATION[config.activation],
            config.swiglu_alpha,
            config.swiglu_limit,
            scale,
            None if counts is None else counts.ctypes.data,
        )
        self.suffix = cpu_kernels.SUFFIX[dtype]

    @property
    def address(self) -> int:
        """The MoeLayerArgs' address (a captured step's op passes it)."""
        return ctypes.addressof(self.args)

    def tensors(self) -> list[torch.Tensor]:
        return [self.gate_up.data, self.down.data, *(b for b in self.biases if b is not None)]

    def workspace_bytes(self, rows: int) -> int:
        return _library().moe_workspace_bytes(
            self.address, rows, torch.tensor([], dtype=self.dtype).element_size()
        )

    def forward(
        self,
        x: torch.Tensor,  # [T, H] contiguous
        logits: torch.Tensor,  # [T, E] contiguous, x's dtype
        shared: torch.Tensor | None,  # [T, H]: a shared expert's output
        shared_gate: torch.Tensor | None,  # [T, 1]: its gate's logits
        workspace: torch.Tensor,  # uint8, at least workspace_bytes(T)
    ) -> torch.Tensor:
        out = torch.empty_like(x)
        pointers = (x, logits, shared, shared_gate, out, workspace)
        getattr(_library(), f"moe_forward_{self.suffix}")(self.address, *map(_pointer, pointers), x.shape[0])
        return out

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The kernel's routing of logits [T, E]: (weights [T, K] float32, ids [T, K] int32)."""
        rows, top_k = logits.shape[0], self.args.top_k
        weights = torch.empty(rows, top_k, dtype=torch.float32)
        ids = torch.empty(rows, top_k, dtype=torch.int32)
        function = getattr(_library(), f"moe_route_{self.suffix}")
        function(self.address, logits.data_ptr(), rows, ids.data_ptr(), weights.data_ptr())
        return weights, ids
