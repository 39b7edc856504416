"""Shared helpers for the export tests: write an export to disk, run its shell files with stub engines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# Every program a generated shell file may start. The stubs log their argv and exit 0, so the scripts run
# to the end without any engine installed (vLLM, SGLang, ... cannot exist on this CPU-only machine).
STUB_PROGRAMS = (
    "vllm", "python", "trtllm-serve", "text-generation-launcher", "llama-server", "ollama", "docker", "curl",
    "ray", "pip", "sky",
)  # fmt: skip
# The variables engines read their API key from: the stubs log them beside each call (STUB_LOG.env).
KEY_VARIABLES = ("VLLM_API_KEY", "API_KEY", "LLAMA_API_KEY")
STUB = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["STUB_LOG"], "a") as log:
    log.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\\n")
with open(os.environ["STUB_LOG"] + ".env", "a") as log:
    log.write(json.dumps({{k: os.environ[k] for k in {KEY_VARIABLES!r} if k in os.environ}}) + "\\n")
"""


def write_files(files: dict[str, str], out: Path) -> Path:
    for path, text in files.items():
        target = out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return out


def make_stubs(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in STUB_PROGRAMS:
        stub = folder / name
        stub.write_text(STUB)
        stub.chmod(0o755)
    return folder


def run_with_stubs(
    script: Path, stubs: Path, log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
):
    """Run a generated bash file with the stubs first on PATH; returns (completed process, logged argvs)."""
    log.unlink(missing_ok=True)
    log.touch()
    Path(f"{log}.env").unlink(missing_ok=True)
    full_env = {"PATH": f"{stubs}:/usr/bin:/bin", "STUB_LOG": str(log), "HOME": str(script.parent)}
    full_env |= env or {}
    proc = subprocess.run(
        ["bash", str(script)],
        cwd=cwd or script.parent,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    return proc, calls


def logged_env(log: Path) -> list[dict[str, str]]:
    """The API-key variables each stubbed call saw (in call order), from the last run_with_stubs."""
    path = Path(f"{log}.env")
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def bash_syntax_ok(script: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, env=dict(os.environ))


def flag_value(argv: list[str], flag: str) -> str:
    assert flag in argv, f"{flag} missing from {argv}"
    return argv[argv.index(flag) + 1]


def skypilot_errors(task: dict) -> list[str]:
    """What SkyPilot 0.14.1's own schemas reject in a task (recorded by tools/skypilot_schema.py)."""
    import jsonschema

    recorded = json.loads((Path(__file__).parent / "data" / "skypilot" / "schemas-0.14.1.json").read_text())

    def case_insensitive_enum(validator, enums, instance, schema):
        if instance.lower() not in [e.lower() for e in enums]:
            yield jsonschema.ValidationError(f"{instance!r} is not one of {enums!r}")

    def case_sensitive_enum(validator, enums, instance, schema):
        if instance not in enums:
            yield jsonschema.ValidationError(f"{instance!r} is not one of {enums!r}")

    sky_validator = jsonschema.validators.extend(
        jsonschema.Draft7Validator,
        validators={
            "case_insensitive_enum": case_insensitive_enum,
            "case_sensitive_enum": case_sensitive_enum,
        },
    )
    given = {k: v for k, v in task.items() if v is not None}  # SkyPilot drops empty fields first
    errors = [f"task: {e.message}" for e in sky_validator(recorded["task"]).iter_errors(given)]
    resources = given.get("resources") or {}
    errors += [f"resources: {e.message}" for e in sky_validator(recorded["resources"]).iter_errors(resources)]
    return errors
