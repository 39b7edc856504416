"""Helpers shared by the engine tests (no tests here): tiny random models saved locally, the
transformers reference, and the check that an engine holds no KV blocks after a test."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache
from pathlib import Path

import torch

ARCHITECTURES = ("llama", "llama_mqa_tied", "llama3_rope", "mistral", "qwen2", "qwen3", "granite")
ARCHITECTURES += ("olmo2", "phi3", "phi4_mini", "smollm3", "gemma3")
# families whose norm weights are drawn at random (not transformers' ones), so that a misplaced norm shows
RANDOM_NORMS = ("olmo2", "phi3", "phi4_mini", "phi4_mini_long", "smollm3", "gemma3")
# varied lengths around block boundaries (block_size 16 in most tests)
PROMPT_LENGTHS = (1, 5, 16, 17, 33, 70)
WINDOW = 20  # the windowed tiny models' sliding_window: not a multiple of block_size 16, below most prompts
_ROOT = Path(tempfile.mkdtemp(prefix="engine-tests-"))
atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)


@cache
def tokenizer_dir() -> str:
    """The default model's real tokenizer (with its chat template), saved as a plain HF tokenizer folder."""
    from transformers import AutoTokenizer

    from backend.default_model import default_model, split_gguf_path

    folder, gguf_file = split_gguf_path(default_model(check_hub=False))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    path = _ROOT / "tokenizer"
    tokenizer.save_pretrained(path)
    return str(path)


def _config(arch: str, vocab_size: int):
    from transformers import (
        Gemma3TextConfig,
        GraniteConfig,
        LlamaConfig,
        MistralConfig,
        Olmo2Config,
        Phi3Config,
        Qwen2Config,
        Qwen3Config,
        SmolLM3Config,
    )

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        initializer_range=0.25,  # sharp attention, so that positions and masks matter to the output
    )
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "llama_flat":  # transformers' default init: nearly flat logits, so penalties dominate
        return LlamaConfig(**common | dict(initializer_range=0.02))
    if arch == "llama_gelu":  # Gemma's MLP activation (tests/features_model_utils.py)
        return LlamaConfig(**common | dict(hidden_act="gelu_pytorch_tanh"))
    if arch == "llama_mqa_tied":
        return LlamaConfig(
            **common | dict(num_key_value_heads=1, tie_word_embeddings=True, attention_bias=True)
        )
    if arch == "llama3_rope":
        rope = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0)
        rope |= dict(high_freq_factor=4.0, original_max_position_embeddings=32)
        return LlamaConfig(
            **common | dict(num_attention_heads=4, num_key_value_heads=4, rope_parameters=rope)
        )
    if arch == "mistral":
        return MistralConfig(**common | dict(sliding_window=None))
    if arch == "mistral_window":  # every layer windowed: blocks before the window are freed
        return MistralConfig(**common | dict(sliding_window=WINDOW))
    if arch == "qwen2_hybrid":  # layer 0 full, layer 1 windowed (max_window_layers): every block kept
        return Qwen2Config(
            **common | dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
        )
    if arch == "qwen2":
        return Qwen2Config(**common)
    if arch == "qwen3":
        return Qwen3Config(**common | dict(head_dim=32))
    if arch == "granite":  # tied, as Granite 3.x is, and every multiplier away from 1
        # (granite-3.0-2b's 12 and 0.22 make this random model repeat one token: a test that shows little)
        multipliers = dict(embedding_multiplier=2.0, residual_multiplier=0.5, logits_scaling=4.0)
        multipliers |= dict(attention_multiplier=0.2, tie_word_embeddings=True)
        return GraniteConfig(**common | multipliers)
    if arch == "olmo2":
        return Olmo2Config(**common)
    if arch == "phi3":  # Phi-3-mini: fused qkv_proj and gate_up_proj in the checkpoint
        return Phi3Config(**common)
    if arch.startswith("phi4_mini"):  # Phi-4-mini: LongRoPE on 3/4 of each head, tied embeddings
        return Phi3Config(
            **common | dict(hidden_size=128, tie_word_embeddings=True), rope_parameters=longrope(arch)
        )
    if arch == "smollm3":  # four layers: the last has no RoPE (SmolLM3-3B's every-4th pattern)
        return SmolLM3Config(**common | dict(num_hidden_layers=4, pad_token_id=0))
    if arch == "gemma3":  # six layers: five local, one global (Gemma 3's pattern), logits soft-capped
        gemma = dict(num_hidden_layers=6, head_dim=32, query_pre_attn_scalar=24, pad_token_id=0)
        gemma |= dict(sliding_window=512, final_logit_softcapping=30.0, tie_word_embeddings=True)
        return Gemma3TextConfig(**common | gemma)
    raise ValueError(arch)


def longrope(arch: str) -> dict:
    """Phi-4-mini's rope_parameters in small: 24 of 32 dims rotate, with per-frequency factors. "phi4_mini"
    never passes its original context (the short factors, attention factor 1); "phi4_mini_long" has an
    original context of 64 in 512 (the long factors past it, attention factor sqrt(1 + ln 8 / ln 64))."""
    original = 64 if arch == "phi4_mini_long" else 512
    rope = dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.75)
    rope |= dict(original_max_position_embeddings=original)
    return rope | dict(
        short_factor=[1.0 + i / 8 for i in range(12)], long_factor=[1.0 + i for i in range(12)]
    )


@cache
def tiny_model(arch: str) -> tuple[str, torch.nn.Module]:
    """(folder, transformers model in fp32 eval mode) of a tiny random model, saved as sharded safetensors."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir())
    torch.manual_seed(sum(map(ord, arch)))
    model = AutoModelForCausalLM.from_config(_config(arch, len(tokenizer)), dtype=torch.float32).eval()
    if arch in RANDOM_NORMS:
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "norm" in name:
                    parameter.normal_(1.0, 0.5)
    path = _ROOT / arch
    model.save_pretrained(path, max_shard_size="2MB")  # several shards: exercises the index file
    tokenizer.save_pretrained(path)
    return str(path), model


def prompts(lengths: tuple[int, ...] = PROMPT_LENGTHS, seed: int = 0, vocab: int = 49152) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


_reference_cache: dict[tuple, list[int]] = {}


def hf_greedy(arch_or_model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy continuation (stops after eos, like the engine without ignore_eos)."""
    model = tiny_model(arch_or_model)[1] if isinstance(arch_or_model, str) else arch_or_model
    key = (model, tuple(prompt), max_new_tokens)  # the model itself: an id could be reused after GC
    if key not in _reference_cache:
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=0,
            )[0, len(prompt) :].tolist()
        eos = model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos])
        for i, token in enumerate(out):
            if token in eos:
                out = out[: i + 1]
                break
        _reference_cache[key] = out
    return _reference_cache[key]


def assert_engine_clean(llm) -> None:
    """No request left, every KV block free, every reference count zero."""
    engine = llm.llm_engine
    bm = engine.block_manager
    assert not engine.requests, f"requests left: {list(engine.requests)}"
    assert not engine.scheduler.running and not engine.scheduler.waiting
    assert bm.num_free_blocks == bm.num_blocks, f"{bm.num_used_blocks} KV blocks still in use"
    assert all(count == 0 for count in bm.ref_counts)
    assert llm.stats().num_kv_blocks_used == 0
    if engine.speculator is not None:  # the draft model's own KV pool, too
        assert engine.speculator.proposer.num_used_blocks == 0, "draft KV blocks still in use"


def count_identical_within_top5(ours, reference) -> int:
    """How many greedy continuations (CompletionOutputs with logprobs=5) are identical in the two runs;
    where one first differs, each side's token must be among the other's top 5 there."""
    identical = 0
    for a, b in zip(ours, reference, strict=True):
        mismatch = next(
            (i for i, (s, t) in enumerate(zip(a.token_ids, b.token_ids, strict=True)) if s != t), None
        )
        if mismatch is None:
            identical += 1
            continue
        assert b.token_ids[mismatch] in a.logprobs[mismatch]
        assert a.token_ids[mismatch] in b.logprobs[mismatch]
    return identical


def planned_graph_bytes(llm, stats) -> int:
    """The planner's bytes for the captured decode step of the engine as it runs (the Launch card's plan)."""
    from backend.planner import estimate
    from backend.planner.launch_here import running_engine_plan

    return estimate(running_engine_plan(llm.llm_engine.config, stats)).cuda_graph_bytes
