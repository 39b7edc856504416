"""lm-evaluation-harness (`lm-eval` from PyPI) against `python app.py serve`, compared with the same
harness's `--model hf` on the same weights: a tiny random Llama in float32 with the default model's
real tokenizer and chat template (tests/engine_utils.py), both sides in fp32.

- playground_mc (multiple choice, loglikelihood) through `local-completions`: echo + prompt logprobs,
  token ids as prompts, and the server's own tokenizer (the harness finds /tokenizer_info and /tokenize
  and uses them). Every choice's loglikelihood within 1e-3 of transformers', the same greedy flags, the
  same per-item and aggregate accuracy.
- playground_gen (generate_until, greedy, stops at a newline) through `local-chat-completions` with the
  chat template: the same text per item and the same exact_match.

Offline: the tasks are local jsonl files (tests/data/lm_eval); nothing reaches the Hub.
"""

from __future__ import annotations

import pytest

from tests.engine_utils import tiny_model
from tests.lm_eval_utils import loglikelihoods, run_harness
from tests.server_utils import ServeProcess

pytestmark = pytest.mark.slow
SERVED = "tiny"
LOGLIKELIHOOD_TOLERANCE = 1e-3  # issue 31: per item, against transformers in fp32


@pytest.fixture(scope="module")
def model_dir() -> str:
    return tiny_model("llama")[0]


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("lm-eval-serve") / "serve.log"
    args = ("--model", model_dir, "--dtype", "float32", "--served-model-name", SERVED)
    proc = ServeProcess(log, *args, "--disable-uvicorn-access-log")
    yield proc
    proc.stop()


def hf_args(model_dir: str) -> str:
    return f"pretrained={model_dir},dtype=float32"


def api_args(server: ServeProcess, endpoint: str) -> str:
    return f"model={SERVED},base_url={server.url}/v1/{endpoint},num_concurrent=1,max_retries=1"


def test_multiple_choice_loglikelihoods_match_transformers(model_dir, server, tmp_path):
    reference = run_harness(tmp_path / "hf", "playground_mc", "hf", hf_args(model_dir), "--device", "cpu")
    served = run_harness(
        tmp_path / "api", "playground_mc", "local-completions", api_args(server, "completions")
    )
    assert served.samples.keys() == reference.samples.keys() and len(reference.samples) == 16
    for doc_id, expected in reference.samples.items():
        got = served.samples[doc_id]
        assert got["arguments"] == expected["arguments"]  # the same context and continuations
        for (ll, greedy), (ref_ll, ref_greedy) in zip(
            loglikelihoods(got), loglikelihoods(expected), strict=True
        ):
            assert abs(ll - ref_ll) <= LOGLIKELIHOOD_TOLERANCE, (doc_id, ll, ref_ll)
            assert greedy == ref_greedy, doc_id
        assert (got["acc"], got["acc_norm"]) == (expected["acc"], expected["acc_norm"]), doc_id
    assert served.metrics == reference.metrics


def test_chat_generation_matches_transformers(model_dir, server, tmp_path):
    chat = "--apply_chat_template"
    reference = run_harness(
        tmp_path / "hf", "playground_gen", "hf", hf_args(model_dir), "--device", "cpu", chat
    )
    served = run_harness(
        tmp_path / "api",
        "playground_gen",
        "local-chat-completions",
        api_args(server, "chat/completions"),
        chat,
    )
    assert served.samples.keys() == reference.samples.keys() and len(reference.samples) == 10
    for doc_id, expected in reference.samples.items():
        got = served.samples[doc_id]
        assert got["resps"] == expected["resps"] and got["resps"][0][0], doc_id
        assert got["exact_match"] == expected["exact_match"], doc_id
    assert served.metrics == reference.metrics
