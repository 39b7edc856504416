"""The monitoring adapter on /metrics texts of vLLM, SGLang, TGI and llama.cpp.

These texts are RECORDED, not live: tests/data/metrics_<engine>_t0.txt and _t1.txt were written by
hand from each engine's documented metric names and exposition format (vLLM's metrics docs, SGLang's
"Production Metrics" page, TGI's metric list, llama.cpp's server README), as two scrapes 10 s apart
with chosen values, so that every normalised figure below is known exactly. No real vLLM/SGLang/TGI/
llama.cpp server runs here (none can: no GPU, no such servers on this machine)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from backend.monitor.samples import (
    SAMPLE_KEYS,
    MetricsPoller,
    detect_engine,
    histogram_quantile,
    parse_metrics,
    sample_from_text,
)

DATA = Path(__file__).resolve().parents[1] / "data"


def recorded(engine: str, t: int) -> str:
    return (DATA / f"metrics_{engine}_t{t}.txt").read_text()


def pair(engine: str) -> dict:
    first = sample_from_text(recorded(engine, 0), None, timestamp=100.0)
    return sample_from_text(recorded(engine, 1), first, timestamp=110.0)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tgi", "llamacpp"])
def test_engine_is_recognised_from_metric_names(engine):
    assert detect_engine(parse_metrics(recorded(engine, 0))) == engine
    sample = sample_from_text(recorded(engine, 0))
    assert sample["engine"] == engine and set(SAMPLE_KEYS) <= set(sample)
    assert sample["prompt_tokens_per_s"] is None  # a rate needs two scrapes


def test_vllm_recorded():
    s = pair("vllm")
    assert (s["num_requests_running"], s["num_requests_waiting"], s["kv_cache_usage"]) == (14, 0, 0.47)
    assert (s["num_kv_blocks_total"], s["num_kv_blocks_used"]) == (27000, round(0.47 * 27000))
    assert s["prompt_tokens_per_s"] == 2000.0 and s["generation_tokens_per_s"] == 300.0
    # 100 new TTFTs: 50 in (0.08, 0.1], 40 in (0.1, 0.25], 10 in (0.25, 0.5]
    assert s["ttft_p50_s"] == pytest.approx(0.1) and s["ttft_p99_s"] == pytest.approx(0.475)
    # 2000 new gaps: 1000 in (0.025, 0.05], 1000 in (0.05, 0.075]
    assert s["itl_p50_s"] == pytest.approx(0.05) and s["itl_p99_s"] == pytest.approx(0.0745)
    assert s["num_preemptions_total"] == 5
    assert s["prefix_cache_hit_rate"] == pytest.approx(10000 / 20000)  # over the window, not since start


def test_sglang_recorded():
    s = pair("sglang")
    assert (s["num_requests_running"], s["num_requests_waiting"], s["kv_cache_usage"]) == (9, 2, 0.31)
    assert s["prompt_tokens_per_s"] == 2000.0 and s["generation_tokens_per_s"] == 300.0
    assert s["ttft_p50_s"] == pytest.approx(0.1) and s["itl_p99_s"] == pytest.approx(0.0745)
    assert s["prefix_cache_hit_rate"] == pytest.approx(0.0125)  # SGLang's own gauge
    assert s["num_kv_blocks_total"] is None


def test_tgi_recorded_has_no_kv_gauge():
    s = pair("tgi")
    assert (s["num_requests_running"], s["num_requests_waiting"]) == (10, 2)
    assert s["kv_cache_usage"] is None and s["ttft_p50_s"] is None
    assert s["prompt_tokens_per_s"] == 200.0 and s["generation_tokens_per_s"] == 100.0  # histogram sums
    assert s["itl_p50_s"] == pytest.approx(0.05)  # tgi_request_mean_time_per_token_duration


def test_llamacpp_recorded():
    s = pair("llamacpp")
    assert (s["num_requests_running"], s["num_requests_waiting"], s["kv_cache_usage"]) == (3, 1, 0.15)
    assert s["prompt_tokens_per_s"] == 100.0 and s["generation_tokens_per_s"] == 50.0
    assert s["ttft_p50_s"] is None and s["itl_p50_s"] is None


def test_a_counter_reset_gives_no_negative_rate():
    later = sample_from_text(recorded("vllm", 1), None, timestamp=100.0)
    restarted = sample_from_text(recorded("vllm", 0), later, timestamp=110.0)
    assert restarted["prompt_tokens_per_s"] is None
    assert restarted["ttft_p50_s"] is not None  # falls back to the histogram since (re)start


def test_histogram_quantile_like_prometheus():
    buckets = {0.1: 50.0, 0.5: 100.0, float("inf"): 100.0}
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.75, buckets) == pytest.approx(0.3)
    assert histogram_quantile(0.5, {0.1: 0.0, float("inf"): 0.0}) is None
    assert histogram_quantile(0.99, {1.0: 1.0, float("inf"): 10.0}) == 1.0  # rank in +Inf: the last bound


def test_poller_follows_a_served_sequence_and_reports_errors():
    texts = [recorded("sglang", 0), recorded("sglang", 1)]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = texts.pop(0).encode() if self.path == "/metrics" and texts else b"gone"
            self.send_response(200 if body != b"gone" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        poller = MetricsPoller(f"http://127.0.0.1:{server.server_port}/v1")
        assert poller.url == f"http://127.0.0.1:{server.server_port}/metrics"
        first, second = poller.poll(), poller.poll()
        assert first["engine"] == second["engine"] == "sglang"
        assert second["generation_tokens_per_s"] > 0
        failed = poller.poll()
        assert failed["engine"] == "unknown" and "404" in failed["error"]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    gone = MetricsPoller(f"http://127.0.0.1:{server.server_port}").poll()
    assert gone["error"] and gone["num_requests_running"] is None
