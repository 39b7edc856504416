"""One decoder covering Llama (1/2/3.x, SmolLM2, TinyLlama), Mistral, Qwen2 (qkv bias) and Qwen3 (q/k norm).

Differences between them are flags (biases, q/k norm, tied embeddings) and the RoPE table; q/k/v and
gate/up projections are fused into one matmul each. Tokens of all sequences of a step are packed into one
flat batch [num_tokens, hidden]; attention goes through the paged KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from backend.engine import cpu_kernels
from backend.engine.attention import AttentionMetadata, paged_attention, write_kv_cache
from backend.engine.device import cpu_has_fast_bf16
from backend.engine.quantization.quantized_linear import QuantizedEmbedding, QuantizedLinear

# checkpoint projection -> (the fused layer holding it, its index there)
FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2)}
FUSED |= {"gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


@dataclass(slots=True)
class ModelArgs:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    layer_windows: tuple[int | None, ...] = ()  # each layer's sliding window (sliding_window.layer_windows)


class Linear(nn.Linear):
    """nn.Linear whose weight is re-laid out once for oneDNN on the CPU (prepare()), or for
    cpu_kernels.gemm_bf16 where that serves a bf16 model (AVX512_BF16 without AMX: see the README).

    oneDNN's packed GEMMs run 1.3-2.5x faster than torch's default ones on this project's CPUs. A bf16
    model on a CPU without bf16 units (AVX2), where torch's bf16 GEMM is 4-7x slower than fp32 beyond a
    few rows, also packs an fp32 copy of its bf16 weights: batches of more than SMALL_BATCH rows compute
    in fp32 and round the output to bf16 (the arithmetic of a bf16 kernel with fp32 accumulation); smaller
    ones, bound by memory traffic, keep reading the bf16 weights, half the bytes. That costs 3x the bf16
    weight memory, counted in weights_bytes().
    """

    SMALL_BATCH = 4
    use_kernel = False  # set by LlamaForCausalLM.prepare_weights when cpu_kernels serve this model
    packed_weight: torch.Tensor | None = None
    packed_bias: torch.Tensor | None = None
    native_weight: torch.Tensor | None = None  # cpu_kernels.gemm_bf16_pack(weight), set by prepare()
    float_output = False  # lm_head on gemm_bf16: logits come out as their fp32 copy (what the sampler takes)
    is_gate_up = False  # MLP's gate_up_proj (gate rows, then up rows): prepare() may fuse SiLU-and-mul in
    fused_silu_and_mul = False  # native_weight holds gate and up panels in turn: only silu_and_mul() reads it
    compute_dtype: torch.dtype | None = None  # set when the packed copy is fp32 for a bf16 model
    linear_pointwise: Any = None  # torch.ops.mkldnn._linear_pointwise.default where packed_weight is set

    def prepare(self) -> None:
        weight = self.weight.detach()
        self.packed_bias = None if self.bias is None else self.bias.detach()  # a view, not a Parameter
        if weight.dtype == torch.bfloat16 and weight.shape[1] % 2 == 0 and cpu_kernels.gemm_bf16_enabled():
            pairs_of_panels = weight.shape[0] % (2 * cpu_kernels.GEMM_BF16_PANEL) == 0
            self.fused_silu_and_mul = self.is_gate_up and pairs_of_panels
            if self.fused_silu_and_mul:
                self.native_weight, self.packed_bias = cpu_kernels.pack_gate_up(weight, self.packed_bias)
            else:
                self.native_weight = cpu_kernels.gemm_bf16_pack(weight)
            self.weight = nn.Parameter(weight.new_empty(0), requires_grad=False)
            return
        # the op's overload itself: calling it skips the packet's overload resolution (about 1.5 us a call)
        self.linear_pointwise = torch.ops.mkldnn._linear_pointwise.default
        if weight.dtype == torch.bfloat16 and not cpu_has_fast_bf16():
            self.compute_dtype = torch.float32
            self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight.float(), 1)
            self.packed_bias = None if self.bias is None else self.bias.detach().float()
            return
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
        self.weight = nn.Parameter(weight.new_empty(0), requires_grad=False)

    def prepared_tensors(self) -> list[torch.Tensor]:
        """What prepare() added to memory."""
        own_bias = self.compute_dtype is not None or self.fused_silu_and_mul  # a copy, not the Parameter
        prepared = (self.packed_weight, self.native_weight, self.packed_bias if own_bias else None)
        return [t for t in prepared if t is not None]

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of this gate_up projection, [T, out_features / 2], in one gemm_bf16 call (the
        projection's own output is never stored); only where prepare() set fused_silu_and_mul."""
        assert self.native_weight is not None and x.dim() == 2 and x.is_contiguous()
        return cpu_kernels.gemm_bf16_silu_and_mul(x, self.native_weight, self.out_features, self.packed_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.native_weight is not None:
            rows = x if x.dim() == 2 and x.is_contiguous() else x.reshape(-1, x.shape[-1]).contiguous()
            dtype = torch.float32 if self.float_output else x.dtype
            out = cpu_kernels.gemm_bf16(rows, self.native_weight, self.out_features, self.packed_bias, dtype)
            return out if x.dim() == 2 else out.view(*x.shape[:-1], self.out_features)
        if self.compute_dtype and x.shape[0] <= self.SMALL_BATCH:
            if self.use_kernel and x.is_contiguous():
                return cpu_kernels.linear_bf16_small(x, self.weight, self.bias)
            return F.linear(x, self.weight, self.bias)
        if self.packed_weight is None:
            return F.linear(x, self.weight, self.bias)
        h = x if self.compute_dtype is None else x.to(self.compute_dtype)
        out = self.linear_pointwise(h, self.packed_weight, self.packed_bias, "none", [], "")
        return out.to(x.dtype)


def can_prepare(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
    )


class RMSNorm(nn.Module):
    use_kernel = False

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_kernel and x.is_contiguous():
            return cpu_kernels.rms_norm(x.view(-1, x.shape[-1]), self.weight, self.eps).view(x.shape)
        # as transformers does: normalise in fp32, scale in the model dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual): the decoder's residual add fused with the next norm."""
        if self.use_kernel and x.is_contiguous() and residual.is_contiguous():
            return cpu_kernels.add_rms_norm(x, residual, self.weight, self.eps)
        residual = x + residual
        return self(residual), residual


@dataclass(slots=True)
class Rope:
    cos: torch.Tensor  # [T, 1, D] for this step's positions
    sin: torch.Tensor  # [T, 1, D], first half negated (see LlamaForCausalLM.forward)
    cos_table: torch.Tensor  # [max_positions, D], for cpu_kernels.rope_and_cache
    sin_table: torch.Tensor


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, D]; cos/sin: [T, 1, D] with sin's first half negated (see LlamaForCausalLM.forward).

    Equals transformers' x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x2, x1), exactly.
    """
    half = x.shape[-1] // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), dim=-1) * sin


class Attention(nn.Module):
    use_kernel = False  # RoPE and the cache write in one cpu_kernels call (not with q/k norm)
    sliding_window: int | None = None  # this layer's (set by LlamaForCausalLM from args.layer_windows)

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = args.num_heads, args.num_kv_heads, args.head_dim
        self.q_size = args.num_heads * args.head_dim
        self.kv_size = args.num_kv_heads * args.head_dim
        self.qkv_proj = Linear(args.hidden_size, self.q_size + 2 * self.kv_size, bias=args.qkv_bias)
        self.o_proj = Linear(self.q_size, args.hidden_size, bias=args.o_bias)
        self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps) if args.qk_norm else None
        self.scale = args.head_dim**-0.5
        self.kv_scales = (1.0, 1.0)  # vLLM's k_scale, v_scale for an fp8 KV pool (1.0: no checkpoint scales)

    def forward(self, x, rope: Rope, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        if self.use_kernel and self.q_norm is None:
            cpu_kernels.rope_and_cache(
                qkv,
                meta.positions,
                rope.cos_table,
                rope.sin_table,
                meta.slot_mapping,
                k_cache,
                v_cache,
                self.num_heads,
                self.kv_scales,
            )
            heads = qkv.view(t, -1, self.head_dim)
            q, k, v = heads.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=1)
        else:
            qk = qkv[:, : self.q_size + self.kv_size].view(t, -1, self.head_dim)  # q heads, then k heads
            if self.q_norm is not None and self.k_norm is not None:
                qk = torch.cat(
                    (self.q_norm(qk[:, : self.num_heads]), self.k_norm(qk[:, self.num_heads :])), 1
                )
            q, k = apply_rope(qk, rope.cos, rope.sin).split([self.num_heads, self.num_kv_heads], dim=1)
            v = qkv[:, self.q_size + self.kv_size :].view(t, self.num_kv_heads, self.head_dim)
            write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping, self.kv_scales)
        o = paged_attention(
            q, k, v, k_cache, v_cache, meta, self.scale, self.kv_scales, sliding_window=self.sliding_window
        )
        return self.o_proj(o.view(t, self.q_size))


class MLP(nn.Module):
    use_kernel = False
    fused_silu_and_mul = False  # gate_up_proj computes silu(gate) * up itself (set by prepare_weights)

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.intermediate_size = args.intermediate_size
        self.gate_up_proj = Linear(args.hidden_size, 2 * args.intermediate_size, bias=args.mlp_bias)
        self.gate_up_proj.is_gate_up = True
        self.down_proj = Linear(args.intermediate_size, args.hidden_size, bias=args.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_silu_and_mul:
            assert isinstance(self.gate_up_proj, Linear)
            return self.down_proj(self.gate_up_proj.silu_and_mul(x))
        gate_up = self.gate_up_proj(x)
        if self.use_kernel:
            return self.down_proj(cpu_kernels.silu_and_mul(gate_up))
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.self_attn = Attention(args)
        self.mlp = MLP(args)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(self, x, residual, rope: Rope, k_cache, v_cache, meta: AttentionMetadata):
        """(this layer's MLP output, the residual stream before it): the stream's adds are fused into the
        next norm (vLLM's layout); the caller adds the last layer's pair."""
        if residual is None:
            h, residual = self.input_layernorm(x), x
        else:
            h, residual = self.input_layernorm.add_forward(x, residual)
        h = self.self_attn(h, rope, k_cache, v_cache, meta)
        h, residual = self.post_attention_layernorm.add_forward(h, residual)
        return self.mlp(h), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.embed_tokens: nn.Embedding | QuantizedEmbedding = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(args) for _ in range(args.num_layers))
        for layer, window in zip(self.layers, args.layer_windows, strict=False):
            assert isinstance(layer, DecoderLayer)
            layer.self_attn.sliding_window = window
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.lm_head: Linear | QuantizedLinear | None = (
            None if args.tie_word_embeddings else Linear(args.hidden_size, args.vocab_size, False)
        )
        self.rope_cos = self.rope_sin = torch.empty(0)  # [max_positions, D], set by the loader

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,  # rows whose next-token logits are needed
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        cos, sin = self.rope_cos[positions].unsqueeze(1), self.rope_sin[positions].unsqueeze(1)
        half = sin.shape[-1] // 2
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)  # folds rotate_half's minus sign in
        rope = Rope(cos, sin, self.rope_cos, self.rope_sin)
        residual = None
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, rope, k_cache, v_cache, meta)
        x = self.norm((x + residual)[logits_indices])
        if self.lm_head is None:
            assert isinstance(self.embed_tokens, nn.Embedding)  # a quantized one comes with its lm_head
            return F.linear(x, self.embed_tokens.weight)
        return self.lm_head(x)

    def weights_bytes(self) -> int:
        tensors: list[torch.Tensor] = [*self.parameters()]
        tensors += [t for m in self.modules() if isinstance(m, Linear) for t in m.prepared_tensors()]
        blocks = {t.data_ptr(): t for t in self.buffers()}  # quantized; a tied embedding's count once
        return sum(t.numel() * t.element_size() for t in [*tensors, *blocks.values()])

    def prepare_weights(self) -> None:
        """Pack every projection for oneDNN on the CPU (see Linear), a tied lm_head getting its own packed
        copy of the embedding, and switch norms, MLPs and small bf16 products to cpu_kernels when built."""
        weight = self.norm.weight
        if can_prepare(weight):
            if self.lm_head is None and isinstance(self.embed_tokens, nn.Embedding):
                self.lm_head = Linear(self.args.hidden_size, self.args.vocab_size, False, device="meta")
                self.lm_head.weight = self.embed_tokens.weight  # shared; prepare() packs a copy
            for module in self.modules():
                if isinstance(module, Linear):
                    module.prepare()
            if isinstance(self.lm_head, Linear):
                self.lm_head.float_output = True  # the runner's .float() of the logits is then a no-op
        use_kernels = cpu_kernels.supports(weight.device, weight.dtype)
        kernel_users = (Linear, RMSNorm, MLP, Attention, QuantizedLinear, QuantizedEmbedding)
        for module in self.modules():
            if isinstance(module, kernel_users):
                module.use_kernel = use_kernels
            if isinstance(module, MLP) and isinstance(module.gate_up_proj, Linear):
                module.fused_silu_and_mul = module.gate_up_proj.fused_silu_and_mul
        if isinstance(self.lm_head, QuantizedLinear):  # interleaved: fp32 logits from the kernel, as Linear's
            self.lm_head.float_output = use_kernels and self.lm_head.all_interleaved

    def load_hf_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy a transformers-named state dict in, fusing q/k/v and gate/up."""
        own = dict(self.named_parameters())
        fused = FUSED
        parts: dict[str, dict[int, torch.Tensor]] = {}
        for name, tensor in state_dict.items():
            name = name.removeprefix("model.")
            if name == "lm_head.weight" and self.lm_head is None:
                continue
            pieces = name.split(".")
            if len(pieces) >= 2 and pieces[-2] in fused:
                target, index = fused[pieces[-2]]
                parts.setdefault(".".join([*pieces[:-2], target, pieces[-1]]), {})[index] = tensor
                continue
            if name not in own:
                raise ValueError(f"unexpected weight {name!r} in the checkpoint")
            own.pop(name).data.copy_(tensor)
        for name, shards in parts.items():
            own.pop(name).data.copy_(torch.cat([shards[i] for i in sorted(shards)], dim=0))
        if own:
            raise ValueError(f"weights missing from the checkpoint: {sorted(own)[:5]}")
