"""The web app in a real browser (Debian's chromium driven by Playwright), against `python app.py`.

One app process serves the whole module and the tests share one page, like a user going through the tabs:
Plan -> "Launch this plan here" -> Launch -> Chat (+ load) -> Benchmark -> Monitor -> Export. Each test
sets up what it needs (its tab, the plan, the `engine` fixture), so any one of them also passes alone. Each
saves a screenshot of its tab to docs/img/ (the README shows them).
"""

from __future__ import annotations

import io
import itertools
import re
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from backend.default_model import DEFAULT_HUB_ID
from tests.browser_utils import (
    LOAD_S,
    app_server,
    browser_page,
    choose,
    fill_number,
    open_tab,
    send_and_record,
    shot,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with app_server(tmp_path_factory.mktemp("app") / "app.log") as url:
        yield url


@pytest.fixture(scope="module")
def page(server):
    with browser_page(server) as page:
        yield page


@pytest.fixture(scope="module")
def engine(server, page):
    """The default model serving in the app: Launch tab -> Launch, unless an earlier test (Plan -> Launch
    this plan here) already started it."""
    if httpx.get(server + "/v1/models").status_code != 200:
        open_tab(page, "Launch")
        page.click("#launch-button")
        page.wait_for_selector("#engine-state[data-state=ready]", timeout=LOAD_S)
    return server


def plan_llama_8b_on_h100(page) -> None:
    """The Plan tab set to Llama-3.1-8B on one H100 (what Launch this plan here and Export start from)."""
    open_tab(page, "Plan")
    choose(page, "plan-model", "meta-llama/Llama-3.1-8B-Instruct")
    choose(page, "plan-gpu", "H100-80GB")
    page.wait_for_selector("#plan-badge:has-text('Fits')")


def box(page, selector: str) -> dict[str, float]:
    """Where the element is on the page (top, bottom, left, right, in CSS pixels)."""
    return page.locator(selector).first.evaluate(
        "e => { const r = e.getBoundingClientRect(); "
        "return {top: r.top, bottom: r.bottom, left: r.left, right: r.right}; }"
    )


def cut_off_labels(page, container: str) -> list[str]:
    """The labels under container whose text does not fit the box around it (what a user sees cut)."""
    return page.evaluate(
        """(container) => [...document.querySelectorAll(
            `${container} [data-testid=block-info], ${container} .checkbox-container`)]
          .filter(e => e.offsetParent !== null)
          .filter(e => e.scrollWidth > e.clientWidth + 1 ||
                       e.getBoundingClientRect().right > e.closest("div.block").getBoundingClientRect().right)
          .map(e => e.innerText)""",
        container,
    )


def wrapped_names(page, container: str) -> list[str]:
    """The field names under container that break over more than one line ("enable_prefix_cachi / ng")."""
    return page.evaluate(
        """(container) => [...document.querySelectorAll(`${container} label span`)]
          .filter(e => e.offsetParent !== null)
          .filter(e => { const range = document.createRange(); range.selectNodeContents(e);
                         return new Set([...range.getClientRects()].map(r => Math.round(r.top))).size > 1; })
          .map(e => e.innerText)""",
        container,
    )


def test_page_and_api_share_one_server(server, page):
    assert "gradio" in httpx.get(server + "/").text.lower()
    response = httpx.get(server + "/v1/models")
    assert response.status_code == 503  # no engine launched yet: the API says so instead of hanging
    assert "error" in response.json()
    header = page.locator("#app-header").inner_text()  # the OpenAI API is named in the header ...
    assert f"{server}/v1" in header and "/v1/chat/completions" in header
    assert page.get_by_text("Use via API").count() == 0  # ... and Gradio's own API link is not shown
    assert "/v1/chat/completions" in httpx.get(server + "/openapi.json").text


def test_plan_llama_8b_on_h100(page):
    from backend.planner import PlanRequest, estimate

    open_tab(page, "Plan")
    choose(page, "plan-model", "Qwen/Qwen2.5-72B-Instruct")
    page.wait_for_selector("#plan-badge:has-text('Does not fit')")  # 72B in bf16 on one H100
    plan_llama_8b_on_h100(page)
    expected = estimate(PlanRequest(model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100-80GB")).to_dict()
    page.wait_for_selector(f"#plan-kpis:has-text('{expected['kv_cache_tokens']:,} tokens')")
    kpis = page.locator("#plan-kpis").inner_text()
    assert f"{expected['kv_cache_bytes'] / 1024**3:,.2f} GiB" in kpis
    assert f"{expected['max_concurrency']:,} requests" in kpis
    page.wait_for_selector("#plan-memory .js-plotly-plot")
    assert page.locator("ul[role=listbox]:visible").count() == 0  # no dropdown list left over the form
    title, legend = box(page, "#plan-memory .g-xtitle"), box(page, "#plan-memory .legend")
    assert title["bottom"] <= legend["top"], (title, legend)  # the legend's long names under the axis title
    page.wait_for_selector("#plan-compare .js-plotly-plot")  # every GPU's name readable, none over another
    names = page.evaluate(
        """() => [...document.querySelectorAll('#plan-compare .ytick text')]
             .map(t => { const r = t.getBoundingClientRect(); return [r.top, r.bottom, t.textContent]; })"""
    )
    names.sort()
    assert {"T4", "H100-80GB", "B200"} <= {name for *_, name in names}  # GPUs name the rows
    assert len(names) >= 10 and all(a[1] <= b[0] for a, b in itertools.pairwise(names)), names
    gpus = page.locator("#plan-num-gpus input")  # out of range: the handler's message names the field
    gpus.fill("0")
    gpus.press("Enter")
    page.wait_for_selector("#plan-message:has-text('number of GPUs must be a whole number >= 1, got 0')")
    assert page.locator(".toast-body").count() == 0  # not Gradio's "Value 0 is less than minimum value 1."
    gpus.fill("1")
    gpus.press("Enter")
    page.wait_for_selector("#plan-message:not(:has-text('number of GPUs'))")
    shot(page, "plan")


def test_launch_this_plan_here_explains_and_offers_the_default_model(page, server):
    """The 8B plan cannot run here (no GPU, no Hub): the verdict says so, and the suggestion launches."""
    plan_llama_8b_on_h100(page)
    page.click("#plan-launch-here")
    page.wait_for_selector("#launch-verdict[data-can='0']")
    verdict = page.locator("#launch-verdict").inner_text()
    assert "no Hub access" in verdict and "no GPU here" in verdict and "Export tab" in verdict
    shot(page, "plan-launch-here")
    suggestion = page.locator("#plan-alternative").inner_text()
    assert suggestion == "Launch SmolLM2-135M-Instruct · GGUF Q4_1 instead"  # the model and its format
    page.click("#plan-alternative")  # the Launch tab opens and loads it
    page.wait_for_selector("#launch-button:visible")
    page.wait_for_selector("#engine-state[data-state=ready]", timeout=LOAD_S)
    card = page.locator("#launch-status").inner_text()
    assert "SmolLM2-135M-Instruct · GGUF Q4_1" in card and "site-packages" not in card
    # the form names the model by its Hub id (it runs from the bundled GGUF file), never by a path
    assert page.locator("#launch-form textarea").first.input_value() == DEFAULT_HUB_ID
    assert "site-packages" not in page.locator("#launch-form").inner_text()
    switch = page.locator("#launch-form input[type=checkbox]").first  # the knobs, folded at first
    if not switch.is_visible():
        page.get_by_text("Engine options").click()
    switch.wait_for(state="visible")
    assert cut_off_labels(page, "#launch-form") == []  # vLLM's knob names are readable in full
    assert wrapped_names(page, "#launch-form") == []  # ... each on one line
    assert "read weights" in page.locator("#load-phases").inner_text()  # where the load time went
    other = page.context.new_page()  # a second browser tab sees the same, shared engine
    other.goto(server + "/")
    other.get_by_role("tab", name="Launch").click()
    other.wait_for_selector("#engine-state[data-state=ready]")
    other.close()
    models = httpx.get(server + "/v1/models").json()  # the API now serves the engine the UI launched
    assert [m["id"] for m in models["data"]] == ["SmolLM2-135M-Instruct"]
    shot(page, "launch")


def test_chat_streams_while_kv_chart_rises(page, engine):
    open_tab(page, "Chat")
    page.get_by_text("Sampling").click()
    # a reply that runs for seconds, so the 1 s KV samples see it: a 128-token one took under a second on
    # a quiet Xeon, and a 64-token one from vLLM once finished between two samples
    fill_number(page, "#chat-max-tokens input", "1024")
    lengths, kv_values = send_and_record(page, "Write a long story about a dragon who learns to cook.")
    growing = sorted({n for n in lengths if n > 0})
    assert len(growing) >= 3, f"the reply did not stream (lengths seen: {growing})"
    assert max(kv_values) > 0, "the KV-usage figure never rose above zero while the reply ran"
    kv_trace = page.evaluate(
        "() => document.querySelector('#live-chart .js-plotly-plot').data"
        ".find(t => t.name.startsWith('KV')).y.filter(v => v !== null)"
    )
    assert max(kv_trace) > 0  # the chart itself, not only the numbers line
    kv_top = page.evaluate(
        "() => document.querySelector('#live-chart .js-plotly-plot').layout.yaxis2.range[1]"
    )
    assert max(kv_trace) <= kv_top <= max(10, 1.25 * max(kv_trace) + 10)  # zoomed to what is used
    stats = page.locator("#chat-reply-stats").inner_text()
    figures = re.search(r"([\d.]+) tok/s · (\d+) tokens · finish: (\w+)", stats)
    assert figures is not None, stats
    tokens, finish = int(figures[2]), figures[3]
    assert (finish, tokens) == ("length", 1024) or (finish == "stop" and tokens < 1024), stats
    # no floating label over the conversation (it covered the first lines of a scrolled reply)
    assert page.locator("#chatbot [data-testid=block-label]").count() == 0


def test_load_of_16_requests_batches(page, engine):
    open_tab(page, "Chat")
    page.fill("#load-n input", "16")
    page.fill("#load-tokens input", "48")
    page.click("#load-fire")
    running, deadline = 0, time.monotonic() + 90
    while running <= 1:
        assert time.monotonic() < deadline, "running requests never exceeded 1 under a load of 16"
        running = int(page.locator("#live-now").get_attribute("data-running") or 0)
        time.sleep(0.25)
    page.wait_for_selector("#kv-block-map .js-plotly-plot")
    shot(page, "chat")
    page.wait_for_selector("#load-message .msg-ok:has-text('16 requests')", timeout=180_000)  # all finished


def test_short_benchmark_table(page, engine):
    open_tab(page, "Benchmark")
    for elem_id, value in (("bench-requests", "8"), ("bench-input", "32"), ("bench-output", "16")):
        page.fill(f"#{elem_id} input", value)
    page.click("#bench-run")
    page.wait_for_selector("#bench-message:has-text('8 requests completed')", timeout=180_000)
    table = page.locator("#bench-table").inner_text()
    for metric in ("TTFT", "TPOT", "ITL", "E2E latency"):
        assert metric in table
    page.wait_for_selector("#bench-figure .js-plotly-plot")
    shot(page, "benchmark")


def test_monitor_reads_our_metrics(page, engine):
    open_tab(page, "Monitor")
    page.click("#monitor-start")
    page.wait_for_selector("#monitor-message:has-text('embedded')")
    page.wait_for_selector("#monitor-chart .js-plotly-plot")
    shot(page, "monitor")


def test_export_zip_has_vllm_command_and_compose(page):
    plan_llama_8b_on_h100(page)
    open_tab(page, "Export")
    page.click("#export-generate")
    page.wait_for_selector("#export-message:has-text('files ready')")
    page.wait_for_selector("#export-preview:has-text('vllm serve')")
    with page.expect_download() as download:
        page.click("#export-download")
    data = Path(download.value.path()).read_bytes()
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    texts = {n: zipfile.ZipFile(io.BytesIO(data)).read(n).decode() for n in names}
    assert "vllm serve meta-llama/Llama-3.1-8B-Instruct" in texts["vllm/launch.sh"]
    assert "services:" in texts["vllm/docker-compose.yml"]
    shot(page, "export")
