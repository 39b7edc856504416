"""Layers every model family shares (vLLM's model_executor/layers): projections packed for the CPU's GEMMs
(linear), RMSNorm with the residual add fused in (norm), RoPE tables and their application (rotary), the
gated MLP (mlp), attention over the paged KV cache (attention) and the pre-norm decoder block (decoder).
A family file under models/ composes them; a family that needs a variant adds it here, once."""
