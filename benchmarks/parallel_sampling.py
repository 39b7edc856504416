"""Parallel sampling: KV blocks and prompt tokens computed for one request with n samples against n
separate requests of the same prompt, with the prefix cache off and on.

    python -m benchmarks.parallel_sampling [--model M] [--prompt-len 500] [--n 4] [--max-tokens 64]

Each (prefix cache, mode) runs on its own engine of the same model and pool, in one process: "n=4" is one
request with SamplingParams(n=4) (its samples share the prompt's blocks, copy-on-write on the last partial
block), "4 requests" are n requests of one sample each, added together. Sampling is seeded (sample i of the
n=4 request draws what request i draws), so both modes produce the same tokens. Printed per row: KV blocks
in use once every prompt is prefilled, the peak, the tokens the forward passes computed (prompts and
outputs), and the wall time; then the separate / shared ratios.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass


@dataclass(slots=True)
class Run:
    blocks_after_prefill: int
    peak_blocks: int
    tokens_computed: int  # tokens through the model's forward passes, prompts and outputs
    seconds: float
    outputs: list[list[int]]


def run(llm, prompt: list[int], n: int, max_tokens: int, shared: bool) -> Run:
    """Step the engine until done, sampling its KV block count after every step."""
    from backend.engine import SamplingParams

    engine = llm.llm_engine
    # sample i of the shared request draws with seed 1000 + i (vLLM v1's child seeds), as request i does
    params = [
        SamplingParams(
            n=n if shared else 1, seed=1000 + i, temperature=1.0, max_tokens=max_tokens, ignore_eos=True
        )
        for i in range(1 if shared else n)
    ]
    computed = 0
    execute = engine.runner.execute

    def counting(scheduled):
        nonlocal computed
        computed += sum(item.num_new_tokens for item in scheduled)
        return execute(scheduled)

    engine.runner.execute = counting
    start = time.perf_counter()
    for i, sp in enumerate(params):
        engine.add_request(f"bench-{i}", prompt, sp)
    after_prefill = peak = 0
    outputs: dict[str, list[list[int]]] = {}
    try:
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    outputs[out.request_id] = [c.token_ids for c in out.outputs]
            used = engine.block_manager.num_used_blocks
            peak = max(peak, used)
            seqs = [seq for request in engine.requests.values() for seq in request.seqs]
            if not after_prefill and seqs and all(seq.num_output_tokens >= 1 for seq in seqs):
                after_prefill = used
    finally:
        engine.runner.execute = execute
    seconds = time.perf_counter() - start
    tokens = [t for i in range(len(params)) for t in outputs[f"bench-{i}"]]
    return Run(after_prefill, peak, computed, seconds, tokens)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="default: the bundled default model")
    parser.add_argument("--prompt-len", type=int, default=500)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--num-kv-blocks", type=int, default=1024)
    args = parser.parse_args(argv)

    import torch

    from backend.bench.machine import cpu_summary
    from backend.default_model import default_model
    from backend.engine import LLM

    model = args.model or default_model(check_hub=False)
    print(cpu_summary())
    print(f"model {model}; prompt {args.prompt_len} tokens, n={args.n}, {args.max_tokens} tokens each")
    header = f"{'prefix cache':<13}{'mode':<14}{'blocks after prefill':>21}{'peak blocks':>13}"
    print(header + f"{'tokens computed':>17}{'seconds':>9}")
    for caching in (False, True):
        runs = {}
        for shared in (True, False):
            llm = LLM(model, enable_prefix_caching=caching, num_kv_blocks=args.num_kv_blocks)
            vocab = llm.llm_engine.runner.model.args.vocab_size
            generator = torch.Generator().manual_seed(0)
            prompt = torch.randint(100, vocab, (args.prompt_len,), generator=generator).tolist()
            result = runs[shared] = run(llm, prompt, args.n, args.max_tokens, shared)
            mode = f"n={args.n}" if shared else f"{args.n} requests"
            print(
                f"{'on' if caching else 'off':<13}{mode:<14}{result.blocks_after_prefill:>21}"
                f"{result.peak_blocks:>13}{result.tokens_computed:>17}{result.seconds:>9.2f}"
            )
        same = runs[True].outputs == runs[False].outputs
        print(
            f"  separate / shared: blocks after prefill "
            f"{runs[False].blocks_after_prefill / runs[True].blocks_after_prefill:.2f}x, peak "
            f"{runs[False].peak_blocks / runs[True].peak_blocks:.2f}x, tokens computed "
            f"{runs[False].tokens_computed / runs[True].tokens_computed:.2f}x, seconds "
            f"{runs[False].seconds / runs[True].seconds:.2f}x; same tokens: {same}"
        )


if __name__ == "__main__":
    main()
