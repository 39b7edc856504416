"""benchmarks.served_steps: the StepRecorder's counts on a real tiny engine, and the CLI's table with an
offline and a served variant, each in its own process (the served one driven by `app.py bench`)."""

from __future__ import annotations

import math

import pytest

from backend.engine import LLM
from benchmarks import served_steps
from benchmarks.step_recorder import StepRecorder, step_summary
from tests.engine_utils import assert_engine_clean, prompts, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_recorder_counts_every_prompt_token_and_decode_row():
    llm = LLM(tiny_model("llama")[0], dtype="float32", device="cpu", max_num_batched_tokens=256)
    recorder = StepRecorder()
    recorder.attach(llm.llm_engine)
    batch = prompts(lengths=(5, 16, 17, 33, 70), seed=7)  # no prompt of one token: it would read as a decode
    output_len, concurrency = 6, 2
    seconds = served_steps.offline_pass(llm.llm_engine, batch, output_len, concurrency)
    records = recorder.take()
    assert sum(r.num_prefill_tokens for r in records) == sum(map(len, batch))
    assert sum(r.num_decode_rows for r in records) == len(batch) * (output_len - 1)  # the 1st: from prefill
    assert max(r.num_decode_rows for r in records) == concurrency
    assert records[0].gap_seconds == 0.0 and all(r.gap_seconds >= 0 for r in records)
    summary = step_summary(records, seconds, switches=3 * len(records))
    assert summary["decode_rows"] == concurrency  # the most common decode batch
    assert summary["steps_per_s"] == pytest.approx(len(records) / seconds)
    assert 0 < summary["busy"] <= 1 and summary["switches_per_step"] == 3
    assert not math.isnan(summary["decode_step_ms"]) and not math.isnan(summary["mixed_step_ms"])
    assert recorder.take() == []
    assert_engine_clean(llm)


def table_rows(text: str) -> dict[str, list[str]]:
    """variant -> its cells, from the markdown table main() prints."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and cells[0] in served_steps.VARIANTS:
            rows[cells[0]] = cells[1:]
    return rows


@pytest.mark.slow
def test_cli_prints_a_row_per_variant_from_its_own_process(capsys):
    argv = ["--model", tiny_model("llama")[0], "--num-prompts", "4", "--max-concurrency", "2"]
    argv += ["--input-len", "16", "--output-len", "4", "--variants", "offline", "served"]
    assert served_steps.main(argv) == 0
    rows = table_rows(capsys.readouterr().out)
    assert set(rows) == {"offline", "served"}, rows
    headers = [c[0] for c in served_steps.COLUMNS] + ["load avg"]
    for variant, cells in rows.items():
        assert len(cells) == len(headers), (variant, cells)
        values = dict(zip(headers, cells, strict=True))
        assert float(values["steps/s"]) > 0 and values["busy"].endswith("%")
        assert (values["out tok/s"] == "-") == (variant == "offline")  # the client's figures: served only
    assert float(dict(zip(headers, rows["served"], strict=True))["out tok/s"]) > 0
