"""shellcheck (Debian's `shellcheck`) finds nothing in any generated shell file: every launch.sh,
docker.sh and client.sh of every engine, and the SkyPilot run scripts, for a matrix of plans."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from backend.export import ExportOptions, export_files
from backend.planner.request import PlanRequest
from tests.export_utils import write_files

PLANS = [
    (
        PlanRequest(model="meta-llama/Llama-3.1-8B-Instruct", max_model_len=8192),
        ExportOptions(api_key_env="MY_KEY"),
    ),
    (
        PlanRequest(model="/models/llama-1b-Q4_K_M.gguf", quant="Q4_K_M", max_model_len=4096),
        ExportOptions(served_model_name="llama 1b", hf_token_env="MY_HF"),
    ),
    (
        PlanRequest(model="meta-llama/Llama-3.1-405B-Instruct", num_gpus=16, tp=8, pp=2, max_model_len=16384),
        ExportOptions(speculative_method="ngram"),
    ),
]


def test_every_generated_shell_file_passes_shellcheck(tmp_path):
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed: apt-get install shellcheck (.ci/run does it)")
    scripts = []
    for i, (req, options) in enumerate(PLANS):
        files = export_files(req, options, engines="all", formats="all", strict=False)
        out = write_files(files, tmp_path / str(i))
        scripts += [out / path for path in files if path.endswith(".sh")]
        for path in (p for p in files if p.endswith("skypilot.yaml")):
            task = yaml.safe_load(files[path])
            for part in ("setup", "run"):
                if task.get(part):
                    script = out / f"{path}.{part}.sh"
                    script.write_text("#!/usr/bin/env bash\n" + task[part])
                    scripts.append(script)
    assert len(scripts) >= 40
    proc = subprocess.run(
        ["shellcheck", "--severity=style", *map(str, scripts)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout[-6000:]
