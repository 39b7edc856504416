"""Helpers for the lm-evaluation-harness tests (no tests here): run `lm-eval` as a user would, offline, on
the small local tasks in tests/data/lm_eval, and read its per-sample log back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.common_utils import ROOT

TASKS_DIR = "tests/data/lm_eval"  # the task YAMLs name their jsonl files relative to the repository root
HARNESS_TIMEOUT_S = 900


@dataclass(slots=True)
class HarnessRun:
    samples: dict[int, dict]  # the task's --log_samples records by doc_id
    metrics: dict[str, float]  # the task's aggregated metrics ("acc,none": ...)


def run_harness(out_dir: Path, task: str, model: str, model_args: str, *extra: str) -> HarnessRun:
    """`python -m lm_eval run` on one local task with --log_samples; fails with the harness's own output."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(out_dir / "datasets"),
        "TOKENIZERS_PARALLELISM": "false",
    }
    command = [
        sys.executable, "-m", "lm_eval", "run", "--model", model, "--model_args", model_args,
        "--include_path", TASKS_DIR, "--tasks", task, "--batch_size", "1",
        "--log_samples", "--output_path", str(out_dir / "results"), *extra,
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=HARNESS_TIMEOUT_S
    )
    assert done.returncode == 0, f"lm-eval {model} failed:\n{(done.stdout + done.stderr)[-4000:]}"
    (samples_file,) = (out_dir / "results").rglob(f"samples_{task}_*.jsonl")
    (results_file,) = (out_dir / "results").rglob("results_*.json")
    records = [json.loads(line) for line in samples_file.read_text().splitlines()]
    metrics = json.loads(results_file.read_text())["results"][task]
    numbers = {k: v for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    return HarnessRun({r["doc_id"]: r for r in records}, numbers)


def loglikelihoods(record: dict) -> list[tuple[float, bool]]:
    """(loglikelihood, is_greedy) of each choice of a multiple-choice record, as the harness logged it."""
    return [(float(ll), greedy == "True") for ((ll, greedy),) in record["resps"]]
