"""bench.versus_llamacpp without running anything: llama.cpp's own output parsed, and the table's ratios.

The texts under tests/data/llamacpp_bench/ are RECORDED stdout of the real binaries (llama-cpp-python
0.3.36's llama.cpp, `make llama-cpp`) on the bench's Llama-3.2-1B-shaped Q4_0 file, on the shared 2-core
machine (hence the tiny rates), each with -t 2 and the JSON output (-o json / --output-format jsonl):
  llama_bench_tg8.json          llama-bench -m FILE -p 0 -n 8 -r 1
  batched_bench_pl16_tg4.jsonl  llama-batched-bench -m FILE -c 512 -npp 16 -ntg 4 -npl 16
  batched_bench_pl1_2.jsonl     llama-batched-bench -m FILE -c 64 -npp 4 -ntg 2 -npl 1,2
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.bench.decode_table import ENGINE, PEER, DecodeRow, format_table, ratio
from backend.bench.llamacpp_decode import parse_batched_bench, parse_llama_bench

DATA = Path(__file__).resolve().parents[1] / "data" / "llamacpp_bench"


def recorded(name: str) -> str:
    return (DATA / name).read_text()


def test_llama_bench_json_gives_the_tg_tests_mean_rate():
    text = recorded("llama_bench_tg8.json")
    assert parse_llama_bench(text, n_gen=8) == pytest.approx(0.081432)
    (test,) = json.loads(text)  # the mean is llama-bench's own: n_gen over the mean time
    assert test["avg_ts"] == pytest.approx(8 / (test["avg_ns"] / 1e9), rel=1e-5)


def test_llama_bench_without_the_asked_test_is_refused():
    with pytest.raises(ValueError, match=r"no single tg64 test .*\(0, 8\)"):
        parse_llama_bench(recorded("llama_bench_tg8.json"), n_gen=64)
    with pytest.raises(ValueError, match="not its -o json output"):
        parse_llama_bench("| model | size |\n| --- | --- |", n_gen=8)


def test_batched_bench_gives_the_decode_rate_over_all_sequences():
    text = recorded("batched_bench_pl16_tg4.jsonl")
    assert parse_batched_bench(text, batch_size=16, n_gen=4) == pytest.approx(2.35535)
    row = json.loads(text)
    assert row["speed_tg"] == pytest.approx(16 * 4 / row["t_tg"], rel=1e-5)  # S_TG = pl * tg / t_tg
    with pytest.raises(ValueError, match=r"no row pl=1, tg=4: \[\(16, 4\)\]"):
        parse_batched_bench(text, batch_size=1, n_gen=4)


def test_batched_bench_picks_the_row_of_the_batch_size():
    text = recorded("batched_bench_pl1_2.jsonl")
    rows = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert [(r["pl"], r["tg"]) for r in rows] == [(1, 2), (2, 2)]
    assert parse_batched_bench(text, batch_size=1, n_gen=2) == pytest.approx(rows[0]["speed_tg"])
    assert parse_batched_bench(text, batch_size=2, n_gen=2) == pytest.approx(rows[1]["speed_tg"])
    assert rows[0]["speed_tg"] != rows[1]["speed_tg"]


def test_ratio_is_the_median_of_each_rounds_ratio():
    ours = DecodeRow(ENGINE, 16, [30.0, 10.0, 40.0])
    peer = DecodeRow(PEER, 16, [20.0, 10.0, 10.0])  # rounds: 1.5, 1.0, 4.0 (a busy neighbour in round 2)
    value, rounds = ratio(ours, peer)
    assert rounds == pytest.approx([1.5, 1.0, 4.0])
    assert value == pytest.approx(1.5)
    with pytest.raises(ValueError, match="one batch size, got 16 and 1"):
        ratio(ours, DecodeRow(PEER, 1, [20.0]))
    with pytest.raises(ValueError, match="paired rounds needed, got 3 and 2"):
        ratio(ours, DecodeRow(PEER, 16, [20.0, 10.0]))


def test_table_rows_ratios_and_bars():
    rows = [
        DecodeRow(PEER, 1, [10.0, 12.0, 11.0]),
        DecodeRow(ENGINE, 1, [9.0, 10.0, 12.1]),  # rounds 0.90, 0.83, 1.10: median 0.90, below 1.0x
        DecodeRow(PEER, 16, [40.0, 44.0, 42.0]),
        DecodeRow(ENGINE, 16, [63.0, 70.0, 60.0]),  # rounds 1.575, 1.59, 1.43: median 1.575, meets 1.5x
    ]
    header, rule, *body = format_table(rows)
    assert "engine / llama.cpp" in header and rule.startswith("|---")
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in body]
    assert cells == [
        ["llama.cpp", "1", "11.00", "10.00-12.00", "", "", "", ""],
        ["engine", "1", "10.00", "9.00-12.10", "0.90x", "0.83-1.10", "1.0x", "no"],
        ["llama.cpp", "16", "42.00", "40.00-44.00", "", "", "", ""],
        ["engine", "16", "63.00", "60.00-70.00", "1.57x", "1.43-1.59", "1.5x", "yes"],
    ]
