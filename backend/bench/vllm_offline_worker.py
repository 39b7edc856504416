"""Run one offline workload through vLLM's `LLM` and print its timing: the peer column of bench.offline.

Runs inside vLLM's own environment (`.venv-vllm/bin/python backend/bench/vllm_offline_worker.py IN.json`),
so it imports nothing from this project. IN.json: {"model", "dtype", "max_num_seqs",
"max_num_batched_tokens", "max_model_len", "enforce_eager", "prompts": [[ids]], "warmup_prompts": [[ids]],
"max_tokens": [n]}. The warm-up prompts (as many, other tokens: no prefix-cache hits later) run once
untimed (compilation, caches), then the workload once timed; prints a line "PEER_RESULT <JSON>" with
{"elapsed_s", "output_tokens", "warmup_s", "vllm_version"}.
"""

import json
import sys
import time


def main(path: str) -> None:
    import vllm
    from vllm import LLM, SamplingParams

    with open(path) as spec_file:
        spec = json.load(spec_file)
    llm = LLM(
        model=spec["model"],
        dtype=spec["dtype"],
        max_num_seqs=spec["max_num_seqs"],
        max_num_batched_tokens=spec["max_num_batched_tokens"],
        max_model_len=spec["max_model_len"],
        enforce_eager=spec["enforce_eager"],
        seed=0,
    )
    prompts = [{"prompt_token_ids": ids} for ids in spec["prompts"]]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in spec["max_tokens"]]
    warm_prompts = [{"prompt_token_ids": ids} for ids in spec["warmup_prompts"]]
    start = time.perf_counter()
    llm.generate(warm_prompts, params, use_tqdm=False)
    warmup = time.perf_counter() - start
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    produced = [len(o.outputs[0].token_ids) for o in outs]
    assert produced == spec["max_tokens"], "vLLM stopped a request early despite ignore_eos"
    result = {"elapsed_s": elapsed, "output_tokens": sum(produced), "warmup_s": warmup}
    print("PEER_RESULT", json.dumps(result | {"vllm_version": vllm.__version__}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
