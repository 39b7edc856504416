"""Tiny transformers MoE models per family (fp32, random weights, one decoder layer), their MoE block's output
and routing, our FusedMoE loaded from the checkpoint the model's save_pretrained writes, and a float64
reference of a block on given routing, for the native kernel's error bounds."""

from __future__ import annotations

import tempfile
from typing import Any

import torch
import transformers
from safetensors.torch import load_file

from backend.engine.layers.fused_moe import FusedMoE, load_moe_weight, moe_config, moe_weight
from backend.engine.layers.fused_moe.experts import activation, expert_matrix

HIDDEN, INTERMEDIATE, EXPERTS = 64, 32, 8
COMMON = dict(
    vocab_size=64,
    hidden_size=HIDDEN,
    intermediate_size=INTERMEDIATE,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    initializer_range=0.1,
)


def family_config(family: str) -> Any:
    """A tiny config of each family (top_k 2 or 3 of 8 experts; renormalisation on where it is a choice)."""
    tf = transformers
    configs = {
        "mixtral": lambda: tf.MixtralConfig(**COMMON, num_local_experts=EXPERTS, num_experts_per_tok=2),
        "qwen3_moe": lambda: tf.Qwen3MoeConfig(
            **COMMON, moe_intermediate_size=INTERMEDIATE, num_experts=EXPERTS, num_experts_per_tok=3,
            head_dim=16, norm_topk_prob=True,
        ),
        "olmoe": lambda: tf.OlmoeConfig(**COMMON, num_experts=EXPERTS, num_experts_per_tok=3),
        "granitemoe": lambda: tf.GraniteMoeConfig(**COMMON, num_local_experts=EXPERTS, num_experts_per_tok=2),
        "granitemoeshared": lambda: tf.GraniteMoeSharedConfig(
            **COMMON, num_local_experts=EXPERTS, num_experts_per_tok=2, shared_intermediate_size=48
        ),
        "qwen2_moe": lambda: tf.Qwen2MoeConfig(
            **COMMON, moe_intermediate_size=INTERMEDIATE, shared_expert_intermediate_size=48,
            num_experts=EXPERTS, num_experts_per_tok=2,
        ),
        "gpt_oss": lambda: tf.GptOssConfig(
            **COMMON, num_local_experts=EXPERTS, num_experts_per_tok=2, head_dim=16,
            layer_types=["full_attention"],
        ),
    }  # fmt: skip
    return configs[family]()


FAMILIES = ("mixtral", "qwen3_moe", "olmoe", "granitemoe", "granitemoeshared", "qwen2_moe", "gpt_oss")


def hf_model(family: str, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(family_config(family)).eval()
    if family == "gpt_oss":  # its init leaves the expert biases at zero: give them values
        experts = model.model.layers[0].mlp.experts
        with torch.no_grad():
            experts.gate_up_proj_bias.normal_(0, 0.1)
            experts.down_proj_bias.normal_(0, 0.1)
    return model


def saved_state(model: Any) -> dict[str, torch.Tensor]:
    """The tensors save_pretrained writes (the Hub's names), by name."""
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        return load_file(f"{folder}/model.safetensors")


def layer_tensors(state: dict[str, torch.Tensor], layer: int = 0) -> dict[str, torch.Tensor]:
    prefix = f"model.layers.{layer}."
    return {name.removeprefix(prefix): t for name, t in state.items() if name.startswith(prefix)}


def load_block(model: Any, state: dict[str, torch.Tensor]) -> FusedMoE:
    """Our FusedMoE for the model's layer 0 from state (any spelling moe_weight knows)."""
    block = FusedMoE(moe_config(model.config))
    for name, tensor in layer_tensors(state).items():
        weight = moe_weight(name)
        if weight is not None:
            load_moe_weight(block, weight, tensor)
    return block


def hf_block(model: Any, x: torch.Tensor) -> torch.Tensor:
    """transformers' MoE block of layer 0 (its shared MLP added where the decoder layer adds one): [T, H]."""
    layer = model.model.layers[0]
    with torch.no_grad():
        if hasattr(layer, "block_sparse_moe"):
            out = layer.block_sparse_moe(x.unsqueeze(0))[0]
            return out + layer.shared_mlp(x) if getattr(layer, "shared_mlp", None) is not None else out
        out = layer.mlp(x.unsqueeze(0))
        return (out[0] if isinstance(out, tuple) else out)[0]


def hf_router_indices(model: Any, x: torch.Tensor) -> torch.Tensor:
    """The experts transformers' router picks, [T, K], in its order."""
    layer = model.model.layers[0]
    block = layer.block_sparse_moe if hasattr(layer, "block_sparse_moe") else layer.mlp
    router = block.router if hasattr(block, "router") else block.gate
    with torch.no_grad():
        return router(x)[2]


def reference_bound(
    block: FusedMoE, experts: tuple, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
):
    """(exact, rounding, summation) [T, H] float64 for block's routed experts on the given routing (no shared
    expert), experts as block.experts() gave them before prepare_experts dropped them:
      exact       the output's value from the experts' decoded weights
      rounding    sum_k w_k (|W2_e| (|g| (|u| + 1)) + |y_k|): the scale of the errors that rounding g, u, the
                  activation and each expert's output y_k to x's dtype makes (|act| <= |g| (|u| + 1))
      summation   sum_k w_k |W2_e| (|W_gate||x| (|W_up||x| + 1)): the scale of fp32 summation errors"""
    config = block.config
    out = torch.zeros(x.shape[0], config.hidden_size, dtype=torch.float64)
    rounding, summation = torch.zeros_like(out), torch.zeros_like(out)
    for t in range(x.shape[0]):
        for weight, expert in zip(weights[t].double(), ids[t].tolist(), strict=True):
            w13 = expert_matrix(experts[0], expert, config.num_experts, torch.float32).double()
            w2 = expert_matrix(experts[1], expert, config.num_experts, torch.float32).double()
            b13 = (
                torch.zeros(w13.shape[0], dtype=torch.float64)
                if block.w13_bias is None
                else block.w13_bias[expert]
            )
            b2 = (
                torch.zeros(w2.shape[0], dtype=torch.float64)
                if block.w2_bias is None
                else block.w2_bias[expert]
            )
            gate_up = w13 @ x[t].double() + b13.double()
            y = w2 @ activation(gate_up.unsqueeze(0), config)[0] + b2.double()
            gate, up = gate_up.abs().chunk(2)
            gate_abs, up_abs = (w13.abs() @ x[t].double().abs() + b13.double().abs()).chunk(2)
            out[t] += weight * y
            rounding[t] += weight * (w2.abs() @ (gate * (up + 1)) + y.abs())
            summation[t] += weight * (w2.abs() @ (gate_abs * (up_abs + 1)) + b2.double().abs())
    return out, rounding, summation


def assert_captured_equals_eager(engines: dict[bool, Any], requests: list, max_tokens: tuple[int, ...]):
    """engines[True] runs the modules (enforce_eager), engines[False] the captured decode step: the same
    tokens, and every step's logits bit for bit while batches shrink and grow; both left clean."""
    from backend.engine import SamplingParams
    from tests.engine_utils import assert_engine_clean

    graph = engines[False].llm_engine.runner.decode_graph
    logits: dict[bool, list[torch.Tensor]] = {True: [], False: []}
    for eager, llm in engines.items():
        execute = llm.llm_engine.runner.execute

        def record(scheduled, execute=execute, eager=eager):
            sampling, out = execute(scheduled)
            logits[eager].append(out.clone())
            return sampling, out

        llm.llm_engine.runner.execute = record
    captured_steps = []
    run = graph.run
    graph.run = lambda step: captured_steps.append(step) or run(step)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    params = (params * 2)[: len(requests)]
    tokens = {eager: llm.generate(requests, params) for eager, llm in engines.items()}
    assert [o.outputs[0].token_ids for o in tokens[False]] == [o.outputs[0].token_ids for o in tokens[True]]
    assert len(logits[False]) == len(logits[True]) and len(captured_steps) > 20
    for step, (captured, eager) in enumerate(zip(logits[False], logits[True], strict=True)):
        assert torch.equal(captured, eager), f"step {step}: logits differ"
    assert engines[False].stats().expert_tokens_total == engines[True].stats().expert_tokens_total
    for llm in engines.values():
        assert_engine_clean(llm)
