"""stats(): one EngineStats snapshot of the engine, for the UI's charts and the server's /metrics."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from backend.engine.sliding_window import NULL_BLOCK

if TYPE_CHECKING:
    import torch

    from backend.engine.block_manager import BlockManager
    from backend.engine.config import EngineConfig
    from backend.engine.model_runner import ModelRunner
    from backend.engine.scheduler import Scheduler
    from backend.engine.spec_decode.speculator import Speculator


@dataclass(slots=True)
class EngineCounters:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_requests_finished: int = 0
    num_steps: int = 0
    step_time_last_s: float = 0.0
    step_time_total_s: float = 0.0
    compute_threads: int = 0  # the CPU threads steps run on now (AsyncLLM may change it); 0 on a GPU

    def record_step(self, seconds: float) -> None:
        self.num_steps += 1
        self.step_time_last_s = seconds
        self.step_time_total_s += seconds


class StatsSource(Protocol):
    """What engine_stats reads: LLMEngine's parts (a Protocol, so this module does not import the engine)."""

    config: EngineConfig
    model_name: str
    device: torch.device
    dtype: torch.dtype
    weights_bytes: int
    quantization: str | None
    max_model_len: int
    block_manager: BlockManager
    scheduler: Scheduler
    runner: ModelRunner
    counters: EngineCounters
    speculator: Speculator | None
    kv_cache_layout: str  # sliding_window.describe of the model's layers


def _snapshot(items) -> list:
    """A copy of a list/deque that another thread may be changing."""
    while True:
        try:
            return list(items)
        except RuntimeError:
            continue


@dataclass(slots=True)
class EngineStats:
    """One snapshot of the engine (vLLM's metric names where it has them); `to_dict()` at the JSON edge."""

    model: str
    device: str
    dtype: str
    block_size: int
    num_kv_blocks_total: int
    num_kv_blocks_used: int
    kv_cache_usage: float  # used / total
    num_requests_running: int
    num_requests_waiting: int
    num_preemptions_total: int
    prefix_cache_queries_total: int  # in tokens
    prefix_cache_hits_total: int
    prompt_tokens_total: int
    generation_tokens_total: int
    num_requests_finished_total: int
    num_steps_total: int
    step_time_last_s: float
    step_time_mean_s: float
    quantization: str | None  # what runs quantized, e.g. "gguf Q4_1 (210 tensors)"; None: dense
    weights_bytes: int
    kv_pool_bytes: int
    decode_graph_bytes: int  # the captured decode step's buffers (vLLM: CUDA graph memory); 0 when eager
    rss_bytes: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    timestamp: float  # time.time()
    compute_threads: int  # CPU threads a step runs on now (fewer while other processes take cores); 0: GPU
    block_owners: dict[str, list[int]]  # request id -> its KV blocks (not those freed before a window)
    kv_cache_layout: str  # what the pool keeps per layer: sliding windows, blocks freed before them
    num_kv_blocks_freed_by_window_total: int  # blocks given back because they fell before every window
    # block id -> how many sequences hold it, for blocks held by more than one: a prompt shared by a
    # request's parallel samples (n > 1), or a prefix-cache hit shared by several requests
    shared_blocks: dict[int, int] = field(default_factory=dict)
    # speculative decoding (vLLM's spec_decode counters); method None and zeros when it is off
    speculative_method: str | None = None
    num_speculative_tokens: int = 0
    spec_decode_num_drafts_total: int = 0
    spec_decode_num_draft_tokens_total: int = 0
    spec_decode_num_accepted_tokens_total: int = 0
    spec_decode_num_accepted_tokens_per_pos_total: list[int] = field(default_factory=list)
    spec_decode_acceptance_rate: float = 0.0  # accepted / draft tokens
    spec_decode_mean_acceptance_length: float = 0.0  # tokens gained per verification, bonus included
    # per MoE layer, per expert: token -> expert assignments routed since start (top_k per token a layer);
    # empty for a dense model. The Chat tab's expert-load chart takes differences of two snapshots.
    expert_tokens_total: list[list[int]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def engine_stats(engine: StatsSource) -> EngineStats:
    import psutil

    bm, sched, counters, cfg = engine.block_manager, engine.scheduler, engine.counters, engine.config
    running, waiting = _snapshot(sched.running), _snapshot(sched.waiting)
    owners: dict[str, dict[int, None]] = {}
    for seq in running + waiting:
        held = [block for block in _snapshot(seq.block_table) if block != NULL_BLOCK]
        if held:  # a request's samples share their prompt's blocks: each block once
            owners.setdefault(seq.request_id, {}).update(dict.fromkeys(held))
    shared = {block: count for block, count in enumerate(_snapshot(bm.ref_counts)) if count > 1}
    used = bm.num_used_blocks
    running_ids = {seq.request_id for seq in running}
    return EngineStats(
        model=engine.model_name,
        device=str(engine.device),
        dtype=str(engine.dtype).removeprefix("torch."),
        block_size=bm.block_size,
        num_kv_blocks_total=bm.num_blocks,
        num_kv_blocks_used=used,
        kv_cache_usage=used / bm.num_blocks,
        num_requests_running=len(running_ids),
        num_requests_waiting=len({seq.request_id for seq in waiting} - running_ids),
        num_preemptions_total=sched.num_preemptions,
        prefix_cache_queries_total=bm.prefix_cache_queries,
        prefix_cache_hits_total=bm.prefix_cache_hits,
        prompt_tokens_total=counters.prompt_tokens,
        generation_tokens_total=counters.generation_tokens,
        num_requests_finished_total=counters.num_requests_finished,
        num_steps_total=counters.num_steps,
        step_time_last_s=counters.step_time_last_s,
        step_time_mean_s=counters.step_time_total_s / max(1, counters.num_steps),
        quantization=engine.quantization,
        weights_bytes=engine.weights_bytes,
        kv_pool_bytes=engine.runner.kv_pool_bytes,
        decode_graph_bytes=graph.buffer_bytes if (graph := engine.runner.decode_graph) is not None else 0,
        rss_bytes=psutil.Process(os.getpid()).memory_info().rss,
        max_model_len=engine.max_model_len,
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        timestamp=time.time(),
        compute_threads=counters.compute_threads,
        block_owners={request_id: list(blocks) for request_id, blocks in owners.items()},
        kv_cache_layout=engine.kv_cache_layout,
        num_kv_blocks_freed_by_window_total=bm.num_skipped_blocks,
        shared_blocks=shared,
        expert_tokens_total=engine.runner.model.expert_tokens_total(),
        **spec_decode_fields(engine.speculator),
    )


def spec_decode_fields(speculator: Speculator | None) -> dict[str, Any]:
    if speculator is None:
        return {}
    spec = speculator.stats
    return {
        "speculative_method": speculator.config.method,
        "num_speculative_tokens": speculator.config.num_speculative_tokens,
        "spec_decode_num_drafts_total": spec.num_drafts,
        "spec_decode_num_draft_tokens_total": spec.num_draft_tokens,
        "spec_decode_num_accepted_tokens_total": spec.num_accepted_tokens,
        "spec_decode_num_accepted_tokens_per_pos_total": list(spec.num_accepted_tokens_per_pos),
        "spec_decode_acceptance_rate": spec.acceptance_rate,
        "spec_decode_mean_acceptance_length": spec.mean_acceptance_length,
    }
