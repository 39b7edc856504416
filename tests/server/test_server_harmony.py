"""`app.py serve` with a tiny random gpt-oss (tests/gpt_oss_utils.py: harmony's control tokens and gpt-oss's
chat template on the default tokenizer), driven by the real openai client: chat completions carry vLLM's
reasoning_content beside content, whole and streamed (n=2: each choice its own). A grammar over harmony's
special tokens (llguidance) makes the random model answer in harmony's shape; the same request on
/v1/completions with special tokens kept gives the raw text, which says independently what each field must
hold."""

from __future__ import annotations

import re

import pytest
from openai import OpenAI

from tests.gpt_oss_utils import tiny_gpt_oss
from tests.harmony_utils import HARMONY_GRAMMAR, harmony_tokenizer
from tests.server_utils import ServeProcess

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]
RAW = re.compile(
    r"<\|channel\|>analysis<\|message\|>(?P<reasoning>[a-z ]+)<\|end\|><\|start\|>assistant"
    r"<\|channel\|>final<\|message\|>(?P<content>[A-Z ]+)"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("harmony") / "serve.log"
    args = ("--model", tiny_gpt_oss(), "--num-kv-blocks", "128", "--max-model-len", "512")
    proc = ServeProcess(log, *args, "--served-model-name", "tiny-harmony")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def raw_answers(client, **sampling) -> list[re.Match]:
    """The same prompt through /v1/completions, special tokens kept: harmony as the model wrote it (one
    match per choice)."""
    tokenizer = harmony_tokenizer()
    text = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    extra = {"structured_outputs": {"grammar": HARMONY_GRAMMAR}, "skip_special_tokens": False}
    sampling = {"temperature": 0} | sampling
    raw = client.completions.create(
        model="tiny-harmony", prompt=ids, max_tokens=120, extra_body=extra, **sampling
    )
    found = [RAW.fullmatch(choice.text) for choice in sorted(raw.choices, key=lambda c: c.index)]
    assert all(found), [choice.text for choice in raw.choices]
    return found  # type: ignore[return-value]


def raw_answer(client) -> re.Match:
    return raw_answers(client)[0]


def test_the_answer_is_content_and_the_analysis_reasoning_content(client):
    expected = raw_answer(client)
    reply = client.chat.completions.create(
        model="tiny-harmony",
        messages=MESSAGES,
        max_tokens=120,
        temperature=0,
        extra_body={"structured_outputs": {"grammar": HARMONY_GRAMMAR}},
    )
    message = reply.choices[0].message
    assert message.content == expected["content"]
    assert message.reasoning_content == expected["reasoning"]  # type: ignore[attr-defined]
    assert reply.choices[0].finish_reason == "stop"


def test_streamed_deltas_carry_the_reasoning_first_then_the_answer(client):
    expected = raw_answer(client)
    stream = client.chat.completions.create(
        model="tiny-harmony",
        messages=MESSAGES,
        max_tokens=120,
        temperature=0,
        stream=True,
        extra_body={"structured_outputs": {"grammar": HARMONY_GRAMMAR}},
    )
    kinds, reasoning, content = [], "", ""
    for chunk in stream:
        delta = chunk.choices[0].delta
        piece = getattr(delta, "reasoning_content", None)
        if piece:
            kinds.append("reasoning")
            reasoning += piece
        if delta.content:
            kinds.append("content")
            content += delta.content
    assert (reasoning, content) == (expected["reasoning"], expected["content"])
    assert kinds == sorted(kinds, key=lambda kind: kind == "content") and len(set(kinds)) == 2
    # how many chunks the reasoning takes depends on how fast the client reads (the engine keeps only the
    # newest output for a slow reader); that deltas come token by token is test_harmony's ReasoningStream test


def test_a_reply_cut_inside_the_reasoning_has_no_content_yet(client):
    reply = client.chat.completions.create(
        model="tiny-harmony",
        messages=MESSAGES,
        max_tokens=5,
        temperature=0,
        extra_body={"structured_outputs": {"grammar": HARMONY_GRAMMAR}},
    )
    message, choice = reply.choices[0].message, reply.choices[0]
    assert choice.finish_reason == "length" and message.content is None
    assert re.fullmatch("[a-z ]+", message.reasoning_content)  # type: ignore[attr-defined]


def test_parallel_samples_each_split_their_own_channels(client):
    """n=2 sampled with a seed: each choice's reasoning and answer are its own (one parser per choice), whole
    and streamed, as the same seed's raw /v1/completions choices say."""
    sampling = {"n": 2, "temperature": 1.0, "seed": 7}
    expected = [(m["reasoning"], m["content"]) for m in raw_answers(client, **sampling)]
    assert expected[0] != expected[1]  # the check below could not tell the choices apart otherwise
    extra = {"structured_outputs": {"grammar": HARMONY_GRAMMAR}}
    reply = client.chat.completions.create(
        model="tiny-harmony", messages=MESSAGES, max_tokens=120, extra_body=extra, **sampling
    )
    whole = {c.index: (c.message.reasoning_content, c.message.content) for c in reply.choices}  # type: ignore[attr-defined]
    assert [whole[0], whole[1]] == expected
    stream = client.chat.completions.create(
        model="tiny-harmony", messages=MESSAGES, max_tokens=120, stream=True, extra_body=extra, **sampling
    )
    streamed = {0: ["", ""], 1: ["", ""]}
    for chunk in stream:
        for choice in chunk.choices:
            streamed[choice.index][0] += getattr(choice.delta, "reasoning_content", None) or ""
            streamed[choice.index][1] += choice.delta.content or ""
    assert [tuple(streamed[0]), tuple(streamed[1])] == expected
