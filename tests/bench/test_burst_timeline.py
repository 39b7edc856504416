"""benchmarks.burst_timeline: the first burst of a real served run (the server in-process, `app.py bench`
from another process), each request's timestamps in order and the steps' prefill tokens adding up."""

from __future__ import annotations

import pytest

from benchmarks import burst_timeline
from benchmarks.burst_probe import has_text
from tests.engine_utils import tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def table(text: str, header: str) -> list[list[str]]:
    """The rows of the markdown table whose header line starts with `header`, as cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("| "):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def number(cell: str) -> float:
    return float(cell.replace(",", ""))


def test_has_text_reads_completion_and_chat_chunks():
    assert has_text(b'data: {"id": "a", "choices": [{"index": 0, "text": "Hi"}]}\n\n')
    assert has_text(b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n')
    assert not has_text(b'data: {"choices": [{"delta": {"role": "assistant"}}]}\n\n')  # a role chunk
    assert not has_text(b'data: {"choices": [{"text": ""}], "usage": null}\n\n')
    assert not has_text(b"data: [DONE]\n\n") and not has_text(b"")


@pytest.mark.slow
def test_cli_times_each_request_of_the_burst_in_order(capsys):
    burst, prompt_len = 4, 64
    argv = ["--model", tiny_model("llama")[0], "--num-prompts", "6", "--max-concurrency", str(burst)]
    argv += ["--input-len", str(prompt_len), "--output-len", "8", "--max-num-batched-tokens", "128"]
    assert burst_timeline.main(argv) == 0
    out = capsys.readouterr().out
    requests = table(out, "| # | arrived")
    assert len(requests) == burst, out
    for cells in requests:  # arrived, admitted, handed, scheduled, first token, first chunk: never earlier
        times = [number(c) for c in cells[1:7]]
        assert times == sorted(times), cells
        assert number(cells[7]) == pytest.approx(times[5] - times[0], abs=2)  # TTFT: chunk - arrival
    # every prompt token of the burst was computed by the step that gave its last first token; a prompt the
    # budget splits 63 + 1 (it depends on arrival timing) has its last token counted as a decode row, as the
    # runner computes a one-token chunk (the decode kernel over its cached prompt)
    steps = table(out, "| step |")
    total = sum(int(cells[3]) for cells in steps)
    assert number(requests[-1][8]) == total  # rows in first-token order: the last one saw every step
    assert burst * (prompt_len - 1) <= total <= burst * prompt_len
    assert all(int(cells[3]) + int(cells[2]) <= 128 for cells in steps)  # the step token budget
    assert "prefill floor" in out and "client: TTFT p99" in out
