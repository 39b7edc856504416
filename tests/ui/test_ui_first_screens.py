"""The first screens a newcomer sees, in a real browser at 1280x900 (a laptop): what to press is in view
without scrolling. Launch shows the model, a one-line summary of what will run and the Launch button above
the fold; Plan on a narrow screen (a phone) shows its result before the form; Chat, once an engine runs,
shows the chat box. Each test saves what the user sees (the viewport, not the whole page) to docs/img/."""

from __future__ import annotations

import pytest

from tests.browser_utils import LOAD_S, app_server, browser_page, open_tab, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WIDTH, HEIGHT = 1280, 900
NARROW = 420  # CSS pixels: a phone held upright (Gradio stacks a row's columns below 640)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    with (
        app_server(tmp_path_factory.mktemp("app") / "app.log") as url,
        browser_page(url, WIDTH, HEIGHT) as page,
    ):
        yield page


def box(page, selector: str) -> dict[str, float]:
    """Where the element is in the viewport (top, bottom, in CSS pixels)."""
    return page.locator(selector).first.evaluate(
        "e => { const r = e.getBoundingClientRect(); return {top: r.top, bottom: r.bottom}; }"
    )


def test_launch_opens_on_the_model_a_summary_and_the_button(page):
    open_tab(page, "Launch")
    page.wait_for_selector("#launch-summary:has-text('threads')", timeout=120_000)  # imports torch first
    page.evaluate("() => window.scrollTo(0, 0)")
    shot(page, "first-launch", full_page=False)
    summary = page.locator("#launch-summary").inner_text()
    assert "GGUF Q4_1" in summary and "GiB" in summary, summary  # format and memory of the default model
    assert box(page, "#launch-button")["bottom"] <= HEIGHT  # no scrolling to find it
    assert box(page, "#launch-summary")["bottom"] <= box(page, "#launch-button")["top"]
    assert not page.locator("#launch-form input[type=checkbox]").first.is_visible()  # knobs folded away
    page.get_by_text("Engine options").click()  # ... one click opens them, still vLLM's names
    page.wait_for_selector("#launch-form :text('max_num_seqs')")


def test_plan_shows_its_result_first_on_a_narrow_screen(page):
    open_tab(page, "Plan")
    page.wait_for_selector("#plan-badge:has-text('Fits')")
    page.evaluate("() => window.scrollTo(0, 0)")
    shot(page, "first-plan", full_page=False)
    page.set_viewport_size({"width": NARROW, "height": HEIGHT})
    try:
        page.evaluate("() => window.scrollTo(0, 0)")
        page.wait_for_timeout(500)  # the layout settles
        shot(page, "first-plan-narrow", full_page=False)
        badge, form = box(page, "#plan-badge"), box(page, "#plan-form")
        assert badge["bottom"] <= form["top"], (badge, form)
        assert box(page, "#plan-kpis")["top"] < HEIGHT
    finally:
        page.set_viewport_size({"width": WIDTH, "height": HEIGHT})


def test_chat_box_in_view_once_an_engine_runs(page):
    open_tab(page, "Launch")
    page.click("#launch-button")
    page.wait_for_selector("#engine-state[data-state=ready]", timeout=LOAD_S)
    open_tab(page, "Chat")
    page.wait_for_selector("#live-now[data-kv]")
    page.evaluate("() => window.scrollTo(0, 0)")
    shot(page, "first-chat", full_page=False)
    assert box(page, "#chat-input")["bottom"] <= HEIGHT
    assert box(page, "#chat-send")["bottom"] <= HEIGHT
