"""The app in a real browser: `python app.py` on a free port and a chromium page on it (Playwright,
Debian's chromium, never `playwright install`), and the helpers the browser tests share."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.common_utils import ROOT, free_port, stop_process

SHOTS = ROOT / "docs" / "img"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
LOAD_S = 240_000  # ms: the default model loads in ~20-60 s on 2 busy cores


@contextmanager
def app_server(log_path: Path):
    """`python app.py` on a free port until the block ends; yields its URL."""
    port = free_port()
    log = log_path.open("w")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "app.py", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, f"app.py exited with {proc.returncode}; see {log.name}"
            try:
                if httpx.get(url + "/", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "app.py did not serve / within 90 s"
            time.sleep(0.5)
        yield url
    finally:
        stop_process(proc, timeout=20)
        log.close()


@contextmanager
def browser_page(server: str, width: int = 1440, height: int = 1000):
    """A chromium page (width x height CSS pixels) on the app, once Gradio has rendered it."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `apt-get install chromium` (.ci/run does it)")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": width, "height": height}, accept_downloads=True)
        page = context.new_page()
        page.set_default_timeout(30_000)
        page.goto(server + "/")
        page.wait_for_selector("#plan-badge")  # Gradio renders a few seconds after load
        yield page
        browser.close()


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


def fill_number(page, selector: str, value: str) -> None:
    """Type value into a number box and move on (Tab), as a user does, until the box keeps it.

    Under load a box filled within a second of its tab and accordion first opening was seen back at its
    default seconds later (twice in CI, never with the test's timing probes in place): the page's own
    first renders set it again. A user types later than that; the test types again."""
    box, seen = page.locator(selector), []
    for _ in range(3):
        box.fill(value)
        box.press("Tab")
        page.wait_for_timeout(1000)
        seen.append(box.input_value())
        if seen[-1] == value:
            return
    raise AssertionError(f"{selector} did not keep {value!r}: it read {seen}")


def choose(page, elem_id: str, value: str) -> None:
    """Pick a value in a Gradio dropdown the way a user does: type to filter, click the option."""
    box = page.locator(f"#{elem_id} input")
    box.click()
    box.fill(value)
    page.locator("ul[role=listbox] li", has_text=value).first.click()
    box.blur()  # close the list, as a user moving on does, so no option list stays over the form
    page.locator("ul[role=listbox]").first.wait_for(state="hidden")


def shot(page, name: str, full_page: bool = True) -> None:
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=full_page)


# Every length the last reply shows and every KV figure the live panel shows, recorded by the page
# itself: a test loop polling a busy machine misses the short ones
RECORD_REPLY_AND_KV = """() => {
    window.replyLengths = []; window.kvSeen = [];
    new MutationObserver(() => { const bot = [...document.querySelectorAll('#chatbot .bot')].pop();
        if (bot) window.replyLengths.push(bot.innerText.length); })
    .observe(document.querySelector('#chatbot'), {subtree: true, childList: true, characterData: true});
    new MutationObserver(() => { const now = document.querySelector('#live-now');
        if (now) window.kvSeen.push(parseFloat(now.getAttribute('data-kv') || '0')); })
    .observe(document.querySelector('#live-now-box'), {subtree: true, childList: true, attributes: true});
}"""


def send_and_record(page, prompt: str, timeout_s: float = 600) -> tuple[list[int], list[float]]:
    """Send `prompt` in Chat and wait for its reply stats: (reply lengths seen, KV figures seen)."""
    page.fill("#chat-input textarea", prompt)
    page.evaluate(RECORD_REPLY_AND_KV)
    page.click("#chat-send")
    kv_values, deadline = [], time.monotonic() + timeout_s
    while "TTFT" not in page.locator("#chat-reply-stats").inner_text():
        assert time.monotonic() < deadline, f"the reply did not finish within {timeout_s:.0f} s"
        kv_values.append(float(page.locator("#live-now").get_attribute("data-kv") or 0))
        time.sleep(0.25)
    return page.evaluate("() => window.replyLengths"), kv_values + page.evaluate("() => window.kvSeen")
