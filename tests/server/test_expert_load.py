"""The expert-load picture: tokens per expert per MoE layer over the last seconds, from the difference of two
cumulative expert_tokens_total snapshots (built by hand here), kept over a sliding window, reset by a
relaunch, absent for a dense model; the chart draws exactly that matrix; the Chat tab's live timer shows it
for a MoE model served by the app's EngineHolder and hides it for a dense one."""

from __future__ import annotations

import pytest

from backend.engine import SamplingParams
from backend.engine.config import EngineConfig
from backend.server.engine_holder import EngineHolder
from backend.server.expert_load import ExpertLoad, ExpertLoadHistory, ExpertSnapshot, expert_load
from tests.engine_utils import tiny_model
from tests.gguf_family_utils import tiny_family_model
from ui import charts, chat_tab


@pytest.fixture(scope="module")
def tiny() -> str:
    return tiny_model("llama")[0]


def test_the_load_is_the_difference_of_two_snapshots():
    before = ExpertSnapshot(100.0, [[5, 0, 3, 0], [1, 1, 1, 1]])
    after = ExpertSnapshot(104.0, [[9, 0, 3, 6], [1, 4, 1, 9]])
    load = expert_load(before, after)
    assert load.tokens == [[4, 0, 0, 6], [0, 3, 0, 8]] and load.seconds == 4.0
    assert load.total == 21
    assert load.shares() == [[0.4, 0.0, 0.0, 0.6], [0.0, 3 / 11, 0.0, 8 / 11]]
    assert ExpertLoad([[0, 0]], 1.0).shares() == [[0.0, 0.0]]  # an idle layer


@pytest.mark.parametrize(
    "after",
    [
        ExpertSnapshot(104.0, [[9, 0, 3], [1, 4, 1]]),  # other experts
        ExpertSnapshot(104.0, [[9, 0, 3, 6]]),  # other layers
        ExpertSnapshot(104.0, [[4, 0, 3, 6], [1, 4, 1, 9]]),  # a count went down
        ExpertSnapshot(99.0, [[9, 0, 3, 6], [1, 4, 1, 9]]),  # earlier
    ],
)
def test_snapshots_of_two_engines_are_refused(after):
    with pytest.raises(ValueError, match="same layers and experts"):
        expert_load(ExpertSnapshot(100.0, [[5, 0, 3, 0], [1, 1, 1, 1]]), after)


def per_second(steps: list[list[int]], start: float = 0.0) -> list[tuple[float, list[list[int]]]]:
    """Cumulative one-layer snapshots, one a second, from what each second routed."""
    totals, out = [0] * len(steps[0]), []
    for second, routed in enumerate(steps):
        totals = [t + r for t, r in zip(totals, routed, strict=True)]
        out.append((start + second, [list(totals)]))
    return out


def test_the_history_spans_the_last_window_only():
    history = ExpertLoadHistory(window_s=3.0)
    assert history.load() is None
    # seconds 0..5: expert 0 busy first, then expert 2
    for timestamp, totals in per_second([[0, 0, 0], [8, 0, 0], [8, 0, 0], [0, 1, 4], [0, 0, 4], [0, 0, 4]]):
        history.add(timestamp, totals)
    load = history.load()
    assert load is not None and load.seconds == 3.0  # seconds 2 -> 5
    assert load.tokens == [[0, 1, 12]]
    assert len(history.snapshots) == 4


def test_a_dense_model_has_no_picture_and_a_relaunch_starts_afresh():
    history = ExpertLoadHistory()
    history.add(0.0, [])
    history.add(1.0, [])
    assert history.load() is None  # EngineStats.expert_tokens_total is empty for a dense model
    history.add(2.0, [[10, 10]])
    history.add(3.0, [[15, 11]])
    assert history.load().tokens == [[5, 1]]
    history.add(4.0, [[2, 0]])  # a new engine counts from zero
    assert history.load() is None
    history.add(5.0, [[3, 4]])
    assert history.load().tokens == [[1, 4]]
    history.add(6.0, [])  # relaunched with a dense model
    assert history.load() is None
    with pytest.raises(ValueError, match="window_s"):
        ExpertLoadHistory(window_s=0)


def test_the_chart_draws_the_matrix_layers_by_experts():
    load = ExpertLoad([[4, 0, 0, 6], [0, 3, 0, 8]], 10.0)
    fig = charts.expert_load_figure(load)
    (heatmap,) = fig.data
    assert [list(row) for row in heatmap.z] == load.tokens
    assert list(heatmap.y) == ["MoE layer 0", "MoE layer 1"] and list(heatmap.x) == [0, 1, 2, 3]
    assert "last 10 s" in fig.layout.title.text and "21 token→expert" in fig.layout.title.text
    assert heatmap.customdata[1][3] == pytest.approx(8 / 11)


def test_the_chat_tab_shows_a_moe_models_expert_load_and_hides_a_dense_ones(tiny):
    """A tiny Qwen3-MoE (2 layers, 4 experts, top-2) served by the app's EngineHolder: every token the
    model computed between two samples (the prompt, then each generated token but the last) is routed to
    2 experts in each MoE layer."""
    prompt, new = 37, 12
    holder = EngineHolder()
    config = EngineConfig(model=tiny_family_model("qwen3moe"), dtype="float32", kv_cache_memory_bytes=8 << 20)
    assert holder.launch(config).state == "ready"
    holder.samples(min_interval_s=0.0)
    params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
    holder.get().llm.generate([list(range(3, 3 + prompt))], params)
    holder.samples(min_interval_s=0.0)
    load = holder.expert_load()
    assert load is not None and len(load.tokens) == 2 and all(len(row) == 4 for row in load.tokens)
    assert [sum(row) for row in load.tokens] == [(prompt + new - 1) * 2] * 2
    *_, update = chat_tab.refresh_live(holder)
    assert update["visible"] and [list(r) for r in update["value"].data[0].z] == load.tokens
    holder.shutdown()
    dense = EngineHolder()
    assert (
        dense.launch(EngineConfig(model=tiny, dtype="float32", kv_cache_memory_bytes=8 << 20)).state
        == "ready"
    )
    dense.samples(min_interval_s=0.0)
    dense.samples(min_interval_s=0.0)
    assert dense.expert_load() is None and chat_tab.refresh_live(dense)[-1] == {
        "__type__": "update",
        "visible": False,
    }
    dense.shutdown()
