"""Real vLLM from the page (Debian's chromium via Playwright, against `python app.py`): start it under
Launch → External engines, chat with it while the live chart reads its /metrics, compare it with the
embedded engine on a small workload, stop it. Saves docs/img/compare.png (the README shows it)."""

from __future__ import annotations

import re
import time

import psutil
import pytest

from tests.browser_utils import LOAD_S, app_server, browser_page, fill_number, open_tab, send_and_record, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(3000)]
VLLM_START_MS = 1_200_000  # eager vLLM starts in 1-3 min; the machine is shared


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    with app_server(tmp_path_factory.mktemp("app") / "app.log") as url, browser_page(url) as page:
        page.set_default_timeout(90_000)  # vLLM, the embedded engine, chromium and a neighbour on 2 cores
        yield page


def test_start_vllm_from_the_launch_tab(page):
    open_tab(page, "Launch")
    page.click("#launch-button")  # the embedded engine too, for the comparison
    page.wait_for_selector("#engine-state[data-state=ready]", timeout=LOAD_S)
    page.get_by_text("External engines (vLLM, SGLang, llama.cpp)").click()
    assert "make vllm" not in page.locator("#external-engines").inner_text()  # vLLM is installed
    page.click("#external-start")
    # the first start writes the default model's dense copy (a minute or two on busy cores)
    page.wait_for_selector("#external-message .msg-ok:has-text('started vllm')", timeout=600_000)
    page.wait_for_selector("#external-state[data-state=starting] progress")
    page.wait_for_selector("#external-state[data-state=ready]", timeout=VLLM_START_MS)
    assert "KV cache" in page.locator("#external-state").inner_text()
    assert "vllm" in page.locator("#external-log textarea").input_value().lower()


def test_chat_with_vllm_moves_the_kv_chart(page):
    open_tab(page, "Chat")
    page.get_by_text("Sampling").click()
    fill_number(page, "#chat-max-tokens input", "512")  # seconds of decoding: the 1 s KV samples see it
    _, kv_values = send_and_record(page, "Write a long story about a dragon who learns to cook.")
    assert page.locator("#chat-reply-stats").inner_text().startswith("vllm")
    assert max(kv_values) > 0, "vLLM's KV usage never rose above zero while the reply ran"
    title = page.evaluate("() => document.querySelector('#live-chart .js-plotly-plot').layout.title.text")
    assert "vllm" in title


def test_compare_embedded_and_vllm(page):
    open_tab(page, "Compare")
    page.fill("#compare-requests input", "4")
    page.click("#compare-run")
    page.wait_for_selector("#compare-message .msg-ok", timeout=900_000)
    for target in ("embedded", "vllm"):
        row = page.locator(f"#compare-table tr[data-target={target}]").inner_text()
        assert "4/0" in row and "tok/s" not in row  # 4 done, 0 failed; numbers only
    assert page.locator("#compare-kv .js-plotly-plot").count() == 1
    # every column in view: beside the form the table was cut off after its seventh column
    box = "document.querySelector('#compare-table').parentElement"
    assert page.evaluate(f"() => {box}.scrollWidth <= {box}.clientWidth + 1")
    shot(page, "compare")


def test_stop_vllm_leaves_no_process(page):
    open_tab(page, "Launch")
    pid = int(re.search(r"pid (\d+)", page.locator("#external-state").inner_text()).group(1))
    children = [p.pid for p in psutil.Process(pid).children(recursive=True)]
    page.click("#external-stop")
    page.wait_for_selector("#external-message .msg-ok:has-text('stopped vllm')")
    time.sleep(1)
    left = [p for p in [pid, *children] if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert left == []
