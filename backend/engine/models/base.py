"""CausalLM: the base of every model class, and what the rest of the engine may ask of a model.

A family subclasses it and overrides hooks, not the forward pass: `args_from_config` (its config's
spellings), `attention_spec(layer)` (per-layer RoPE, windows, soft-caps, sinks), `make_mlp(layer)` (a
GatedMLP or an MoE block), `make_layer(layer)` (another block structure) and `packed_modules_mapping`
(which checkpoint projections it fuses). The engine reads `args`, `attention_specs` (one per layer: the KV
pool's heads and head size for it; `sliding_windows` their windows) and the modules named here
(embed_tokens, layers, norm, lm_head).

Tokens of all sequences of a step are packed into one flat batch [num_tokens, hidden]; each layer's
attention goes through its own paged KV cache. Constant factors of a family (Granite's multipliers) are
folded into weights after loading where that is exact up to rounding (`fold_scales`), so the kernels and
the captured decode step see a plain pre-norm decoder.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, ClassVar, Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn

from backend.engine import cpu_kernels
from backend.engine.attention import AttentionMetadata
from backend.engine.layers.attention import Attention, AttentionSpec
from backend.engine.layers.decoder import DecoderLayer
from backend.engine.layers.linear import Linear, can_prepare
from backend.engine.layers.mlp import GatedMLP
from backend.engine.layers.norm import RMSNorm
from backend.engine.layers.rotary import RopeSpec, RopeTables, rope_tables
from backend.engine.models.args import ModelArgs
from backend.engine.models.checkpoint import CheckpointNames
from backend.engine.quantization.quantized_linear import Part, QuantizedEmbedding, QuantizedLinear


class KernelUser(Protocol):
    use_kernel: bool  # computes on cpu_kernels (set by CausalLM.prepare_weights)


class OutputScaler(Protocol):
    def scale_output(self, factor: float) -> None: ...  # a GatedMLP's or a FusedMoE's


class CausalLM(nn.Module):
    # the model's fused projections and the checkpoint projections each holds, in order (vLLM's name)
    packed_modules_mapping: ClassVar[dict[str, tuple[str, ...]]] = {
        "qkv_proj": ("q_proj", "k_proj", "v_proj"),
        "gate_up_proj": ("gate_proj", "up_proj"),
    }
    # module types whose use_kernel prepare_weights sets (a family with its own kernel users extends it)
    kernel_users: ClassVar[tuple[type[KernelUser], ...]] = (
        Linear,
        RMSNorm,
        GatedMLP,
        Attention,
        QuantizedLinear,
        QuantizedEmbedding,
    )

    def __init__(self, args: ModelArgs, hf_config: Any) -> None:
        super().__init__()
        self.args, self.config = args, hf_config
        self.attention_specs = [self.attention_spec(i) for i in range(args.num_layers)]
        self.embed_tokens: nn.Embedding | QuantizedEmbedding = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(self.make_layer(i) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.lm_head: Linear | QuantizedLinear | None = (
            None if args.tie_word_embeddings else Linear(args.hidden_size, args.vocab_size, False)
        )
        self.rope_tables: dict[RopeSpec, RopeTables] = {}  # set by init_rope
        self.embedding_scale = 1.0  # a factor on the embeddings not folded into the table (fold_scales)

    # ---- hooks a family overrides ----
    @classmethod
    def args_from_config(cls, hf_config: Any, weight_names: Collection[str]) -> ModelArgs:
        return ModelArgs.from_hf_config(hf_config, weight_names)

    def attention_spec(self, layer: int) -> AttentionSpec:
        """Layer layer's attention; every layer alike here (a family with local/global layers overrides)."""
        a = self.args
        scale = a.attention_scale if a.attention_scale is not None else a.head_dim**-0.5
        rope = RopeSpec(a.rotary_dim)
        window = a.sliding_windows[layer] if a.sliding_windows else None
        return AttentionSpec(
            a.num_heads, a.num_kv_heads, a.head_dim, scale, rope, qk_norm=a.qk_norm, sliding_window=window
        )

    def make_mlp(self, layer: int) -> nn.Module:
        a = self.args
        return GatedMLP(a.hidden_size, a.intermediate_size, a.mlp_bias, a.hidden_act)

    def make_layer(self, layer: int) -> nn.Module:
        a = self.args
        attention = Attention(
            a.hidden_size, self.attention_specs[layer], (a.qkv_bias, a.o_bias), a.rms_norm_eps
        )
        return DecoderLayer(attention, self.make_mlp(layer), a.hidden_size, a.rms_norm_eps)

    @property
    def sliding_windows(self) -> tuple[int | None, ...]:
        """Each layer's sliding window as its spec declares it (None: full attention), for the KV pool's
        sizing and the blocks freed before a window (sliding_window.freeable_window)."""
        return tuple(spec.sliding_window for spec in self.attention_specs)

    # ---- running ----
    def init_rope(self, max_positions: int) -> None:
        """The RoPE tables of every layer's spec for positions [0, max_positions), in the model's dtype."""
        specs = [spec.rope for spec in self.attention_specs]
        self.rope_tables = rope_tables(self.config, specs, max_positions, like=self.norm.weight)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden]
        x = self.embed_tokens(input_ids)
        return x if self.embedding_scale == 1.0 else x * self.embedding_scale

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,  # rows whose next-token logits are needed
    ) -> torch.Tensor:
        x = self.embed(input_ids)
        ropes = {spec: table.at(positions) for spec, table in self.rope_tables.items()}
        residual = None
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, ropes, k_cache, v_cache, meta)
        assert residual is not None
        return self.compute_logits(self.norm((x + residual)[logits_indices]))

    def expert_tokens_total(self) -> list[list[int]]:
        """Per MoE layer, per expert, the token -> expert assignments so far (EngineStats); [] when dense."""
        return []

    def compute_logits(self, x: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
        if self.lm_head is None:
            assert isinstance(self.embed_tokens, nn.Embedding)  # a quantized one comes with its lm_head
            return F.linear(x, self.embed_tokens.weight)
        return self.lm_head(x)

    # ---- weights ----
    def checkpoint_names(self) -> CheckpointNames:
        return CheckpointNames(
            dict(self.named_parameters()), self.packed_modules_mapping, self.lm_head is None
        )

    def take_quantized(self, quantized: dict[str, Part]) -> dict[str, Part]:
        """Keep the quantized weights this model installs itself (a MoE block's experts); the rest, which
        quantization/install.py puts into the model's Linears, come back."""
        return quantized

    def load_hf_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy a transformers-named state dict in, fusing what packed_modules_mapping fuses."""
        for name, tensor in self.checkpoint_names().gather(state_dict).items():
            self.get_parameter(name).data.copy_(tensor)

    def fold_scales(self) -> None:
        """Fold args' constant factors into weights (after loading, before prepare_weights): the embedding
        multiplier into a dense table, the logits multiplier into the final norm's weight (logits are linear
        in it), the residual multiplier into each o_proj and down_proj (Attention / GatedMLP.scale_output).
        A quantized table keeps its factor as embedding_scale."""
        a = self.args
        logits = a.logits_multiplier
        if a.embedding_multiplier != 1.0:
            if isinstance(self.embed_tokens, nn.Embedding):
                self.embed_tokens.weight.data.mul_(a.embedding_multiplier)
                if self.lm_head is None:  # tied: the lm_head reads the scaled table
                    logits /= a.embedding_multiplier
            else:
                self.embedding_scale = a.embedding_multiplier
        if logits != 1.0:
            self.norm.weight.data.mul_(logits)
        if a.residual_multiplier != 1.0:
            for layer in self.layers:
                assert isinstance(layer, DecoderLayer) and hasattr(layer.mlp, "scale_output")
                layer.self_attn.scale_output(a.residual_multiplier)
                cast(OutputScaler, layer.mlp).scale_output(a.residual_multiplier)

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
        for module in self.modules():
            if isinstance(module, self.kernel_users):
                module.use_kernel = use_kernels
            if isinstance(module, GatedMLP) and isinstance(module.gate_up_proj, Linear):
                module.fused_silu_and_mul = module.gate_up_proj.fused_silu_and_mul
            if isinstance(module, Attention):
                module.prepare()
        if isinstance(self.lm_head, QuantizedLinear):  # interleaved: fp32 logits from the kernel, as Linear's
            self.lm_head.float_output = use_kernels and self.lm_head.all_interleaved
