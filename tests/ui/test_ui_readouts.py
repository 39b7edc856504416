"""What a user clicking through the app reads, found by walking every tab in a browser: figures in units
that mean something at any size, a KV chart that shows a few chats on a large pool, and an export of
every ticked engine and format that makes what can work instead of refusing it all."""

from __future__ import annotations

import html
import re
import zipfile
from pathlib import Path

import pytest

from backend.export import ExportOptions, export_files
from backend.planner import PlanRequest
from tests.ui_utils import EXPORT_FORM, PLAN_FORM
from ui import charts, export_tab, monitor_tab, plan_tab
from ui.common import usd_per_m


def kpi(kpis_html: str, name: str) -> str:
    match = re.search(rf"<span>{re.escape(name)}</span><b>([^<]*)</b>", kpis_html)
    assert match, f"no {name!r} in {kpis_html}"
    return html.unescape(match.group(1))


def test_a_small_models_cost_is_never_shown_as_zero():
    """SmolLM2-135M on an H100 costs a fraction of a cent per million input tokens: two significant
    digits, not "$0.000"."""
    badge, kpis, *_ = plan_tab.estimate_plan({**PLAN_FORM, "model": "HuggingFaceTB/SmolLM2-135M-Instruct"})
    assert "Fits" in badge
    shown = kpi(kpis, "Cost, input")
    assert shown != "$0.000 / 1M tok" and re.fullmatch(r"\$0\.0*[1-9]\d / 1M tok", shown), shown
    assert usd_per_m(0.000412) == "$0.00041 / 1M tok" and usd_per_m(0.0000041) == "$0.0000041 / 1M tok"
    assert usd_per_m(0.012) == "$0.012 / 1M tok" and usd_per_m(3.2) == "$3.200 / 1M tok"
    assert usd_per_m(0) == "$0.000 / 1M tok" and usd_per_m(None) == "–"
    _, big_kpis, *_ = plan_tab.estimate_plan(PLAN_FORM)  # an 8B model: three decimals, as before
    assert re.fullmatch(r"\$0\.\d{3} / 1M tok", kpi(big_kpis, "Cost, output"))


def test_the_monitor_counts_requests_in_whole_numbers():
    """/metrics gauges arrive as floats ("running 0.0"); requests are counted."""
    sample = {"engine": "vllm", "num_requests_running": 3.0, "num_requests_waiting": 0.0}
    text = html.unescape(monitor_tab.summary_html({**sample, "kv_cache_usage": 0.25}))
    assert "running <b>3</b>" in text and "waiting <b>0</b>" in text and "25.0 %" in text
    assert "running <b>–</b>" in html.unescape(monitor_tab.summary_html({"engine": "x"}))


def test_the_gpu_comparison_gives_every_gpu_its_own_labelled_row():
    """The comparison was a scatter with each GPU's name printed next to its marker: a dozen GPUs between
    1,000 and 1,500 tok/s wrote their names over each other. Now every GPU is a row (its name on the axis)
    with its throughput and its cost as bars, each printing its value; the cheapest that fits on top."""
    from backend.planner import compare_gpus

    *_, compare, _, message, _ = plan_tab.estimate_plan({**PLAN_FORM, "num_gpus": 2})
    assert message == ""
    rows = [
        e.to_dict() for e in compare_gpus(PlanRequest(model=PLAN_FORM["model"], gpu="H100-80GB", num_gpus=2))
    ]
    names = [f"2 × {r['gpu']}" for r in rows]
    assert all(t.type == "bar" and t.orientation == "h" and t.textposition == "outside" for t in compare.data)
    for axis in ("x", "x2"):  # each panel has every GPU once
        shown = [y for t in compare.data if t.xaxis == axis for y in t.y]
        assert sorted(shown) == sorted(names), shown
    order = list(compare.layout.yaxis.categoryarray)  # top to bottom (the axis is reversed)
    assert compare.layout.yaxis.autorange == "reversed"
    cost = {f"2 × {r['gpu']}": (not r["fits"], r["cost_per_million_output_tokens"]) for r in rows}
    assert order == sorted(names, key=cost.__getitem__)  # fitting first, each group cheapest first
    assert compare.layout.height >= 120 + 24 * len(names)  # a row per GPU, 12 px names stay apart
    by_value = {(t.xaxis, y): x for t in compare.data for x, y in zip(t.x, t.y, strict=True)}
    for r in rows:
        assert by_value["x", f"2 × {r['gpu']}"] == r["decode_tokens_per_s_total"]
        assert by_value["x2", f"2 × {r['gpu']}"] == r["cost_per_million_output_tokens"]
    assert "tok/s" in compare.layout.xaxis.title.text and "$" in compare.layout.xaxis2.title.text
    colours = {t.name: t.marker.color for t in compare.data}  # the legend says which plans fit
    assert set(colours) == {"fits" if r["fits"] else "does not fit" for r in rows} == {"fits", "does not fit"}
    assert colours["fits"] != colours["does not fit"]


@pytest.mark.parametrize(("usage", "top"), [(0.0, 10), (0.067, 10), (0.2, 30), (0.5, 70), (0.9, 100)])
def test_the_kv_panel_zooms_to_what_is_used(usage, top):
    """A reply on the 728-block default pool uses ~3 % of it: on a fixed 0-100 axis that was a flat line
    at the bottom. The axis now ends a step of 10 above the peak (100 once usage is high)."""
    samples = [{"timestamp": t, "kv_cache_usage": usage * t / 4} for t in range(5)]
    fig = charts.live_figure(samples)
    kv_axis = next(a for a in fig.select_yaxes() if a.title.text == "% of KV blocks")
    assert tuple(kv_axis.range) == (0, top)
    kv_trace = next(t for t in fig.data if t.name == "KV cache usage %")
    assert max(kv_trace.y) == pytest.approx(usage * 100) and max(kv_trace.y) <= top


def test_ticking_every_engine_and_format_exports_what_can_work():
    """Before: one impossible pair (SGLang has no Python export, llama.cpp needs a GGUF) refused the whole
    export with a wall of reasons and no files. Now the rest is made, and the skipped pairs fold away."""
    from backend.export import ENGINES, FORMATS

    plan = plan_tab.estimate_plan(PLAN_FORM)[6]
    form = {**EXPORT_FORM, "plan": plan, "engines": list(ENGINES), "formats": list(FORMATS)}
    files, picker, preview, archive, message = export_tab.export_plan(form)
    assert "msg-ok" in message and picker["value"] == "vllm/launch.sh"  # the first engine ticked
    assert preview["value"].count("vllm serve meta-llama/Llama-3.1-8B-Instruct") == 1
    assert set(zipfile.ZipFile(Path(archive)).namelist()) == set(files)
    assert {"vllm/launch.sh", "sglang/launch.sh", "tgi/docker-compose.yml", "trtllm/launch.sh"} <= set(files)
    assert not any(name.startswith(("llamacpp/", "ollama/")) for name in files)  # 'auto' weights: no GGUF
    text = html.unescape(message)
    assert f"{len(files)} files ready" in text and "<details>" in text
    assert "<b>sglang/python</b>: SGLang has no Python API export" in text
    assert "<b>llamacpp/all</b>: llama.cpp runs GGUF files only" in text
    assert "- sglang / python: SGLang has no Python API export" in files["README.md"]  # the bundle, too
    one = export_tab.export_plan({**form, "engines": ["vllm"], "formats": ["shell"]})[4]
    assert "msg-ok" in one and "<details>" not in one  # nothing skipped, nothing folded


def test_the_cli_keeps_refusing_an_explicit_impossible_pair():
    """`app.py export --engine sglang --format python` asked for exactly that file: still an error."""
    req = PlanRequest(model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100-80GB")
    with pytest.raises(ValueError, match="sglang/python: SGLang has no Python API export"):
        export_files(req, ExportOptions(), engines=["sglang"], formats=["shell", "python"])
    files = export_files(req, ExportOptions(), engines=["sglang"], formats=["shell", "python"], strict=False)
    assert "sglang/launch.sh" in files and "sglang/python.py" not in files


def test_the_embedded_exports_name_the_checkout_in_a_sentence():
    """Every other engine's header names its version ("Launch vLLM 0.33.0 as planned."); the embedded one
    read "Launch Embedded engine this checkout as planned."."""
    files = export_files(
        PlanRequest(model=PLAN_FORM["model"]), engines="embedded", formats=["shell", "skypilot"]
    )
    assert "# Launch Embedded engine (this checkout) as planned." in files["embedded/launch.sh"]
    assert "# Embedded engine (this checkout) with SkyPilot" in files["embedded/skypilot.yaml"]
    assert all("engine this checkout" not in text for text in files.values())
