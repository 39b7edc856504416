"""fp8 KV cache against the model's own dtype: blocks per byte, top-1 agreement, decode speed.

`python -m benchmarks.kv_cache` runs the default model (or --model) with kv_cache_dtype auto, fp8
(e4m3) and fp8_e5m2 under the same kv_cache_memory_bytes, in one process. Agreement is measured by
teacher forcing: every engine is fed the auto engine's greedy continuation token by token (TeacherForcing
replaces its sampler) and its own top-1 choice is recorded at each position, so one early difference
does not make the rest of a sequence diverge. The machine may be shared: speeds are medians of runs
taken in turns (A B C C B A).
"""

from __future__ import annotations

import argparse

import torch

from backend.engine.sequence import Sequence

PROMPTS = (
    "The capital of France is",
    "Write a haiku about the sea.",
    "def fibonacci(n):",
    "List three colors:",
    "Once upon a time,",
    "The theory of relativity says",
    "In 1969, humans",
    "Photosynthesis is the process",
)


class TeacherForcing:
    """The engine's sampler interface (`sample(logits, seqs)`): each sequence is fed the continuation
    given for its prompt, and the model's own greedy token at every position is kept in top1."""

    def __init__(self, continuations: dict[tuple[int, ...], list[int]]) -> None:
        self.continuations = continuations
        self.top1: dict[tuple[int, ...], list[int]] = {prompt: [] for prompt in continuations}

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> tuple[list[int], None]:
        tokens = []
        for best, seq in zip(logits.argmax(-1).tolist(), seqs, strict=True):
            prompt = tuple(seq.token_ids[: seq.num_prompt_tokens])
            own = self.top1[prompt]
            tokens.append(self.continuations[prompt][len(own)])
            own.append(best)
        return tokens, None


def greedy(llm, prompts: list[str], max_tokens: int) -> dict[tuple[int, ...], list[int]]:
    from backend.engine import SamplingParams

    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    return {tuple(out.prompt_token_ids): list(out.outputs[0].token_ids) for out in outs}


def top1_agreement(reference, candidate, prompts: list[str], max_tokens: int) -> float:
    """Share of positions where candidate's greedy token equals reference's, both fed reference's tokens."""
    from backend.engine import SamplingParams

    expected = greedy(reference, prompts, max_tokens)
    engine = candidate.llm_engine
    sampler, engine.sampler = engine.sampler, TeacherForcing(expected)
    try:
        candidate.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
        forced = engine.sampler
    finally:
        engine.sampler = sampler
    pairs = [
        (a, b)
        for prompt, tokens in expected.items()
        for a, b in zip(tokens, forced.top1[prompt], strict=True)
    ]
    assert len(pairs) == len(prompts) * max_tokens, "every position was forced"
    return sum(a == b for a, b in pairs) / len(pairs)


def decode_rate(engines: dict, tokens: int, repeats: int) -> dict[str, float]:
    from backend.bench.quantized import decode_rates

    prompt = engines["auto"].tokenizer.encode(PROMPTS[0])
    return decode_rates(engines, prompt, tokens, repeats)


def main(argv: list[str] | None = None) -> None:
    from backend.default_model import default_model
    from backend.engine import LLM

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--model", default=None, help="default: the packaged SmolLM2 GGUF")
    parser.add_argument("--kv-cache-memory-mib", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=48, help="generated tokens per prompt")
    parser.add_argument("--repeats", type=int, default=3, help="decode-speed runs per engine")
    args = parser.parse_args(argv)
    model = args.model or default_model(check_hub=False)
    engines = {
        kv: LLM(model, device="cpu", kv_cache_dtype=kv, kv_cache_memory_bytes=args.kv_cache_memory_mib << 20)
        for kv in ("auto", "fp8", "fp8_e5m2")
    }
    rates = decode_rate(engines, args.tokens, args.repeats)
    print(f"{model}: {len(PROMPTS)} prompts x {args.tokens} tokens, KV pool {args.kv_cache_memory_mib} MiB")
    print(f"{'kv_cache_dtype':<16}{'blocks':>8}{'top-1 agreement':>18}{'decode tok/s':>14}")
    for kv, llm in engines.items():
        agreement = top1_agreement(engines["auto"], llm, list(PROMPTS), args.tokens)
        blocks = llm.stats().num_kv_blocks_total
        print(f"{kv:<16}{blocks:>8}{agreement:>17.1%}{rates[kv]:>14.1f}")
    print(f"(decode: batch 1, medians of {args.repeats} runs in turns; the machine may be shared)")


if __name__ == "__main__":
    main()
