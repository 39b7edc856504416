"""Sliding-window models: which layers are windowed (from config.json or a transformers config), what the
KV cache keeps (the planner's bytes, stats() and the start log), the blocks before a window freed when every
layer is windowed (the scheduler and block manager under prefix caching and preemption, checked after every
step), and the engine's greedy output against transformers' on prompts longer than the window."""

from __future__ import annotations

import logging
import random
from dataclasses import replace

import pytest
import torch

from backend.engine import LLM, SamplingParams
from backend.engine.block_manager import BlockManager
from backend.engine.scheduler import Scheduler
from backend.engine.sequence import Sequence, SequenceStatus
from backend.engine.sliding_window import (
    NULL_BLOCK,
    blocks_read,
    describe,
    first_needed_block,
    kv_cache_bytes,
    layer_windows,
)
from backend.planner import PlanRequest, estimate
from tests.engine_utils import WINDOW, assert_engine_clean, hf_greedy, prompts, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"num_hidden_layers": 3, "sliding_window": 4096}, (4096,) * 3),  # Mistral 7B v0.1, Phi-3 mini 4k
        ({"num_hidden_layers": 2, "sliding_window": None}, (None, None)),  # Mistral v0.2+
        ({"model_type": "gemma2", "num_hidden_layers": 4, "sliding_window": 4096}, (4096, None) * 2),
        (
            {
                "model_type": "gemma3_text",
                "num_hidden_layers": 7,
                "sliding_window": 512,
                "sliding_window_pattern": 6,
            },
            (512,) * 5 + (None, 512),
        ),
        (
            {"text_config": {"model_type": "gemma3_text", "num_hidden_layers": 6, "sliding_window": 1024}},
            (1024,) * 5 + (None,),
        ),
        (
            {
                "num_hidden_layers": 2,
                "sliding_window": 128,
                "layer_types": ["sliding_attention", "full_attention"],
            },
            (128, None),
        ),
        (
            {"num_hidden_layers": 4, "sliding_window": 32768, "use_sliding_window": False},
            (None,) * 4,
        ),  # Qwen2
        (
            {
                "num_hidden_layers": 4,
                "sliding_window": 64,
                "use_sliding_window": True,
                "max_window_layers": 2,
            },
            (None, None, 64, 64),
        ),
    ],
)
def test_layer_windows_from_config_json(config, expected):
    assert layer_windows(config) == expected


def test_layer_windows_from_transformers_configs():
    from transformers import Gemma2Config, GptOssConfig, MistralConfig, Qwen2Config

    assert layer_windows(MistralConfig(num_hidden_layers=2, sliding_window=64)) == (64, 64)
    assert layer_windows(Gemma2Config(num_hidden_layers=4, sliding_window=64)) == (64, None, 64, None)
    assert layer_windows(GptOssConfig(num_hidden_layers=2, sliding_window=128)) == (128, None)
    hybrid = Qwen2Config(num_hidden_layers=3, use_sliding_window=True, sliding_window=32, max_window_layers=1)
    assert layer_windows(hybrid) == (None, 32, 32)
    assert layer_windows(Qwen2Config(num_hidden_layers=3)) == (None,) * 3  # use_sliding_window False


def test_what_each_layer_keeps():
    assert blocks_read(512, 16) == 33 and blocks_read(16, 16) == 2 and blocks_read(1, 16) == 1
    assert first_needed_block(100, 20, 16) == 5  # position 100 reads keys 81..100: blocks 5 and 6
    gemma3 = (512,) * 5 + (None,)
    assert describe(gemma3, 16) == (
        "sliding window 512 on 5 of 6 layers: those layers read at most 33 blocks per sequence; every block "
        "is kept for the 1 full-attention layer"
    )
    assert describe((4096, 4096), 16).endswith("; blocks before the window are freed")
    assert describe((None, None), 16) == "full attention on every layer: every block of a sequence is kept"
    # 4 layers of 1 KiB per token; a 10,000-token sequence
    full = kv_cache_bytes((None,) * 4, 1024, 10_000, 16)
    assert full.per_token_full == 4096 and full.per_sequence == full.engine_per_sequence == 625 * 16 * 4096
    hybrid = kv_cache_bytes((512, 512, 512, None), 1024, 10_000, 16)
    held = 625 - (10_000 - 512) // 16  # the window's last 512 keys: blocks 593 .. 624
    assert hybrid.per_token_full == 1024
    assert hybrid.per_sequence == (3 * held + 625) * 16 * 1024
    assert hybrid.engine_per_sequence == full.engine_per_sequence  # one table: the full layer keeps all
    windowed = kv_cache_bytes((512,) * 4, 1024, 10_000, 16)
    assert (
        windowed.per_token_full == 0
        and windowed.per_sequence == windowed.engine_per_sequence == held * 16 * 4096
    )


def make_seq(request_id: str, tokens: list[int]) -> Sequence:
    return Sequence(request_id, 0, tokens, SamplingParams(max_tokens=1), None, None)  # type: ignore[arg-type]


def check_invariants(bm: BlockManager, seqs: list[Sequence], scheduled: list[Sequence], window: int) -> None:
    """Right after schedule(): every block's reference count is the number of tables holding it, a free
    block is held by none; a running sequence holds every block from its next token's window on, and a
    scheduled one none wholly before it."""
    holders = [0] * bm.num_blocks
    for seq in seqs:
        for block in seq.block_table:
            if block != NULL_BLOCK:
                holders[block] += 1
    assert holders == bm.ref_counts
    assert set(bm.free_blocks) == {b for b in range(bm.num_blocks) if holders[b] == 0}
    for seq in seqs:
        skipped = first_needed_block(seq.num_computed_tokens, window, bm.block_size)
        if seq.status == SequenceStatus.RUNNING:
            assert NULL_BLOCK not in seq.block_table[skipped:]
        if seq in scheduled:
            assert seq.block_table[:skipped] == [NULL_BLOCK] * skipped


@pytest.mark.parametrize("window", [5, 16, 40])  # under a block, one block, several and not a multiple
@pytest.mark.parametrize("enable_prefix_caching", [True, False])
def test_blocks_before_the_window_are_freed_without_leaks(window, enable_prefix_caching):
    """Random prompts sharing prefixes, chunked prefill (12 tokens a step), a pool small enough to preempt:
    invariants after every step, every block free at the end, prefix hits still served."""
    rng = random.Random(window)
    # one sequence's most: its window's blocks, a 12-token chunk's 3 and one; two more: others preempted
    bm = BlockManager(blocks_read(window, 4) + 6, 4, enable_prefix_caching, sliding_window=window)
    scheduler = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=12)
    shared = [rng.randrange(100) for _ in range(30)]
    seqs = []
    for i in range(12):
        own = [rng.randrange(100) for _ in range(rng.randrange(1, 40))]
        seqs.append(make_seq(str(i), shared[: rng.randrange(31)] + own))
    targets = {seq.request_id: len(seq.token_ids) + rng.randrange(1, 30) for seq in seqs}
    for seq in seqs:
        scheduler.add(seq)
    steps = 0
    while scheduler.running or scheduler.waiting:
        steps += 1
        assert steps < 5000, "no progress"
        scheduled = scheduler.schedule()
        check_invariants(bm, seqs, [item.seq for item in scheduled], window)
        for item in scheduled:
            seq = item.seq
            seq.num_computed_tokens += item.num_new_tokens
            bm.cache_full_blocks(seq)
            if item.samples:
                seq.token_ids.append(rng.randrange(100))
                if len(seq.token_ids) >= targets[seq.request_id]:
                    scheduler.finish(seq)
    assert bm.num_free_blocks == bm.num_blocks and not any(bm.ref_counts)
    assert bm.num_skipped_blocks > 0 and scheduler.num_preemptions > 0
    assert (bm.prefix_cache_hits > 0) is enable_prefix_caching


def test_a_cached_prefix_longer_than_the_window_keeps_only_the_window():
    bm = BlockManager(40, 4, True, sliding_window=6)
    scheduler = Scheduler(bm, max_num_seqs=2, max_num_batched_tokens=64)
    first = make_seq("a", list(range(40)))
    scheduler.add(first)
    [item] = scheduler.schedule()
    first.num_computed_tokens += item.num_new_tokens
    bm.cache_full_blocks(first)
    scheduler.finish(first)  # its 10 blocks stay cached in the free list
    second = make_seq("b", [*range(40), 7])
    scheduler.add(second)
    [item] = scheduler.schedule()
    assert second.num_computed_tokens == 40 and item.num_new_tokens == 1  # every block a prefix hit
    # position 40 reads keys 35..40: blocks 8 (32-35), 9 and 10 (the new token's); 0..7 given back
    assert second.block_table[:8] == [NULL_BLOCK] * 8 and NULL_BLOCK not in second.block_table[8:]
    assert bm.num_used_blocks == 3


def engine_outputs(arch: str, batch: list[list[int]], **kwargs):
    llm = LLM(tiny_model(arch)[0], dtype="float32", device="cpu", max_num_batched_tokens=16, **kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=24)
    return llm, [out.outputs[0].token_ids for out in llm.generate(batch, params)]


@pytest.mark.parametrize("path", ["kernels", "pytorch"])
def test_windowed_model_matches_transformers_with_prefix_caching_and_preemption(path, monkeypatch, caplog):
    """Mistral with a window of 20 on every layer: prompts up to 3.5 windows long in 16-token chunks, run
    twice (the second time on prefix hits), in a pool of 12 blocks for 6 sequences (preemptions)."""
    if path == "pytorch":
        monkeypatch.setenv("PLAYGROUND_CPU_KERNELS", "0")
    shared = prompts(lengths=(40,), seed=11)[0]
    batch = prompts(lengths=(5, 33, 70), seed=12) + [shared + p for p in prompts(lengths=(3, 30, 1), seed=13)]
    with caplog.at_level(logging.INFO, logger="backend.engine.llm_engine"):
        llm, _ = engine_outputs("mistral_window", [], num_kv_blocks=12, enable_prefix_caching=True)
    assert (
        "sliding window 20 on 2 of 2 layers" in caplog.text
        and "blocks before the window are freed" in caplog.text
    )
    params = SamplingParams(temperature=0.0, max_tokens=24)
    for _ in range(2):
        outs = llm.generate(batch, params)
        for prompt, out in zip(batch, outs, strict=True):
            assert out.outputs[0].token_ids == hf_greedy("mistral_window", prompt, 24)
    stats = llm.stats()
    assert stats.num_kv_blocks_freed_by_window_total > 0 and stats.num_preemptions_total > 0
    assert stats.prefix_cache_hits_total > 0 and "sliding window 20" in stats.kv_cache_layout
    assert_engine_clean(llm)


def test_hybrid_model_keeps_every_block_and_matches_transformers():
    """Qwen2 with layer 0 full and layer 1 windowed: each layer attends as transformers' does, no block is
    freed (the full layer reads them all) and stats() says so."""
    batch = prompts(lengths=(5, 33, 70), seed=14)
    llm, tokens = engine_outputs("qwen2_hybrid", batch, enable_prefix_caching=True)
    for prompt, got in zip(batch, tokens, strict=True):
        assert got == hf_greedy("qwen2_hybrid", prompt, 24)
    stats = llm.stats()
    assert stats.num_kv_blocks_freed_by_window_total == 0
    assert stats.kv_cache_layout.endswith("every block is kept for the 1 full-attention layer")
    assert_engine_clean(llm)


@pytest.mark.parametrize(
    ("arch", "blocks_per_sequence"),
    [("mistral_window", 3 + 1 + 1), ("qwen2_hybrid", 512 // 16), ("mistral", 512 // 16)],
)
def test_the_planner_sizes_the_embedded_pool_as_the_engine_does(arch, blocks_per_sequence):
    """max_num_seqs sequences of max_model_len 512: all-windowed (20 tokens), the window's 3 blocks, one
    16-token chunk's and one for a window starting mid-block each; a hybrid or full model, all 32 blocks.
    The planner's embedded estimate gives the engine's pool bytes, max_model_len and longest sequence."""
    folder = tiny_model(arch)[0]
    sizes = dict(max_num_seqs=3, max_num_batched_tokens=16)
    stats = LLM(folder, dtype="float32", device="cpu", **sizes).stats()
    block_bytes = 2 * 2 * 16 * 2 * 16 * 4  # K and V, 2 layers, 16 tokens, 2 KV heads of 16, fp32
    assert stats.kv_pool_bytes == 3 * blocks_per_sequence * block_bytes
    request = PlanRequest(
        model=folder, gpu="cpu", engine="embedded", quant="fp32", gpu_memory_utilization=1.0, **sizes
    )
    est = estimate(replace(request, input_len=150, output_len=50))
    assert est.kv_cache_bytes == stats.kv_pool_bytes
    assert est.max_model_len == est.max_model_len_single == stats.max_model_len == 512
    held = 2 if arch == "mistral_window" else 13  # a 200-token sequence's blocks: the window's, or all
    assert est.max_concurrency == 3 and est.kv_bytes_per_sequence == held * block_bytes


def test_window_matters_for_the_reference():
    """The tiny windowed model's greedy output on a long prompt differs from the same weights without a
    window: the comparisons above could not pass with the window ignored."""
    model = tiny_model("mistral_window")[1]
    prompt = prompts(lengths=(70,), seed=12)[0]
    windowed = hf_greedy(model, prompt, 24)
    model.config.sliding_window = None
    try:
        with torch.inference_mode():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, pad_token_id=0)
    finally:
        model.config.sliding_window = WINDOW
    assert out[0, len(prompt) :].tolist()[: len(windowed)] != windowed


def test_parallel_samples_of_a_prompt_longer_than_the_window_share_and_free_cleanly():
    """n=3 samples of a 70-token prompt on a model windowed to 20 on every layer: the fork skips the blocks
    freed before the window (NULL_BLOCK), each sample equals the same seed run alone, and every block comes
    back (reference counts never negative, none held after the requests finish)."""
    llm, _ = engine_outputs("mistral_window", [], num_kv_blocks=40, enable_prefix_caching=True)
    prompt = prompts(lengths=(70,), seed=21)[0]
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=12)
    out = llm.generate([prompt], params)[0]
    assert len(out.outputs) == 3 and llm.stats().num_kv_blocks_freed_by_window_total > 0
    for i, sample in enumerate(out.outputs):
        alone = llm.generate([prompt], SamplingParams(temperature=1.0, seed=5 + i, max_tokens=12))[0]
        assert sample.token_ids == alone.outputs[0].token_ids
    assert min(llm.llm_engine.block_manager.ref_counts) >= 0
    assert_engine_clean(llm)
