"""The Chat tab's KV block map draws what the engine's stats say: each request's blocks, and a diamond on
each block several sequences hold (the prompt of a request's parallel samples)."""

from __future__ import annotations

import pytest

from backend.engine import LLM, SamplingParams
from tests.engine_utils import assert_engine_clean, prompts, tiny_model
from ui.charts import kv_block_map_figure

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_block_map_marks_the_blocks_parallel_samples_share():
    llm = LLM(tiny_model("llama")[0], dtype="float32", device="cpu", max_model_len=128, num_kv_blocks=80)
    engine = llm.llm_engine
    engine.add_request("four", prompts((37,), seed=40)[0], SamplingParams(n=4, max_tokens=20, seed=1))
    engine.add_request("one", prompts((20,), seed=41)[0], SamplingParams(max_tokens=20))
    engine.step(), engine.step()  # prefill both, then one decode step (3 copies of the partial block)
    stats = llm.stats()
    four = stats.block_owners["four"]
    assert len(four) == 3 + 3 and len(stats.block_owners["one"]) == 2
    assert stats.shared_blocks == {block: 4 for block in four[:2]}
    fig = kv_block_map_figure(stats.block_owners, stats.num_kv_blocks_total, 16, stats.shared_blocks)
    heatmap, diamonds = fig.data
    held = {(r, c) for r, row in enumerate(heatmap.z) for c, cell in enumerate(row) if cell is not None}
    assert held == {(b // 16, b % 16) for blocks in stats.block_owners.values() for b in blocks}
    assert list(zip(diamonds.y, diamonds.x, strict=True)) == [(b // 16, b % 16) for b in four[:2]]
    assert all("shared by 4 sequences" in text for text in diamonds.text)
    assert "shared by several sequences" in fig.layout.title.text
    plain = kv_block_map_figure(stats.block_owners, stats.num_kv_blocks_total, 16)
    assert len(plain.data) == 1 and "shared" not in plain.layout.title.text
    engine.abort_request("four"), engine.abort_request("one")
    assert_engine_clean(llm)
