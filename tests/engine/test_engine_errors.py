"""Bad input gets a clear, specific error: invalid SamplingParams, prompts, paths and architectures."""

from __future__ import annotations

import json

import pytest

from backend.engine import LLM, SamplingParams
from tests.engine_utils import (
    assert_engine_clean,
    tiny_model,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize(
    ("kwargs", "allowed"),
    [
        (dict(max_tokens=0), ">= 1"),
        (dict(temperature=-0.1), ">= 0"),
        (dict(top_p=0.0), "(0, 1]"),
        (dict(top_p=1.5), "(0, 1]"),
        (dict(top_k=-2), "-1"),
        (dict(min_p=2.0), "[0, 1]"),
        (dict(n=0), ">= 1"),
        (dict(presence_penalty=3.0), "[-2, 2]"),
        (dict(repetition_penalty=0.0), "> 0"),
        (dict(logprobs=50), "[0, 20]"),
    ],
)
def test_invalid_sampling_params_name_the_allowed_range(kwargs, allowed):
    name = next(iter(kwargs))
    with pytest.raises(ValueError) as info:
        SamplingParams(**kwargs)
    assert name in str(info.value) and allowed in str(info.value)


def test_invalid_prompts_leave_the_engine_clean():
    llm = LLM(tiny_model("llama")[0], dtype="float32", device="cpu", max_model_len=64)
    with pytest.raises(ValueError, match=r"100 tokens.*max_model_len is 64"):
        llm.generate([7] * 100, SamplingParams())
    with pytest.raises(ValueError, match="empty"):
        llm.generate("", SamplingParams())
    with pytest.raises(ValueError, match="empty"):
        llm.generate([[5, 6], []], SamplingParams())  # nothing of the batch was started
    assert_engine_clean(llm)
    assert llm.generate([5, 6], SamplingParams(max_tokens=3))[0].outputs[0].finish_reason == "length"
    with pytest.raises(ValueError, match="max_model_len=9999 exceeds the model's limit of 512"):
        LLM(tiny_model("llama")[0], dtype="float32", max_model_len=9999)
    with pytest.raises(ValueError, match="only 2"):
        LLM(tiny_model("llama")[0], dtype="float32", max_model_len=256, num_kv_blocks=2)


def test_text_whose_tokens_pass_the_embedding_is_refused(tmp_path):
    """A tokenizer that knows more tokens than the model embeds (here 49152 against 1000): a text prompt
    that encodes past the table is refused with the allowed range before any step (the captured decode
    step's native embedding reads rows by id), and the engine serves the next request."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder, _ = tiny_model("llama")
    sizes = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
    config = LlamaConfig(vocab_size=1000, num_hidden_layers=1, max_position_embeddings=128, **sizes)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(folder).save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), dtype="float32", device="cpu")
    with pytest.raises(ValueError, match=r"integers in \[0, 999\]"):
        llm.generate("Paris is the capital of France", SamplingParams(max_tokens=2))
    assert_engine_clean(llm)
    assert len(llm.generate([5, 6], SamplingParams(max_tokens=3))[0].outputs[0].token_ids) == 3


def test_unknown_model_path_is_named(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        LLM(str(missing))
    with pytest.raises(FileNotFoundError, match=r"nothing\.gguf"):
        LLM(str(tmp_path / "nothing.gguf"))


def test_hub_id_offline_gives_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match="Hugging Face Hub"):
        LLM("no-such-org/no-such-model-xyz")


def test_unsupported_architecture_lists_the_supported_ones(tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=32, n_head=2, architectures=["GPT2LMHeadModel"]).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["GPT2LMHeadModel"]
    with pytest.raises(ValueError) as info:
        LLM(str(tmp_path))
    message = str(info.value)
    assert "GPT2LMHeadModel" in message
    for arch in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        assert arch in message
