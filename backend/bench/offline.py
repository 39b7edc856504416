"""Offline throughput: the embedded engine against transformers, same model, workload and dtype, one process.

    python -m backend.bench.offline            # the full workload (128 chat prompts, default model)
    python -m backend.bench.offline --num-prompts 32 --max-tokens 96
    python -m backend.bench.offline --peer vllm --num-prompts 96 --max-prompt-len 700 --min-tokens 8 \
        --max-tokens 300 --skip static,cb,batch1,ttft,quant   # issue 20's workload, vLLM CPU beside

Modes: the engine (continuous batching), transformers `generate` in static left-padded batches, and
transformers `generate_batch`-style continuous batching (its ContinuousBatchingManager, so that each
request keeps its own max_tokens); also batch-1 decode speed and the time to first token of a 512-token
prompt (measured right after the engine run); for a quantized checkpoint (the default model is Q4_1),
the engine running it as stored against the same engine dequantizing it at load (bench/quantized.py);
with --peer vllm, vLLM's CPU build on the same prompts in its own environment (bench/peer.py; the model as
a bf16 dense folder for both then).
Output tokens/s counts the tokens each request asked for (greedy, ignore_eos).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from dataclasses import dataclass

from backend.bench import quantized, versus_llamacpp
from backend.bench.machine import cpu_summary
from backend.bench.peer import run_vllm


@dataclass(slots=True)
class Workload:
    prompts: list[list[int]]
    max_tokens: list[int]

    @property
    def output_tokens(self) -> int:
        return sum(self.max_tokens)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model folder, GGUF file or Hub id (default model)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--num-prompts", type=int, default=128)
    parser.add_argument("--min-prompt-len", type=int, default=20)
    parser.add_argument("--max-prompt-len", type=int, default=600)
    parser.add_argument("--min-tokens", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16, help="transformers static batch size")
    parser.add_argument("--decode-tokens", type=int, default=64, help="tokens for the batch-1 decode test")
    parser.add_argument("--ttft-prompt-len", type=int, default=512)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--skip", default="", help="comma list of modes to skip: static,cb,batch1,ttft,quant")
    parser.add_argument("--quant-repeats", type=int, default=5, help="runs of each quantized/dense test")
    parser.add_argument("--seed", type=int, default=0)
    peers = ["none", "vllm", "llamacpp"]  # llamacpp: decode speed on a GGUF file (versus_llamacpp.py)
    parser.add_argument("--peer", default="none", choices=peers, help="vLLM CPU as a column, or llama.cpp")
    parser.add_argument("--peer-eager", action="store_true", help="vLLM without torch.compile")


def make_workload(tokenizer, args: argparse.Namespace) -> Workload:
    """Chat prompts of random words, lengths uniform in [min, max] tokens (template included)."""
    rng = random.Random(args.seed)
    words = [i for t, i in tokenizer.get_vocab().items() if t.startswith("Ġ") and t[1:].isalpha()]
    overhead = len(chat_ids(tokenizer, ""))
    prompts, max_tokens = [], []
    for _ in range(args.num_prompts):
        target = rng.randint(args.min_prompt_len, args.max_prompt_len)
        content = tokenizer.decode(rng.choices(words, k=max(1, target - overhead))).strip()
        prompts.append(chat_ids(tokenizer, content)[: args.max_prompt_len])
        max_tokens.append(rng.randint(args.min_tokens, args.max_tokens))
    return Workload(prompts, max_tokens)


def chat_ids(tokenizer, content: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def run_engine(llm, work: Workload) -> float:
    from backend.engine import SamplingParams

    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in work.max_tokens]
    start = time.perf_counter()
    outs = llm.generate(work.prompts, params)
    elapsed = time.perf_counter() - start
    assert [len(o.outputs[0].token_ids) for o in outs] == work.max_tokens
    return elapsed


def hf_generation_config(model, max_new_tokens: int):
    config = model.generation_config.__class__.from_dict(model.generation_config.to_dict())
    config.update(max_new_tokens=max_new_tokens, min_new_tokens=None, do_sample=False, eos_token_id=None)
    config.update(pad_token_id=0, temperature=None, top_p=None, top_k=None)
    return config


def run_hf_static(model, work: Workload, batch_size: int) -> float:
    import torch

    start = time.perf_counter()
    for i in range(0, len(work.prompts), batch_size):
        batch = work.prompts[i : i + batch_size]
        width = max(map(len, batch))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        new = max(work.max_tokens[i : i + batch_size])
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, generation_config=hf_generation_config(model, new))
        assert out.shape[1] == width + new
    return time.perf_counter() - start


def run_hf_continuous(model, work: Workload) -> float:
    from transformers.generation.continuous_batching.continuous_api import WorkloadHints

    config = hf_generation_config(model, max(work.max_tokens))
    hints = WorkloadHints(max(map(len, work.prompts)), max(work.max_tokens), len(work.prompts))
    start = time.perf_counter()
    with model.continuous_batching_context_manager(generation_config=config, workload_hints=hints) as manager:
        for i, (prompt, m) in enumerate(zip(work.prompts, work.max_tokens, strict=True)):
            manager.add_request(prompt, request_id=f"r{i}", max_new_tokens=m, eos_token_id=-1)
        done = 0
        while done < len(work.prompts):
            result = manager.get_result(timeout=1)
            if result is not None and result.is_finished():
                done += 1
    return time.perf_counter() - start


def decode_rate(generate_one, tokens: int, repeats: int = 5) -> float:
    """Batch-1 decode tokens/s: (time for N tokens - time for 1 token) / (N - 1), medians of interleaved
    runs (robust to a noisy, shared machine)."""
    generate_one(tokens)  # warm-up
    many: list[float] = []
    one: list[float] = []
    for _ in range(repeats):
        for n, times in ((tokens, many), (1, one)):
            start = time.perf_counter()
            generate_one(n)
            times.append(time.perf_counter() - start)
    many_s, one_s = statistics.median(many), statistics.median(one)
    print(f"  batch 1: {tokens} tokens in {many_s:.3f} s, 1 token in {one_s:.3f} s (medians)", flush=True)
    return (tokens - 1) / (many_s - one_s)


def timed(fn) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(args: argparse.Namespace) -> int:
    import torch

    from backend.default_model import default_model
    from backend.engine import LLM
    from backend.hf_reference import load_hf_model

    if args.peer == "llamacpp":  # llama.cpp runs GGUF files only: its own bench (bench/versus_llamacpp.py)
        return versus_llamacpp.main(versus_llamacpp.parse_args(["--model", args.model] if args.model else []))
    torch.manual_seed(args.seed)
    model = args.model or default_model()
    if args.peer != "none" and str(model).endswith(".gguf"):  # the peer loads the dense folder: so do we
        from backend.bench.compare_targets import dense_cache_dir, model_folder

        model = model_folder(model, dense_cache_dir())
    spin = os.environ["GOMP_SPINCOUNT"]
    print(f"model {model}, dtype {args.dtype}, torch threads {torch.get_num_threads()}, "
          f"GOMP_SPINCOUNT={spin}, load average {load_average()}", flush=True)  # fmt: skip
    print(cpu_summary(), flush=True)
    llm = LLM(model, dtype=args.dtype, device=args.device, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens)  # fmt: skip
    hf, _ = load_hf_model(model, getattr(torch, args.dtype))
    hf = hf.to(llm.device)
    work = make_workload(llm.tokenizer, args)
    lens = [len(p) for p in work.prompts]
    print(f"{len(lens)} prompts of {min(lens)}-{max(lens)} tokens (mean {sum(lens) / len(lens):.0f}), "
          f"{work.output_tokens} output tokens", flush=True)  # fmt: skip
    skip = set(args.skip.split(","))
    warm = Workload(work.prompts[:2], [4, 4])
    run_engine(llm, warm)
    # against a peer, both warm up on a whole workload of other prompts (same lengths: every batch shape
    # compiled or JIT-ed once, no prefix-cache hits in the timed run)
    peer_warmup = make_workload(llm.tokenizer, argparse.Namespace(**{**vars(args), "seed": args.seed + 1}))
    if args.peer != "none":
        run_engine(llm, peer_warmup)
    rows: dict[str, float] = {}
    rows["engine (continuous batching)"] = work.output_tokens / run_engine(llm, work)
    print(f"engine: {rows['engine (continuous batching)']:.1f} tok/s", flush=True)
    if args.peer == "vllm":
        peer = run_vllm(model, work, peer_warmup, args)
        print(f"peer: {peer.detail}", flush=True)
        if peer.tok_s is not None:
            rows["vLLM CPU (subprocess)"] = peer.tok_s
            print(f"vLLM CPU: {peer.tok_s:.1f} tok/s, load average {load_average()}", flush=True)
    # batch-1 and TTFT before transformers' batched modes: after generate_batch, a later `generate` of
    # the same model has been seen to return early (caught by the length check in measure_batch1)
    if "batch1" not in skip:
        print_table("Batch-1 decode (tokens/s)", measure_batch1(llm, hf, work.prompts[0][:32], args))
    if "ttft" not in skip:
        ttft = measure_ttft(llm, hf, work.prompts[0], args.ttft_prompt_len)
        print_table(f"TTFT of a {args.ttft_prompt_len}-token prompt (s, lower is better)", ttft, lower=True)
    if "quant" not in skip:
        for table in quantized.compare(llm, args, work, run_engine):
            print_table(table.title, table.rows, lower=table.lower)
    if "static" not in skip:
        run_hf_static(hf, warm, args.batch_size)
        rows[f"transformers generate, static batch {args.batch_size}"] = work.output_tokens / run_hf_static(
            hf, work, args.batch_size
        )
    if "cb" not in skip:
        try:
            elapsed = run_hf_continuous(hf, work)
            rows["transformers generate_batch (continuous)"] = work.output_tokens / elapsed
        except Exception as exc:  # its API moves between transformers versions
            print(f"transformers continuous batching failed: {type(exc).__name__}: {exc}", flush=True)
    print_table("Throughput (output tokens/s)", rows)
    print(f"  load average {load_average()}", flush=True)
    return 0


def measure_batch1(llm, hf, prompt: list[int], args: argparse.Namespace) -> dict[str, float]:
    import torch

    from backend.engine import SamplingParams

    def engine_one(n):
        (out,) = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
        assert len(out.outputs[0].token_ids) == n

    def hf_one(n):
        with torch.inference_mode():
            out = hf.generate(torch.tensor([prompt]), generation_config=hf_generation_config(hf, n))
        assert out.shape[1] == len(prompt) + n, f"transformers generated {out.shape[1] - len(prompt)} of {n}"

    return {
        "engine": decode_rate(engine_one, args.decode_tokens),
        "transformers generate": decode_rate(hf_one, args.decode_tokens),
    }


def measure_ttft(llm, hf, seed_prompt: list[int], length: int) -> dict[str, float]:
    import torch

    from backend.engine import SamplingParams

    long_prompt = (seed_prompt * (length // len(seed_prompt) + 1))[:length]
    fresh = iter([long_prompt, long_prompt[::-1]])  # the timed run must not hit the prefix cache
    ttft = {"engine": timed(lambda: llm.generate(next(fresh), SamplingParams(temperature=0.0, max_tokens=1)))}
    with torch.inference_mode():
        ids = torch.tensor([long_prompt])
        ttft["transformers generate"] = timed(
            lambda: hf.generate(ids, generation_config=hf_generation_config(hf, 1))
        )
    return ttft


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def print_table(title: str, rows: dict[str, float], lower: bool = False) -> None:
    engine_key = next(iter(rows))
    print(f"\n{title}")
    print(f"  {'mode':<44} {'value':>10} {'engine / mode':>14}")
    for name, value in rows.items():
        ratio = (value / rows[engine_key]) if lower else (rows[engine_key] / value)
        print(f"  {name:<44} {value:>10.3f} {ratio:>13.2f}x")
    others = [v for k, v in rows.items() if k != engine_key]
    if others:
        best = min(others) if lower else max(others)
        ratio = best / rows[engine_key] if lower else rows[engine_key] / best
        print(f"  engine vs the best other mode: {ratio:.2f}x", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
