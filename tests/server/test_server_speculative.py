"""The server with speculative decoding on: vLLM's spec_decode counters on /metrics (real Prometheus text,
parsed by prometheus_client) move by exactly what the engine verified, while the `openai` client gets
the same greedy text as from a server without speculation."""

from __future__ import annotations

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backend.monitor.samples import sample_from_stats, sample_from_text
from backend.server import build_app
from tests.engine_utils import tiny_model
from tests.server_utils import RunningServer, scrape, start_engine
from ui import charts, chat_tab, launch_tab

PROMPTS = ("The paged KV cache", "Speculative decoding verifies", "A draft model proposes")


def spec_samples(text: str) -> dict[tuple[str, str | None], float]:
    """(metric sample name, position label) -> value, for the vllm:spec_decode_* samples."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("vllm:spec_decode_"):
                assert s.labels["model_name"] == "tiny"
                out[(s.name, s.labels.get("position"))] = s.value
    return out


def complete(url: str) -> list[str]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    return [
        client.completions.create(model="tiny", prompt=p, max_tokens=20, temperature=0).choices[0].text
        for p in PROMPTS
    ]


@pytest.fixture(scope="module")
def texts_without_speculation() -> list[str]:
    engine = start_engine(tiny_model("llama")[0], dtype="float32", num_kv_blocks=128)
    server = RunningServer(build_app(lambda: engine, served_model_name="tiny"))
    try:
        return complete(server.url)
    finally:
        server.stop()
        engine.shutdown()


def test_spec_decode_counters_on_metrics(texts_without_speculation):
    path = tiny_model("llama")[0]
    spec = {"method": "draft_model", "model": path, "num_speculative_tokens": 3}
    engine = start_engine(path, dtype="float32", num_kv_blocks=128, speculative_config=spec)
    server = RunningServer(build_app(lambda: engine, served_model_name="tiny"))
    try:
        before_text = scrape(server.url)
        assert complete(server.url) == texts_without_speculation
        after_text = scrape(server.url)
        stats = engine.stats()
        live = sample_from_stats(stats, engine.stats())  # no drafts between two snapshots
    finally:
        server.stop()
        engine.shutdown()
    before, after = spec_samples(before_text), spec_samples(after_text)
    assert before[("vllm:spec_decode_num_drafts_total", None)] == 0
    drafts = after[("vllm:spec_decode_num_drafts_total", None)]
    draft_tokens = after[("vllm:spec_decode_num_draft_tokens_total", None)]
    accepted = after[("vllm:spec_decode_num_accepted_tokens_total", None)]
    per_pos = [after[("vllm:spec_decode_num_accepted_tokens_per_pos_total", str(p))] for p in range(3)]
    assert drafts == stats.spec_decode_num_drafts_total > 0
    assert draft_tokens == stats.spec_decode_num_draft_tokens_total
    assert accepted == stats.spec_decode_num_accepted_tokens_total == draft_tokens  # it drafts for itself
    assert sum(per_pos) == accepted and per_pos[0] >= per_pos[1] >= per_pos[2] > 0
    assert stats.spec_decode_acceptance_rate == 1.0
    # the Monitor/Chat live sample: acceptance over the window between two scrapes
    sample = sample_from_text(after_text, previous=sample_from_text(before_text))
    assert sample["spec_decode_acceptance_rate"] == 1.0
    assert sample["spec_decode_mean_acceptance_length"] == 1 + accepted / drafts
    assert live["spec_decode_acceptance_rate"] is None
    # what the UI shows: the Launch tab's status line and the Chat tab's live numbers and chart
    assert "draft_model, k=3: 100% of drafts accepted" in launch_tab.speculation_summary(stats)
    assert "drafts accepted <b>100" in chat_tab.speculation_html(sample)
    assert chat_tab.speculation_html(live) == ""
    figure = charts.live_figure([sample])
    assert {"draft acceptance %", "tokens per verification"} <= {trace.name for trace in figure.data}


def test_no_spec_decode_metrics_without_speculation():
    engine = start_engine(tiny_model("llama")[0], dtype="float32", num_kv_blocks=32)
    server = RunningServer(build_app(lambda: engine, served_model_name="tiny"))
    try:
        assert spec_samples(scrape(server.url)) == {}  # vLLM shows them only with a speculative_config
    finally:
        server.stop()
        engine.shutdown()
