"""Sampling features: seeds, temperature / top-k / top-p / min-p, penalties, stop strings and tokens,
ignore_eos, logprobs, n, and incremental detokenization that never splits a multi-byte character."""

from __future__ import annotations

import pytest
import torch

from backend.engine import LLM, SamplingParams
from backend.engine.detokenizer import IncrementalDetokenizer
from backend.engine.sampler import apply_penalties, filter_logits
from backend.engine.sampling_params import SamplingParams as SP
from tests.engine_utils import (
    assert_engine_clean,
    prompts,
    tiny_model,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread", "no_leaked_blocks")

ARCH = "llama"


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(tiny_model(ARCH)[0], dtype="float32", device="cpu")


def greedy_ids(llm, prompt, max_tokens=24) -> list[int]:
    return (
        llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens))[0].outputs[0].token_ids
    )


def test_seeded_sampling_is_reproducible_alone_or_in_a_batch(llm):
    prompt, *others = prompts(seed=10)
    params = SamplingParams(temperature=1.0, seed=1234, max_tokens=20)
    alone = llm.generate(prompt, params)[0].outputs[0].token_ids
    unseeded = SamplingParams(temperature=1.0, max_tokens=20)
    batch = llm.generate([*others, prompt], [unseeded] * len(others) + [params])
    assert batch[-1].outputs[0].token_ids == alone
    other_seed = llm.generate(prompt, SamplingParams(temperature=1.0, seed=99, max_tokens=20))
    assert other_seed[0].outputs[0].token_ids != alone
    assert alone != greedy_ids(llm, prompt, 20)  # temperature 1 over 49k tokens really samples


@pytest.mark.parametrize(
    "params",
    [dict(top_k=1), dict(top_p=1e-6), dict(min_p=1.0), dict(temperature=1e-4)],
    ids=["top_k=1", "top_p=tiny", "min_p=1", "temperature=tiny"],
)
def test_filters_that_leave_only_the_top_token_equal_greedy(llm, params):
    prompt = prompts(seed=11)[3]
    out = llm.generate(prompt, SamplingParams(max_tokens=16, seed=7, **{"temperature": 1.0} | params))
    assert out[0].outputs[0].token_ids == greedy_ids(llm, prompt, 16)


def test_filter_logits_keeps_exactly_the_expected_tokens():
    logits = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]))
    kept = lambda out: torch.isfinite(out).nonzero().flatten().tolist()  # noqa: E731
    assert kept(filter_logits(logits, top_k=2, top_p=1.0, min_p=0.0)) == [0, 1]
    assert kept(filter_logits(logits, top_k=-1, top_p=0.7, min_p=0.0)) == [0, 1]
    assert kept(filter_logits(logits, top_k=-1, top_p=0.71, min_p=0.0)) == [0, 1, 2]
    assert kept(filter_logits(logits, top_k=-1, top_p=1.0, min_p=0.3)) == [0, 1, 2]  # >= 0.15


def test_penalties_follow_vllm_semantics():
    logits = torch.tensor([2.0, -2.0, 1.0, 0.5])
    params = SP(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    apply_penalties(logits, params, prompt=[0], output=[1, 2, 2])
    # repetition on prompt+output tokens (0, 1, 2): positive / 2, negative * 2;
    # then frequency * count and presence on output tokens only (1 once, 2 twice)
    assert logits.tolist() == pytest.approx([1.0, -4.0 - 0.5 - 0.25, 0.5 - 1.0 - 0.25, 0.5])


@pytest.mark.parametrize("penalty", [0.4, 1.5])
def test_repetition_penalty_matches_transformers(llm, penalty):
    # a random model rarely repeats, so a penalty < 1 (which favours seen tokens) is what changes its output
    model = tiny_model(ARCH)[1]
    prompt = prompts(seed=12)[4]
    with torch.inference_mode():
        ref = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=20,
            do_sample=False,
            repetition_penalty=penalty,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
    out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=20, repetition_penalty=penalty))
    assert out[0].outputs[0].token_ids == ref
    if penalty < 1.0:
        assert ref != greedy_ids(llm, prompt, 20)


@pytest.mark.parametrize("penalty", ["frequency_penalty", "presence_penalty"])
def test_frequency_and_presence_penalties_change_repeats(penalty):
    flat = LLM(tiny_model("llama_flat")[0], dtype="float32", device="cpu")
    prompt = prompts(seed=13)[1]
    unique = {}
    for value in (-2.0, 0.0, 2.0):
        out = flat.generate(prompt, SamplingParams(temperature=0.0, max_tokens=32, **{penalty: value}))
        unique[value] = len(set(out[0].outputs[0].token_ids))
    assert unique[-2.0] < unique[0.0] <= unique[2.0] == 32
    assert_engine_clean(flat)


def test_logit_bias_matches_transformers_sequence_bias(llm):
    """OpenAI's logit_bias against transformers' SequenceBiasLogitsProcessor (generate's sequence_bias,
    one-token sequences): a small bias on the 3rd and 5th greedy tokens and a ban on the 1st change the
    greedy output the same way; the logprobs returned stay the raw model's (vLLM's)."""
    model = tiny_model(ARCH)[1]
    prompt = prompts(seed=16)[2]
    plain = greedy_ids(llm, prompt, 20)
    bias = {plain[2]: 4.0, plain[4]: 2.5, plain[0]: -100.0}
    with torch.inference_mode():
        ref = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=20,
            do_sample=False,
            sequence_bias={(token,): value for token, value in bias.items()},
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
    params = SamplingParams(temperature=0.0, max_tokens=20, logit_bias=bias, logprobs=0)
    out = llm.generate(prompt, params)[0].outputs[0]
    assert out.token_ids == ref and ref != plain and ref[0] != plain[0]
    with torch.inference_mode():
        raw = model(torch.tensor([prompt])).logits[0, -1].log_softmax(-1)
    first = out.token_ids[0]
    assert out.logprobs[0][first].logprob == pytest.approx(float(raw[first]), abs=1e-4)


def test_logit_bias_out_of_range_is_refused_before_the_engine_sees_it(llm):
    vocab = llm.llm_engine.runner.model.args.vocab_size
    with pytest.raises(ValueError, match=f"logit_bias token id {vocab} is out of vocabulary"):
        llm.generate([1, 2, 3], SamplingParams(max_tokens=2, logit_bias={vocab: 1.0}))
    for bad in ({-1: 1.0}, {5: 101.0}, {5: float("nan")}, {5: True}):
        with pytest.raises(ValueError, match="logit_bias must map"):
            SamplingParams(logit_bias=bad)
    assert_engine_clean(llm)


def test_stop_string_across_token_boundaries_is_excluded(llm):
    prompt = prompts(seed=14)[3]
    full = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=24))[0].outputs[0]
    tokenizer = llm.tokenizer
    # a stop string that starts inside one token's text and ends inside the next one's
    start = len(tokenizer.decode(full.token_ids[:5])) - 1
    stop = full.text[start : start + 3]
    assert len(tokenizer.decode(full.token_ids[:5])) < start + 3  # really spans two tokens
    out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=24, stop=["zzzz-never", stop]))
    completion = out[0].outputs[0]
    assert completion.finish_reason == "stop" and completion.stop_reason == stop
    assert completion.text == full.text[: full.text.find(stop)]
    assert completion.token_ids == full.token_ids[: len(completion.token_ids)]


def test_stop_token_ids_and_ignore_eos(llm):
    prompt = prompts(seed=15)[2]
    full = greedy_ids(llm, prompt, 24)
    target = full[6]
    out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[target]))
    completion = out[0].outputs[0]
    assert completion.token_ids == full[: full.index(target) + 1]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", target)

    engine = llm.llm_engine
    saved = engine.eos_token_ids
    engine.eos_token_ids = [target]  # pretend the model's eos is this token
    try:
        stopped = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=24))[0].outputs[0]
        ignored = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    finally:
        engine.eos_token_ids = saved
    assert stopped.token_ids == full[: full.index(target) + 1]
    assert (stopped.finish_reason, stopped.stop_reason) == ("stop", None)
    assert ignored[0].outputs[0].token_ids == full
    assert ignored[0].outputs[0].finish_reason == "length"


def test_logprobs_match_transformers_scores(llm):
    model = tiny_model(ARCH)[1]
    prompt = prompts(seed=16)[3]
    with torch.inference_mode():
        ref = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=8,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=8, logprobs=3))[0].outputs[0]
    assert len(out.logprobs) == 8
    for step, (token_id, entry) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
        ref_lp = ref.logits[step][0].float().log_softmax(-1)
        top = torch.topk(ref_lp, 3)
        assert set(entry) == set(top.indices.tolist())
        assert entry[token_id].rank == 1
        for tid, value in zip(top.indices.tolist(), top.values.tolist(), strict=True):
            assert entry[tid].logprob == pytest.approx(value, abs=1e-4)
        assert entry[token_id].decoded_token == llm.tokenizer.decode([token_id])


def test_n_completions_and_max_tokens_none(llm):
    prompt = prompts(seed=17)[1]
    out = llm.generate(prompt, SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=10))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert all(len(c.token_ids) == 10 for c in out.outputs)
    assert len({tuple(c.token_ids) for c in out.outputs}) == 3
    long = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True))[0]
    assert len(prompt) + len(long.outputs[0].token_ids) == llm.max_model_len
    assert long.outputs[0].finish_reason == "length"


class SlowTokenizer:
    """The model's tokenizer without its Rust backend (as a slow, Python-only tokenizer looks)."""

    def __init__(self, tokenizer) -> None:
        self.decode = tokenizer.decode


@pytest.mark.parametrize("fast", [True, False], ids=["decode_stream", "window_decode"])
def test_incremental_detokenizer_never_splits_multibyte_characters(llm, fast):
    tokenizer = llm.tokenizer
    text = "naïve café — 世界你好 🎉🚀 Ünïcödé ✓"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > len(text.split())  # multi-byte characters span several byte tokens
    detok = IncrementalDetokenizer(tokenizer if fast else SlowTokenizer(tokenizer))
    assert (detok.stream is not None) == fast
    deltas = [detok.add_token(i) for i in ids]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) + detok.flush() == text == detok.text
    assert any(d == "" for d in deltas)  # some tokens had to wait for the rest of their character


@pytest.mark.parametrize("fast", [True, False], ids=["decode_stream", "window_decode"])
def test_detokenizer_flush_emits_an_incomplete_last_character(llm, fast):
    """A sequence cut inside a character (max_tokens, say): its bytes are held back until flush() emits
    them as decoding all the tokens does (U+FFFD)."""
    tokenizer = llm.tokenizer
    ids = tokenizer.encode("ok 🎉", add_special_tokens=False)
    cut = next(n for n in range(1, len(ids)) if tokenizer.decode(ids[:n]).endswith("\ufffd"))
    detok = IncrementalDetokenizer(tokenizer if fast else SlowTokenizer(tokenizer))
    deltas = [detok.add_token(i) for i in ids[:cut]]
    assert "".join(deltas) == "ok"
    assert detok.flush() == " \ufffd" and detok.text == tokenizer.decode(ids[:cut])
    assert detok.flush() == ""


def test_a_tokenizer_that_tidies_spaces_keeps_the_window_decode(llm, monkeypatch):
    """transformers' decode() with clean_up_tokenization_spaces may tidy " ." into "." (a WordPiece
    tokenizer's; transformers leaves a BPE one's alone), which DecodeStream never does: such a tokenizer
    keeps the window decode, so the streamed text is whatever decode() gives."""
    tokenizer = llm.tokenizer
    monkeypatch.setattr(tokenizer, "clean_up_tokenization_spaces", True)
    ids = tokenizer.encode("Hello , world . Done !", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    assert detok.stream is None
    text = "".join(detok.add_token(i) for i in ids) + detok.flush()
    assert text == tokenizer.decode(ids) and text.startswith("Hello")
