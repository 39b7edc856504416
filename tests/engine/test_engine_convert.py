"""`python -m backend.engine.convert`: a GGUF file as a dense safetensors folder that answers alike."""

from __future__ import annotations

import json

import pytest

from backend.default_model import packaged_gguf
from backend.engine.convert import convert_gguf, main
from backend.hf_reference import hf_chat_greedy, load_hf_model

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.mark.slow
def test_dense_folder_gives_the_gguf_greedy_tokens(default_dense_model, default_hf_model):
    names = sorted(p.name for p in default_dense_model.iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(names)
    config = json.loads((default_dense_model / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    dense = hf_chat_greedy(*load_hf_model(str(default_dense_model)), MESSAGES, max_new_tokens=12)
    from_gguf = hf_chat_greedy(*default_hf_model, MESSAGES, max_new_tokens=12)  # transformers on the GGUF
    assert dense == from_gguf
    assert "Paris" in dense


def test_bad_inputs_are_refused_with_the_reason(tmp_path, default_dense_model):
    with pytest.raises(ValueError, match=r"is not a \.gguf file"):
        convert_gguf(default_dense_model / "config.json", tmp_path / "out")
    with pytest.raises(ValueError, match="dtype must be one of"):
        convert_gguf(packaged_gguf(), tmp_path / "out", dtype="int3")
    with pytest.raises(FileExistsError, match="not empty"):
        convert_gguf(packaged_gguf(), default_dense_model)
    assert main(["--gguf", str(tmp_path / "missing.gguf"), "--out", str(tmp_path / "o")]) == 2
