"""The MoE block on the native kernel (csrc/moe.cpp) in every weight format it takes: dense bf16 experts
(gemm_bf16 panels), GGUF Q4_0 / Q4_1 / Q8_0 and MXFP4 in 16-row panels (bf16), GGUF blocks of any kept type
and MXFP4 row by row (fp32, and bf16 for the K-types), SiLU and gpt-oss's SwiGLU with biases, a shared
expert with its gate. Each output is the float64 value of the routed experts from their decoded weights
(the dequantized reference) within the error of x's dtype: fp32 summation error, or bf16's roundings of the
products, the activation and the output, relative to the block's magnitude (tests/moe_utils.reference_bound).
Native routing picks torch's experts with fp32 weights; passes of 4,096 pairs and 3 threads change nothing;
the captured step's calls (layers/fused_moe/graph.py) give the eager module's output bit for bit at 1-8 rows.
Planted bugs (every expert reading expert 0's weights, the routing order flipped, a stale logits buffer in
the captured calls) fail these checks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quantize

from backend.engine import cpu_kernels
from backend.engine.layers.fused_moe import FusedMoE, MoEConfig
from backend.engine.layers.fused_moe.graph import moe_buffers, moe_ops, unsupported_moe
from backend.engine.layers.fused_moe.native import NativeExperts, NativeMoE
from backend.engine.layers.fused_moe.routing import select_experts
from backend.engine.layers.linear import Linear, can_prepare
from backend.engine.layers.mlp import GatedMLP
from backend.engine.quantization import mxfp4
from backend.engine.quantization.gguf_blocks import KEPT_TYPES
from backend.engine.quantization.gguf_reader import QuantizedWeight
from tests.gguf_utils import random_blocks
from tests.moe_utils import reference_bound

pytestmark = [
    pytest.mark.usefixtures("one_torch_thread"),
    pytest.mark.skipif(
        not cpu_kernels.supports(torch.device("cpu"), torch.float32),
        reason="the native CPU kernels are not built",
    ),
]
BF16_READY = cpu_kernels.interleaved_available() and cpu_kernels.gemm_bf16_enabled()
E, H, INTER = 8, 256, 256  # K-type blocks are 256 wide
Q = GGMLQuantizationType


def quantized(qtype: str, rows: int, cols: int, seed: int) -> QuantizedWeight:
    rng = np.random.default_rng(seed)
    if qtype == "mxfp4":
        blocks = torch.from_numpy(rng.integers(0, 256, (E, rows, cols // 32, 16), dtype=np.uint8))
        scales = torch.from_numpy(rng.integers(120, 125, (E, rows, cols // 32), dtype=np.uint8))
        return mxfp4.from_gpt_oss(blocks, scales)
    gguf_type = next(t for t, name in KEPT_TYPES.items() if name == qtype)
    if gguf_type in (Q.Q4_0, Q.Q4_1, Q.Q8_0):  # gguf-py quantizes them: weights of a trained model's scale
        data = quantize((rng.standard_normal((E * rows, cols)) / cols**0.5).astype(np.float32), gguf_type)
    else:
        data = random_blocks(gguf_type, E * rows, cols, rng)
    return QuantizedWeight(qtype, torch.from_numpy(data), (E * rows, cols))


def prepare(block: FusedMoE) -> FusedMoE:
    """What a model's prepare_weights does for the block: its Linears packed, kernels on, experts native
    (the experts as they were kept for the reference in block.source_experts)."""
    block.source_experts = block.experts()
    if can_prepare(block.gate.weight):
        for module in block.modules():
            if isinstance(module, Linear):
                module.prepare()
    for module in block.modules():
        if isinstance(module, Linear | GatedMLP):
            module.use_kernel = True
        if isinstance(module, GatedMLP):
            module.fused_silu_and_mul = module.gate_up_proj.fused_silu_and_mul
    block.prepare_experts(use_kernels=True)
    return block


def make_block(experts: str, dtype: torch.dtype, gpt_oss: bool = False, shared: bool = False) -> FusedMoE:
    """A random block with experts "dense" or of a GGUF type / "mxfp4" (kept as blocks), not yet prepared."""
    config = MoEConfig(E, 3, H, INTER, "softmax_topk", renormalize=True)
    if gpt_oss:
        config = dataclasses.replace(config, top_k=2, scoring="topk_softmax", renormalize=False)
        config = dataclasses.replace(config, activation="swigluoai", router_bias=True, expert_bias=True)
    if shared:
        config = dataclasses.replace(config, shared_intermediate_size=64, shared_expert_gate=True)
    torch.manual_seed(0)
    block = FusedMoE(config)
    with torch.no_grad():
        for parameter in block.parameters():
            parameter.normal_(0, 1 / H**0.5 if parameter.dim() > 1 else 0.5)
    if experts != "dense":
        block.set_quantized_experts(quantized(experts, 2 * INTER, H, 1), quantized(experts, H, INTER, 2))
    return block.to(dtype)


def within_bound(block: FusedMoE, x: torch.Tensor, out: torch.Tensor) -> bool:
    """out is the routed experts' float64 value (on the kernel's routing) within x's dtype's error: its
    rounding unit at the roundings of g, u, the activation and the products (2^-7: a few bf16 units of
    2^-9), fp32 summation error, and the output's own rounding."""
    assert block.native is not None
    with torch.no_grad():
        weights, ids = block.native.route(block.gate(x))
        exact, rounding, summation = reference_bound(block, block.source_experts, x, weights, ids)
        shared, gate = block.shared_output(x)
    if shared is not None and gate is not None:
        exact += torch.sigmoid(gate.double()) * shared.double()
        rounding += shared.double().abs()
    unit = 2.0**-7 if x.dtype == torch.bfloat16 else 2.0**-22
    bound = unit * (rounding + exact.abs()) + 1e-5 * summation + 1e-6
    return bool(((out.double() - exact).abs() <= bound).all())


NEEDS_BF16 = pytest.mark.skipif(not BF16_READY, reason="the kernels' build lacks AVX512_BF16")
FORMATS = [  # (experts, activations' dtype, the projections' native function)
    pytest.param("dense", torch.bfloat16, "moe_panels_gemm_bf16", marks=NEEDS_BF16),
    *(
        pytest.param(q, torch.bfloat16, f"moe_panels_interleaved_{q}", marks=NEEDS_BF16)
        for q in ("q4_0", "q4_1", "q8_0", "mxfp4")
    ),
    *(
        pytest.param(q, torch.float32, f"moe_panels_rows_{q}_f32")
        for q in ("q4_0", "q8_0", "q4_k", "q6_k", "mxfp4")
    ),
    pytest.param("q4_k", torch.bfloat16, "moe_panels_rows_q4_k_bf16"),
]


@pytest.mark.parametrize(("experts", "dtype", "function"), FORMATS)
def test_each_format_within_its_error(experts, dtype, function, int8_rows):
    """The int8 paths off (the exact function); where the experts take csrc/int8_avx2.h's int8 rows (Q4_0
    in 8-column tiles, Q6_K as stored, on AVX2 builds), those too: close to the exact output, and not equal
    to it."""
    if function == "moe_panels_rows_q4_0_f32" and cpu_kernels.column_tiles_available():
        function = "moe_panels_tiles_q4_0_f32"  # AVX2 builds (quantization/column_tiles.py)
    block = prepare(make_block(experts, dtype, gpt_oss=experts == "mxfp4"))
    assert block.native is not None and block.native.gate_up.function == function
    as_stored_int8 = cpu_kernels.int8_dot_kind() == "avx2" and experts in ("q4_0", "q6_k")
    for tokens in (1, 7, 64):
        x = torch.randn(tokens, H, generator=torch.Generator().manual_seed(tokens)).to(dtype)
        int8_rows(0, 0)
        with torch.no_grad():
            exact = block(x)
            assert within_bound(block, x, exact), tokens
        if as_stored_int8:
            int8_rows(*cpu_kernels.int8_dot_rows())
            with torch.no_grad():
                int8 = block(x)
            # x rounded to 8 bits per block: about 1/254 of a block's largest |x| per value
            assert not torch.equal(int8, exact)
            assert ((int8 - exact).abs() <= 0.03 * exact.abs().amax() + 1e-6).all(), tokens


@NEEDS_BF16
def test_shared_expert_passes_and_threads():
    """A shared expert with its gate; 2,100 tokens (passes of 4,096 pairs: 1,365 tokens at top_k 3, so two);
    three threads splitting the experts' panels unevenly: the same output as one thread."""
    block = prepare(make_block("q4_0", torch.bfloat16, shared=True))
    x = torch.randn(2100, H, generator=torch.Generator().manual_seed(0)).bfloat16()
    with torch.no_grad():
        one_thread = block(x)
        assert within_bound(block, x[:50], one_thread[:50]) and within_bound(block, x[-50:], one_thread[-50:])
        torch.set_num_threads(3)
        try:
            assert torch.equal(block(x), one_thread)
        finally:
            torch.set_num_threads(1)


def routing_only(config: MoEConfig, dtype: torch.dtype) -> NativeMoE:
    """A NativeMoE for its route() alone (no experts' weights are read)."""
    none = NativeExperts(
        f"moe_panels_rows_q8_0_{cpu_kernels.SUFFIX[dtype]}", torch.zeros(1, dtype=torch.uint8), 0
    )
    return NativeMoE(config, (none, none), (None, None), dtype)


def routes_as_torch(native: NativeMoE, logits: torch.Tensor, config: MoEConfig) -> bool:
    """The kernel picks torch's experts in torch's order, with torch's weights within fp32 rounding; where
    bf16 logits tie (among the top_k + 1), experts of the same scores in either order."""
    weights, ids = native.route(logits)
    torch_weights, torch_ids = select_experts(logits, config)
    scores = torch.softmax(logits.float(), -1) if config.scoring == "softmax_topk" else logits.float()
    top = scores.topk(config.top_k + 1, dim=-1).values
    ties = (top[:, :-1] == top[:, 1:]).any(-1)
    picked, torch_picked = scores.gather(1, ids.long()), scores.gather(1, torch_ids)
    return (
        torch.equal(ids[~ties].long(), torch_ids[~ties])
        and torch.equal(picked.sort(-1).values, torch_picked.sort(-1).values)
        and torch.allclose(weights, torch_weights, rtol=1e-6, atol=1e-7)
    )


@pytest.mark.parametrize("scoring", ["softmax_topk", "topk_softmax"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_routing_picks_torchs_experts(scoring, dtype):
    logits = torch.randn(500, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    for renormalize in (False, True):
        config = MoEConfig(64, 8, 32, 32, scoring, renormalize)
        assert routes_as_torch(routing_only(config, dtype), logits, config), renormalize


@NEEDS_BF16
@pytest.mark.parametrize(
    ("experts", "gpt_oss", "shared"), [("dense", False, True), ("q4_0", False, False), ("mxfp4", True, False)]
)
def test_captured_calls_equal_the_module(experts, gpt_oss, shared):
    block = prepare(make_block(experts, torch.bfloat16, gpt_oss=gpt_oss, shared=shared))
    assert unsupported_moe(block, torch.bfloat16) is None
    size = 8
    buffers = moe_buffers([block], size, torch.bfloat16, torch.device("cpu"))
    x, out = torch.zeros(size, H, dtype=torch.bfloat16), torch.zeros(size, H, dtype=torch.bfloat16)
    ops = moe_ops(block, x, out, buffers)
    array = (type(ops[0]) * len(ops))(*ops)
    for rows in (1, 3, 8, 2):
        x[:rows] = torch.randn(rows, H, generator=torch.Generator().manual_seed(rows)).bfloat16()
        cpu_kernels.run_step_graph(array, rows)
        with torch.no_grad():
            assert torch.equal(out[:rows], block(x[:rows])), rows


@pytest.mark.parametrize("bug", ["every_expert_reads_expert_0", "routing_order_flipped", "stale_logits"])
def test_planted_bugs_fail(bug):
    """every_expert_reads_expert_0: the experts' stride 0 in MoeLayerArgs (the format check fails);
    routing_order_flipped: softmax then top-k run as top-k then softmax (the routing check fails);
    stale_logits: the captured MoE call reading logits the router's call did not write (captured != eager)."""
    dtype = torch.bfloat16 if BF16_READY else torch.float32
    x = torch.randn(7, H, generator=torch.Generator().manual_seed(0)).to(dtype)
    if bug == "routing_order_flipped":
        config = MoEConfig(64, 8, 32, 32, "softmax_topk", renormalize=False)
        native = routing_only(config, dtype)
        native.args.routing = 1
        logits = torch.randn(50, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
        assert not routes_as_torch(native, logits, config)
        return
    block = prepare(make_block("q4_0", dtype))
    assert block.native is not None
    if bug == "every_expert_reads_expert_0":
        block.native.args.w13_stride = block.native.args.w2_stride = 0
        with torch.no_grad():
            assert not within_bound(block, x, block(x))
        return
    if not BF16_READY:
        pytest.skip("captured calls need gemm_bf16 (AVX512_BF16)")
    buffers = moe_buffers([block], 8, dtype, torch.device("cpu"))
    xs, out, stale = (
        torch.zeros(8, H, dtype=dtype),
        torch.zeros(8, H, dtype=dtype),
        torch.randn(8, E).to(dtype),
    )
    ops = moe_ops(block, xs, out, buffers)
    ops[-1].ints[2] = stale.data_ptr()  # the MoE call's logits argument
    xs[:7] = x
    cpu_kernels.run_step_graph((type(ops[0]) * len(ops))(*ops), 7)
    with torch.no_grad():
        assert not torch.equal(out[:7], block(x))
