"""gpt-oss (openai/gpt-oss-20b, -120b: GptOssForCausalLM), as transformers 5.24's modeling_gpt_oss.py
computes it: Llama's pre-norm decoder with biases on q/k/v/o, one learned sink logit per head in every
softmax (AttentionSpec.has_sinks: the paged attention kernels take it), sliding-window and full layers
alternating as config.layer_types says (sliding_window.layer_windows), YaRN RoPE (rope_parameters; the
rotary tables are transformers' ROPE_INIT_FUNCTIONS["yarn"]), and a MoE block in every layer: a router with
a bias, the top-k logits then a softmax over them, experts with biases and the clamped SwiGLU
((clamp(up, ±limit) + 1) * gate * sigmoid(alpha * gate), gate <= limit) over gate_up's alternating columns
(fused_moe/config.py's gpt_oss family).

Experts load as stored: openai's MXFP4 `*_blocks` / `*_scales` (quantization_config quant_method "mxfp4")
become GGUF MXFP4 blocks that csrc/moe.cpp multiplies, nothing rounded; dense `gate_up_proj` [E, H, 2I] and
`down_proj` [E, I, H] (save_pretrained's, transformers' own in-memory layout) are transposed into the
block's [E, 2I, H] / [E, H, I] (fused_moe/checkpoint.py).
"""

from __future__ import annotations

from dataclasses import replace

from backend.engine.layers.attention import AttentionSpec
from backend.engine.models.moe import MoECausalLM


class GptOssForCausalLM(MoECausalLM):
    """The biases come from the checkpoint's names (ModelArgs.from_hf_config), the windows from layer_types,
    the MoE block from the gpt_oss family; the sinks are this class's."""

    def attention_spec(self, layer: int) -> AttentionSpec:
        return replace(super().attention_spec(layer), has_sinks=True)
