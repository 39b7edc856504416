"""Speculative decoding (n-gram prompt lookup and a draft model) changes how many tokens a step gains,
never which tokens: greedy output is token-identical to decoding without it (tiny random models of every
architecture, with chunked prefill, prefix caching and preemption in play, and the default model on a
prompt that repeats text, where drafts are accepted); sampled output keeps the target's distribution
(chi-square test); grammar-constrained requests and large batches do not speculate. After every test
the engine (and the draft model's own KV pool) holds no block."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from backend.engine import LLM, SamplingParams, StructuredOutputsParams
from backend.engine.config import EngineConfig
from backend.engine.spec_decode.config import SpeculativeConfig
from backend.engine.spec_decode.ngram_proposer import NgramProposer
from tests.engine_utils import ARCHITECTURES, assert_engine_clean, hf_greedy, prompts, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MAX_TOKENS = 32
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
ALWAYS = {"disable_by_batch_size": 1024}  # speculate at any batch size (the tests' batches are small)


def make_llm(arch: str, spec: dict | None, **kwargs) -> LLM:
    config = None if spec is None else spec | ALWAYS
    return LLM(tiny_model(arch)[0], dtype="float32", device="cpu", speculative_config=config, **kwargs)


def draft(arch: str) -> dict:
    return {"method": "draft_model", "model": tiny_model(arch)[0], "num_speculative_tokens": 3}


def token_ids(outputs) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in outputs]


def repetitive(prompt: list[int]) -> list[int]:
    """A prompt that repeats its own text, so that n-gram lookup finds proposals."""
    return prompt[:12] * 3 + prompt


def spec_stats(llm: LLM):
    speculator = llm.llm_engine.speculator
    assert speculator is not None
    return speculator.stats


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_ngram_is_token_identical_to_transformers(arch):
    llm = make_llm(arch, NGRAM)
    batch = prompts(lengths=(5, 17, 33), seed=1) + [repetitive(p) for p in prompts(lengths=(20, 40), seed=2)]
    assert token_ids(llm.generate(batch, GREEDY)) == [hf_greedy(arch, p, MAX_TOKENS) for p in batch]
    stats = spec_stats(llm)  # drafts come when a random model's output repeats itself or the prompt
    assert stats.num_draft_tokens >= stats.num_drafts and stats.num_accepted_tokens <= stats.num_draft_tokens
    assert_engine_clean(llm)


@pytest.mark.parametrize(("arch", "draft_arch"), [("llama", "llama"), ("qwen2", "qwen2"), ("qwen3", "llama")])
def test_greedy_draft_model_is_token_identical_to_transformers(arch, draft_arch):
    """The draft is the target itself (every draft accepted) or another tiny model (few accepted)."""
    llm = make_llm(arch, draft(draft_arch))
    batch = prompts(lengths=(5, 17, 33, 70), seed=3)
    assert token_ids(llm.generate(batch, GREEDY)) == [hf_greedy(arch, p, MAX_TOKENS) for p in batch]
    stats = spec_stats(llm)
    assert stats.num_drafts > 0
    if arch == draft_arch:  # the same model drafts exactly what the target decodes
        assert stats.num_accepted_tokens == stats.num_draft_tokens > 0
        assert stats.mean_acceptance_length > 3.0
    assert_engine_clean(llm)


@pytest.mark.parametrize("spec", [NGRAM, draft("llama")], ids=["ngram", "draft_model"])
def test_chunked_prefill_prefix_caching_and_preemption_in_play(spec):
    """Small token budget (drafts cut to it), a small KV pool (preemption), shared prefixes (cache hits)
    across two rounds: outputs still match transformers and the prefix cache serves the right KV."""
    arch = "llama"
    llm = make_llm(arch, spec, block_size=4, num_kv_blocks=48, max_num_seqs=6, max_num_batched_tokens=24)
    shared = prompts(lengths=(20,), seed=4)[0]
    batch = [repetitive(shared) + tail for tail in prompts(lengths=(3, 9, 14), seed=5)] + prompts(seed=2)
    expected = [hf_greedy(arch, p, MAX_TOKENS) for p in batch]
    assert token_ids(llm.generate(batch, GREEDY)) == expected
    assert token_ids(llm.generate(batch, GREEDY)) == expected  # second round: from the prefix cache
    stats = llm.stats()
    assert stats.num_preemptions_total > 0
    assert stats.prefix_cache_hits_total > 0
    assert spec_stats(llm).num_drafts > 0
    assert_engine_clean(llm)


def test_greedy_default_model_accepts_drafts_and_matches(default_dense_model):
    """The default model (fp32) asked to repeat a paragraph: n-gram drafts are accepted, output equal."""
    paragraph = (
        "The paged KV cache splits memory into fixed-size blocks. Each sequence owns a block table, "
        "and blocks with the same prefix are shared between requests, so long system prompts are "
        "computed once. When memory runs out, the scheduler preempts the newest sequence."
    )
    messages = [{"role": "user", "content": f"Repeat this paragraph word for word:\n\n{paragraph}"}]
    params = SamplingParams(temperature=0.0, max_tokens=48)
    plain = LLM(str(default_dense_model), dtype="float32", device="cpu")
    expected = token_ids(plain.chat(messages, params))
    del plain
    llm = LLM(str(default_dense_model), dtype="float32", device="cpu", speculative_config=NGRAM)
    assert token_ids(llm.chat(messages, params)) == expected
    stats = spec_stats(llm)
    assert stats.num_accepted_tokens > 0, stats
    assert llm.stats().spec_decode_num_accepted_tokens_total == stats.num_accepted_tokens
    assert_engine_clean(llm)


def chi_square_critical(df: int) -> float:
    """The chi-square value exceeded with probability 0.001 (Wilson-Hilferty; within 1% for df >= 3)."""
    z = 3.0902  # the standard normal's 0.999 quantile
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def two_sample_chi_square(a: Counter, b: Counter, min_count: int = 10) -> tuple[float, int]:
    """Pearson's chi-square of a 2 x C table (tokens seen fewer than min_count times pooled); (stat, df)."""
    tokens = sorted(set(a) | set(b), key=lambda t: -(a[t] + b[t]))
    bins = [t for t in tokens if a[t] + b[t] >= min_count]
    rows = [[a[t] for t in bins], [b[t] for t in bins]]
    rows[0].append(sum(a.values()) - sum(rows[0]))
    rows[1].append(sum(b.values()) - sum(rows[1]))
    total = sum(map(sum, rows))
    stat, columns = 0.0, 0
    for j in range(len(rows[0])):
        column = rows[0][j] + rows[1][j]
        if column == 0:
            continue
        columns += 1
        for row in rows:
            expected = sum(row) * column / total
            stat += (row[j] - expected) ** 2 / expected
    return stat, columns - 1


def test_sampling_distribution_is_the_targets():
    """600 seeded samples with and without speculation (the target drafting for itself: drafts are its
    argmax, accepted with probability p(draft), so both acceptance and rejection happen often): the
    tokens at output positions 1 and 2, which come from verification steps, agree in a two-sample
    chi-square test at p = 0.001. Each side has its own seeds (independent samples); the seeds are
    fixed, so the test is deterministic. The n-gram method shares this rejection sampler (q is a point
    mass for both), so this checks its arithmetic too."""
    arch, num_samples = "llama", 600
    prompt = prompts(lengths=(16,), seed=7)[0]
    samples = {}
    for side, spec in enumerate((None, draft(arch))):
        seeds = range(side * num_samples, (side + 1) * num_samples)
        params = [
            SamplingParams(temperature=1.0, top_k=4, max_tokens=4, ignore_eos=True, seed=s) for s in seeds
        ]
        llm = make_llm(arch, spec, max_num_seqs=300, num_kv_blocks=1200)
        samples[side] = token_ids(llm.generate([prompt] * num_samples, params))
        assert_engine_clean(llm)
    stats = spec_stats(llm)
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens, stats
    for position in (1, 2):
        plain = Counter(s[position] for s in samples[0])
        speculative = Counter(s[position] for s in samples[1])
        stat, df = two_sample_chi_square(plain, speculative)
        assert df >= 8, df  # enough distinct tokens for the test to mean something
        assert stat < chi_square_critical(df), (position, stat, df)


def test_a_request_with_a_grammar_does_not_speculate():
    """Structured outputs: such a sequence decodes one masked token per step, beside others that speculate
    (the target drafting for itself, so the other request always has drafts)."""
    llm = make_llm("llama", draft("llama"))
    regex = StructuredOutputsParams(regex=r"(ab){1,20}")
    constrained = SamplingParams(temperature=0.0, max_tokens=16, structured_outputs=regex)
    plain = LLM(tiny_model("llama")[0], dtype="float32", device="cpu")
    expected = plain.generate(prompts(lengths=(9,))[0], constrained)[0].outputs[0].text
    out = llm.generate(prompts(lengths=(9,))[0], constrained)[0].outputs[0]
    assert out.text == expected and set(out.text) <= {"a", "b"}
    assert spec_stats(llm).num_drafts == 0  # alone, it never carried a draft
    batch = [prompts(lengths=(9,))[0], repetitive(prompts(lengths=(20,), seed=2)[0])]
    outs = llm.generate(batch, [constrained, GREEDY])
    assert outs[0].outputs[0].text == expected
    assert outs[1].outputs[0].token_ids == hf_greedy("llama", batch[1], MAX_TOKENS)
    assert spec_stats(llm).num_drafts > 0  # the other request speculated in the same steps
    assert_engine_clean(llm)


def test_no_drafts_above_disable_by_batch_size():
    llm = LLM(tiny_model("llama")[0], dtype="float32", device="cpu",
              speculative_config=draft("llama") | {"disable_by_batch_size": 2})  # fmt: skip
    batch = prompts(lengths=(10, 11, 12), seed=8)
    assert token_ids(llm.generate(batch, GREEDY)) == [hf_greedy("llama", p, MAX_TOKENS) for p in batch]
    assert spec_stats(llm).num_drafts == 0  # three running sequences: above the threshold throughout
    llm.generate(batch[:2], GREEDY)
    assert spec_stats(llm).num_drafts > 0
    assert_engine_clean(llm)


def test_ngram_lookup_takes_the_longest_earliest_match():
    proposer = NgramProposer(SpeculativeConfig("ngram", 3, prompt_lookup_min=1, prompt_lookup_max=3))
    assert proposer.lookup([1, 2, 3, 4, 5, 1, 2, 3], 3) == [4, 5, 1]
    assert proposer.lookup([7, 3, 9, 1, 2, 3, 8, 2, 3], 2) == [8, 2]  # "2 3" beats the older "3"
    assert proposer.lookup([1, 2, 3], 3) == []  # nothing recurs
    assert proposer.lookup([256, 1, 256, 1], 2) == [256, 1]  # whole tokens only, not byte matches
    assert proposer.lookup([5, 5, 5], 0) == []


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ('{"method": "eagle", "num_speculative_tokens": 2}', "method must be one of ngram, draft_model"),
        ('{"method": "ngram"}', "needs num_speculative_tokens"),
        ('{"method": "ngram", "num_speculative_tokens": 0}', r"must be an integer in \[1, 16\]"),
        ('{"method": "draft_model", "num_speculative_tokens": 2}', 'needs "model"'),
        (
            '{"method": "ngram", "num_speculative_tokens": 2, "lookahead": 1}',
            "unknown speculative_config key",
        ),
        (
            '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, '
            '"prompt_lookup_max": 2}',
            "prompt_lookup_min <= prompt_lookup_max",
        ),
        ("ngram", "not valid JSON"),
    ],
)
def test_bad_speculative_config_says_what_is_allowed(value, words):
    with pytest.raises(ValueError, match=words):
        EngineConfig(model="m", speculative_config=value)


def test_speculative_config_takes_a_dict_like_vllm_and_stores_canonical_json():
    config = EngineConfig(model="m", speculative_config={"num_speculative_tokens": 2, "method": "ngram"})
    assert config.speculative_config == '{"method":"ngram","num_speculative_tokens":2}'
    assert "--speculative-config" in config.cli_args()
