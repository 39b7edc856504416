"""The offline column of compare: the embedded engine's `LLM.generate` on the prompts a served run sent.

The prompts are the run's own (the same seed and slice), as the token ids the server makes of them
(completions text encoded without special tokens; chat messages through the chat template), with each
request's max_tokens, greedy and ignore_eos, on the engine settings the server was launched with and
max_num_seqs = the run's concurrency, loaded and stepped on one thread as the server's engine is
(`AsyncLLM.from_config`: one OpenMP worker pool, README issue 19). It runs in a
subprocess of this checkout's Python (`python -m backend.bench.compare_offline SPEC.json`) after the
server has stopped, so it has the machine
as the server had: the warm-up prompts untimed, then the run's prompts timed through the same function
`backend.bench.offline` times the engine with.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import asdict

from backend.bench.compare import CompareTarget, OfflineRun, Workload
from backend.bench.datasets import SampleRequest, load_tokenizer, sample_requests
from backend.engine.config import EngineConfig
from backend.export.supervisor import ROOT, launch_env

TIMEOUT_S = 3600


def prompt_ids(tokenizer, req: SampleRequest) -> list[int]:
    """The ids the server encodes the request to (serving.py: no special tokens added)."""
    text = req.prompt
    if req.messages is not None:
        text = tokenizer.apply_chat_template(req.messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def token_prompts(workload: Workload, tokenizer_path: str) -> dict:
    """The run's prompts as token ids and its max_tokens, from the same seed and slice as served."""
    tokenizer = load_tokenizer(tokenizer_path)
    requests = sample_requests(workload.config(CompareTarget("offline", "http://offline", "offline")))
    return {
        "prompts": [prompt_ids(tokenizer, r) for r in requests],
        "max_tokens": [r.output_len for r in requests],
    }


def run_offline(config: EngineConfig, run: Workload, warmup: Workload | None) -> OfflineRun:
    """Output tokens/s of the engine offline on run's prompts (warmup's first, untimed)."""
    tokenizer = run.tokenizer or config.model
    timed = token_prompts(run, tokenizer)
    warm = token_prompts(warmup, tokenizer) if warmup else {"prompts": [], "max_tokens": []}
    spec = {"engine": asdict(config), "warmup": warm, "timed": timed}
    with tempfile.NamedTemporaryFile("w", suffix=".json") as spec_file:
        json.dump(spec, spec_file)
        spec_file.flush()
        command = [sys.executable, "-m", "backend.bench.compare_offline", spec_file.name]
        try:  # its own session, as the servers get (process.py): with Linux's autogroup scheduling a
            # session is one share of the CPU on a busy machine, so it competes on the servers' terms
            done = subprocess.run(
                command,
                start_new_session=True,
                capture_output=True,
                text=True,
                env=launch_env("embedded"),
                cwd=ROOT,
                timeout=TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            return OfflineRun(run.max_concurrency, None, f"did not finish within {TIMEOUT_S} s")
    lines = [line for line in done.stdout.splitlines() if line.startswith("OFFLINE_RESULT ")]
    if done.returncode != 0 or not lines:
        why = f"failed (exit {done.returncode}): {done.stderr.strip()[-800:]}"
        return OfflineRun(run.max_concurrency, None, why)
    result = json.loads(lines[-1].removeprefix("OFFLINE_RESULT "))
    detail = (
        f"LLM.generate, max_num_seqs {config.max_num_seqs}, {len(timed['prompts'])} prompts "
        f"({result['input_tokens']:,} prompt tokens), {len(warm['prompts'])} warm-up prompts untimed"
    )
    tok_s = result["output_tokens"] / result["elapsed_s"]
    return OfflineRun(run.max_concurrency, tok_s, detail, result["input_tokens"])


def main(path: str) -> None:
    from backend.bench.offline import Workload as TokenWorkload
    from backend.bench.offline import run_engine
    from backend.engine import LLM

    with open(path, encoding="utf-8") as spec_file:
        spec = json.load(spec_file)
    engine = dict(spec["engine"])
    llm = LLM(engine.pop("model"), **engine)
    if spec["warmup"]["prompts"]:
        run_engine(llm, TokenWorkload(spec["warmup"]["prompts"], spec["warmup"]["max_tokens"]))
    work = TokenWorkload(spec["timed"]["prompts"], spec["timed"]["max_tokens"])
    elapsed = run_engine(llm, work)
    input_tokens = sum(map(len, work.prompts))
    result = {"elapsed_s": elapsed, "output_tokens": work.output_tokens, "input_tokens": input_tokens}
    print("OFFLINE_RESULT", json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
