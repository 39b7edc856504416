"""vLLM's /tokenize, /detokenize, /tokenizer_info and /version on a real server over a tiny random Llama
that carries the default model's real tokenizer and chat template: ids equal to the tokenizer's own,
the chat path's token counts, the refusals, and lm-evaluation-harness's remote tokenizer as a client."""

from __future__ import annotations

import tomllib

import httpx
import pytest
from lm_eval.utils import RemoteTokenizer, check_remote_tokenizer_support

from tests.common_utils import ROOT

TEXTS = [
    "Hello world",
    "  leading spaces, trailing newline\n",
    "Unicode: café, naïve, 東京, emoji 🙂🚀",
    "code:\n    def f(x):\n        return x ** 2\n",
    "<|im_start|>user\nspecial tokens written as text<|im_end|>",
]
CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3 + 3?"},
]


def post(served, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{served[1].url}{path}", json=body, timeout=60)


@pytest.mark.parametrize("text", TEXTS)
def test_tokenize_and_detokenize_round_trip_equal_the_tokenizer(served, text):
    tokenizer = served[0].tokenizer
    for special in (True, False):
        out = post(served, "/tokenize", {"model": "tiny", "prompt": text, "add_special_tokens": special})
        expected = tokenizer(text, add_special_tokens=special)["input_ids"]
        assert out.status_code == 200, out.text
        body = out.json()
        assert body == {"count": len(expected), "max_model_len": 512, "tokens": expected, "token_strs": None}
        back = post(served, "/detokenize", {"model": "tiny", "tokens": expected}).json()
        assert back == {"prompt": tokenizer.decode(expected)}
        assert back["prompt"] == text
    strs = post(served, "/tokenize", {"prompt": text, "return_token_strs": True}).json()["token_strs"]
    assert strs == tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"])


def test_chat_tokenize_is_the_chat_template_and_what_chat_completions_counts(served):
    engine, server = served
    tokenizer = engine.tokenizer
    out = post(served, "/tokenize", {"model": "tiny", "messages": CHAT}).json()
    expected = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert out["tokens"] == tokenizer(expected, add_special_tokens=False)["input_ids"]
    assert expected.endswith("<|im_start|>assistant\n")
    body = {"model": "tiny", "messages": CHAT, "max_tokens": 1}
    usage = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()["usage"]
    assert usage["prompt_tokens"] == out["count"]
    # vLLM's template switches: no generation prompt; the last (assistant) message left open
    bare = post(served, "/tokenize", {"messages": CHAT, "add_generation_prompt": False}).json()
    assert bare["tokens"] == out["tokens"][: bare["count"]] and bare["count"] < out["count"]
    prefill = [*CHAT, {"role": "assistant", "content": "The answer is"}]
    body = {"messages": prefill, "add_generation_prompt": False, "continue_final_message": True}
    opened = post(served, "/tokenize", body).json()
    assert tokenizer.decode(opened["tokens"]).endswith("<|im_start|>assistant\nThe answer is")


@pytest.mark.parametrize(
    ("path", "body", "needle"),
    [
        ("/tokenize", {"prompt": "hi", "messages": CHAT}, "either `prompt`"),
        ("/tokenize", {"model": "tiny"}, "either `prompt`"),
        ("/tokenize", {"messages": CHAT, "chat_template": "{{ 1 }}"}, "own chat template"),
        ("/tokenize", {"messages": CHAT, "continue_final_message": True}, "add_generation_prompt to false"),
        ("/tokenize", {"messages": CHAT, "chat_template_kwargs": {"tools": []}}, "may not set tools"),
        ("/tokenize", {"prompt": "x" * (511 * 81 + 1)}, "at most 41,391 are tokenized here"),
        ("/detokenize", {"tokens": [1, 49152]}, "token id 49152 is not in the vocabulary (0 to 49151)"),
        ("/detokenize", {"tokens": [-1]}, "token id -1"),
        ("/detokenize", {"tokens": [1] * 513}, "at most 512"),
    ],
)
def test_bad_requests_get_a_400_that_says_what_is_allowed(served, path, body, needle):
    resp = post(served, path, body)
    assert resp.status_code == 400, resp.text
    assert needle in resp.json()["error"]["message"]


def test_the_longest_text_that_can_fit_is_tokenized(served):
    # SmolLM2's longest token is 81 characters: 511 of them are the most a 512-token context can take as
    # input (one token is left for the output, as on /v1/completions)
    assert post(served, "/tokenize", {"prompt": " " * 511 * 81}).status_code == 200


def test_another_model_name_is_a_404(served):
    resp = post(served, "/tokenize", {"model": "gpt-4", "prompt": "hi"})
    assert resp.status_code == 404 and "serves `tiny`" in resp.json()["error"]["message"]


def test_version_is_the_projects(served):
    with (ROOT / "pyproject.toml").open("rb") as f:
        version = tomllib.load(f)["project"]["version"]
    assert httpx.get(f"{served[1].url}/version").json() == {"version": version}


def test_lm_eval_remote_tokenizer_reads_the_server(served):
    """lm-evaluation-harness picks its remote tokenizer when /tokenizer_info and /tokenize answer; its
    encode, decode, special tokens and chat template must be the model's own."""
    engine, server = served
    tokenizer = engine.tokenizer
    base_url = f"{server.url}/v1/completions"
    assert check_remote_tokenizer_support(base_url)
    remote = RemoteTokenizer(base_url)
    assert remote.eos_token == tokenizer.eos_token and remote.eos_token_id == tokenizer.eos_token_id
    for text in TEXTS:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert remote.encode(text) == ids and remote.decode(ids) == text
    rendered = remote.apply_chat_template(CHAT[:2], add_generation_prompt=True)
    assert rendered == tokenizer.apply_chat_template(CHAT[:2], tokenize=False, add_generation_prompt=True)
