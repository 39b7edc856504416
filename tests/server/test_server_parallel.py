"""n, batched prompts, echo with logprobs and prompt_logprobs on the OpenAI server, driven by the real
`openai` client over HTTP: a tiny random fp32 llama, whose logprobs are checked against transformers."""

from __future__ import annotations

import itertools

import httpx
import openai
import pytest
import torch

from backend.server import build_app
from backend.server.fairness import ClientLine
from tests.engine_utils import prompts, tiny_model
from tests.server_utils import RunningServer, start_engine, wait_until

pytestmark = pytest.mark.usefixtures("one_torch_thread", "no_leaked_blocks")
MODEL = "tiny"
TOLERANCE = 1e-4


def start_fp32_server(**app_options) -> tuple:
    """(engine, server): the tiny random llama in fp32 (8 sequences, 256 KV blocks, 512 tokens)."""
    engine = start_engine(
        tiny_model("llama")[0], dtype="float32", max_num_seqs=8, num_kv_blocks=256, max_model_len=512
    )
    return engine, RunningServer(build_app(lambda: engine, served_model_name=MODEL, **app_options))


@pytest.fixture(scope="module")
def served():
    engine, server = start_fp32_server()
    yield engine, server
    server.stop()
    engine.shutdown()


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=f"{served[1].url}/v1", api_key="unused", max_retries=0)


def reference(prompt: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return tiny_model("llama")[1](torch.tensor([prompt])).logits[0].float().log_softmax(-1)


def sampled() -> dict:
    return {
        "model": MODEL,
        "temperature": 1.0,
        "seed": 5,
        "max_tokens": 8,
        "extra_body": {"ignore_eos": True},
    }


def streamed_texts(stream) -> dict[int, str]:
    texts: dict[int, str] = {}
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.text or "")
    return texts


def test_n_completions_streamed_and_not_and_each_equal_its_seed_alone(client):
    prompt = prompts((21,), seed=30)[0]
    whole = client.completions.create(prompt=prompt, n=3, **sampled())
    assert [c.index for c in whole.choices] == [0, 1, 2]
    texts = [c.text for c in whole.choices]
    assert len(set(texts)) == 3
    assert whole.usage.prompt_tokens == 21 and whole.usage.completion_tokens == 3 * 8
    assert streamed_texts(client.completions.create(prompt=prompt, n=3, stream=True, **sampled())) == dict(
        enumerate(texts)
    )
    for i, text in enumerate(texts):  # sample i is vLLM v1's child request with seed + i
        alone = client.completions.create(prompt=prompt, **sampled() | {"seed": 5 + i})
        assert alone.choices[0].text == text


def test_n_chat_choices_streamed_and_not(client):
    messages = [{"role": "user", "content": "Count with me"}]
    body = dict(model=MODEL, messages=messages, n=2, temperature=1.0, seed=9, max_tokens=6)
    body |= dict(extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**body)
    assert [c.index for c in whole.choices] == [0, 1]
    assert whole.usage.completion_tokens == 2 * 6
    assert whole.choices[0].message.content != whole.choices[1].message.content
    streamed: dict[int, str] = {}
    roles = set()
    for chunk in client.chat.completions.create(**body, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + (choice.delta.content or "")
            if choice.delta.role:
                roles.add(choice.index)
    assert roles == {0, 1}
    assert streamed == {c.index: c.message.content for c in whole.choices}


@pytest.mark.parametrize(
    "batch",
    [["The first prompt", "Another, longer prompt than the first", "3"], prompts((9, 30, 1), seed=31)],
    ids=["strings", "token-ids"],
)
def test_batched_prompts_one_choice_per_prompt_and_sample(client, batch):
    whole = client.completions.create(prompt=batch, n=2, **sampled())
    assert [c.index for c in whole.choices] == list(range(6))  # prompt index * n + sample index
    for p, prompt in enumerate(batch):
        alone = client.completions.create(prompt=prompt, n=2, **sampled())
        assert [c.text for c in whole.choices[2 * p : 2 * p + 2]] == [c.text for c in alone.choices]
    lengths = [len(served_tokenizer().encode(p)) if isinstance(p, str) else len(p) for p in batch]
    assert whole.usage.prompt_tokens == sum(lengths)
    assert whole.usage.completion_tokens == 6 * 8
    stream = client.completions.create(
        prompt=batch, n=2, stream=True, stream_options={"include_usage": True}, **sampled()
    )
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 6 * 8 and chunks[-1].usage.prompt_tokens == sum(lengths)
    texts: dict[int, str] = {}
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert texts == {c.index: c.text for c in whole.choices}


def served_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model("llama")[0])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_echo_with_logprobs_matches_transformers(client, stream):
    prompt = prompts((13,), seed=32)[0]
    body = dict(model=MODEL, prompt=prompt, echo=True, logprobs=2, max_tokens=3, temperature=0.0)
    if stream:
        chunks = list(client.completions.create(**body, stream=True))
        logprobs = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        text = ""
        for chunk in chunks:
            text += chunk.choices[0].text
            for key in logprobs:
                logprobs[key] += getattr(chunk.choices[0].logprobs, key)
    else:
        choice = client.completions.create(**body).choices[0]
        text, logprobs = choice.text, choice.logprobs.model_dump()
    tokenizer = served_tokenizer()
    assert text.startswith(tokenizer.decode(prompt)) and len(logprobs["tokens"]) == 13 + 3
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    ref = reference(prompt)
    for position, token_id in enumerate(prompt[1:]):
        assert logprobs["token_logprobs"][position + 1] == pytest.approx(
            float(ref[position, token_id]), abs=TOLERANCE
        )
        top = logprobs["top_logprobs"][position + 1]
        best = torch.topk(ref[position], 2)
        assert sorted(top.values(), reverse=True) == pytest.approx(best.values.tolist(), abs=TOLERANCE)
    offsets, tokens = logprobs["text_offset"], logprobs["tokens"]
    assert offsets[0] == 0
    assert [b - a for a, b in itertools.pairwise(offsets)] == [len(token) for token in tokens[:-1]]


def test_echo_with_max_tokens_zero_returns_only_the_prompt(client):
    """lm-evaluation-harness's loglikelihood request shape: echo, logprobs, max_tokens=0."""
    prompt = prompts((10,), seed=33)[0]
    whole = client.completions.create(model=MODEL, prompt=prompt, echo=True, logprobs=1, max_tokens=0)
    (choice,) = whole.choices
    assert choice.text == served_tokenizer().decode(prompt) and choice.finish_reason == "length"
    assert len(choice.logprobs.tokens) == 10 and choice.logprobs.token_logprobs[0] is None
    ref = reference(prompt)
    expected = [float(ref[i, t]) for i, t in enumerate(prompt[1:])]
    assert choice.logprobs.token_logprobs[1:] == pytest.approx(expected, abs=TOLERANCE)
    assert whole.usage.completion_tokens == 0 and whole.usage.prompt_tokens == 10
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, echo=True, max_tokens=0, stream=True))
    assert [c.choices[0].text for c in chunks] == [choice.text]


def test_prompt_logprobs_extra_body_on_both_endpoints(client):
    prompt = prompts((8,), seed=34)[0]
    whole = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=1, extra_body={"prompt_logprobs": 3}
    )
    entries = whole.choices[0].model_extra["prompt_logprobs"]
    ref = reference(prompt)
    assert len(entries) == 8 and entries[0] is None
    for position, (token_id, entry) in enumerate(zip(prompt[1:], entries[1:], strict=True)):
        assert str(token_id) in entry and 3 <= len(entry) <= 4
        assert entry[str(token_id)]["logprob"] == pytest.approx(float(ref[position, token_id]), abs=TOLERANCE)
        assert {"logprob", "rank", "decoded_token"} == set(entry[str(token_id)])
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=1,
        extra_body={"prompt_logprobs": 0},
    )
    chat_entries = chat.model_extra["prompt_logprobs"]
    assert chat_entries[0] is None and all(len(e) == 1 for e in chat_entries[1:])
    assert len(chat_entries) == chat.usage.prompt_tokens


@pytest.mark.parametrize(
    ("path", "body", "words"),
    [
        ("completions", {"prompt": "hi", "n": 0}, ["n", "greater than or equal to 1"]),
        ("completions", {"prompt": "hi", "n": 129}, ["n", "less than or equal to 128"]),
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "echo": True},
            ["echo", "/v1/completions"],
        ),
        (
            "completions",
            {"prompt": "hi", "prompt_logprobs": 2, "stream": True},
            ["prompt_logprobs", "stream"],
        ),
        (
            "completions",
            {"prompt": "hi", "prompt_logprobs": 21},
            ["prompt_logprobs", "less than or equal to 20"],
        ),
        ("completions", {"prompt": "hi", "max_tokens": 0}, ["max_tokens=0", "echo"]),
        ("completions", {"prompt": ["hi", ""]}, ["prompt", "non-empty"]),
        ("completions", {"prompt": [[5, 6], [5] * 600]}, ["512", "600"]),
        ("completions", {"prompt": [[1, 2], [3, 10**7]]}, ["[0, "]),
    ],
)
def test_bad_requests_get_openai_errors_and_admit_nothing(served, path, body, words):
    resp = httpx.post(f"{served[1].url}/v1/{path}", json={"model": MODEL, **body}, timeout=30)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    for word in words:
        assert word in error["message"]
    assert not served[0].engine.requests


@pytest.mark.parametrize("batch", [1, 3], ids=["one-prompt", "three-prompts"])
def test_dropping_a_stream_of_n_samples_frees_every_block(served, client, batch):
    engine = served[0]
    prompt = prompts((40,), seed=35)[0]
    stream = client.completions.create(
        model=MODEL,
        prompt=[prompt] * batch,
        n=4,
        max_tokens=400,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    for _, _chunk in zip(range(3), stream, strict=False):
        pass
    assert engine.stats().shared_blocks  # the samples share their prompt's blocks while they run
    stream.close()
    wait_until(lambda: engine.stats().num_kv_blocks_used == 0, what="the abort to free every block")


def test_public_limits_hold_for_the_batch_as_a_whole():
    # a client share of 3 (above the queue's 2) lets the engine's own queue limit refuse the batch of 3
    engine, server = start_fp32_server(max_tokens_limit=20, max_waiting_requests=2, clients=ClientLine(3))
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    try:
        with pytest.raises(openai.BadRequestError, match="at most 5 for each of 4 choices"):
            client.completions.create(model=MODEL, prompt=["a", "b"], n=2, max_tokens=8)
        capped = client.completions.create(
            model=MODEL, prompt=["a", "b"], n=2, max_tokens=None, extra_body={"ignore_eos": True}
        )
        assert [len(served_tokenizer().encode(c.text)) > 0 for c in capped.choices] == [True] * 4
        assert capped.usage.completion_tokens == 4 * 5
        with pytest.raises(openai.BadRequestError, match="at most 20 choices"):
            client.completions.create(model=MODEL, prompt="a", n=21, max_tokens=None)
        with pytest.raises(openai.BadRequestError, match="waiting-queue limit of 2"):
            client.completions.create(model=MODEL, prompt=["a", "b", "c"], max_tokens=1)
        assert not engine.engine.requests
    finally:
        server.stop()
        engine.shutdown()
