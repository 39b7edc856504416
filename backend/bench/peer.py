"""The peer column of bench.offline: the same workload through vLLM's CPU build, in its own environment.

vLLM runs as a subprocess (`vllm_offline_worker.py` under vLLM's Python, found as the Launch tab finds
`vllm`: $VLLM_EXECUTABLE, PATH, or .venv-vllm), on the model as a dense folder (a GGUF is converted once,
as compare does), with one untimed warm-up run of the whole workload before the timed one.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

WORKER = Path(__file__).with_name("vllm_offline_worker.py")
TIMEOUT_S = 3600


@dataclass(slots=True)
class PeerResult:
    tok_s: float | None
    detail: str  # version and settings, or why there is no figure


def vllm_python() -> Path | None:
    from backend.export.supervisor import executable_dir

    folder = executable_dir("vllm")
    python = folder / "python" if folder else None
    return python if python and python.is_file() else None


def run_vllm(model: str, work, warmup, args) -> PeerResult:
    """Output tokens/s of vLLM on work (prompts as token ids, per-request max_tokens, greedy, ignore_eos)."""
    from backend.bench.compare_targets import dense_cache_dir, model_folder

    python = vllm_python()
    if python is None:
        return PeerResult(None, "vLLM is not installed (make vllm)")
    folder = model_folder(model, dense_cache_dir())
    spec = {
        "model": folder,
        "dtype": args.dtype,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": max(args.max_num_batched_tokens, 2048),  # vLLM's CPU default
        "max_model_len": 2048,
        "enforce_eager": args.peer_eager,
        "prompts": work.prompts,
        "warmup_prompts": warmup.prompts,
        "max_tokens": work.max_tokens,
    }
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; it otherwise takes a share of all host memory
    with tempfile.NamedTemporaryFile("w", suffix=".json") as spec_file:
        json.dump(spec, spec_file)
        spec_file.flush()
        try:
            done = subprocess.run(
                [str(python), str(WORKER), spec_file.name],
                capture_output=True,
                text=True,
                env=env,
                timeout=TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            return PeerResult(None, f"vLLM did not finish within {TIMEOUT_S} s")
    lines = [line for line in done.stdout.splitlines() if line.startswith("PEER_RESULT ")]
    if done.returncode != 0 or not lines:
        return PeerResult(None, f"vLLM failed (exit {done.returncode}): {done.stderr.strip()[-800:]}")
    result = json.loads(lines[-1].removeprefix("PEER_RESULT "))
    detail = (
        f"vLLM {result['vllm_version']}, {'eager' if args.peer_eager else 'compiled'}, warm-up run "
        f"{result['warmup_s']:.1f} s untimed, max_num_batched_tokens {spec['max_num_batched_tokens']}"
    )
    return PeerResult(result["output_tokens"] / result["elapsed_s"], detail)
