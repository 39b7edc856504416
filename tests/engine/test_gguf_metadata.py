"""GGUF metadata from an untrusted file (backend/engine/gguf/metadata.py): counts outside any real model's
range, a file cut short and an unknown architecture are refused with a ValueError naming the key, before
anything is sized by them."""

from __future__ import annotations

import pytest
from gguf import GGUFWriter

from backend.engine.gguf.hf_config import config_dict
from backend.engine.gguf.metadata import MAX_LAYERS, read_metadata

GOOD = {"block_count": 2, "embedding_length": 64, "feed_forward_length": 128, "attention.head_count": 4}
GOOD |= {"context_length": 512, "vocab_size": 256}


def write(path, architecture: str = "llama", **overrides) -> str:
    writer = GGUFWriter(str(path), architecture)
    for key, value in (GOOD | overrides).items():
        writer.add_uint32(f"{architecture}.{key}", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def test_a_plausible_file_converts(tmp_path):
    config = config_dict(read_metadata(write(tmp_path / "ok.gguf")))
    assert (config["num_hidden_layers"], config["head_dim"], config["num_key_value_heads"]) == (2, 16, 4)


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("block_count", MAX_LAYERS + 1, "llama.block_count = 1025 is outside"),
        ("block_count", 0, "llama.block_count = 0 is outside"),
        ("attention.head_count", 5000, "llama.attention.head_count = 5000 is outside"),
        ("attention.head_count_kv", 8, "llama.attention.head_count_kv = 8 is outside"),  # more than heads
        ("vocab_size", 1 << 30, "llama.vocab_size"),
        ("context_length", 1 << 31, "llama.context_length"),
        ("expert_count", 100_000, "llama.expert_count"),
    ],
)
def test_counts_out_of_range_are_refused(tmp_path, key, value, says):
    with pytest.raises(ValueError, match=says):
        config_dict(read_metadata(write(tmp_path / "bad.gguf", **{key: value})))


def test_a_file_cut_short_is_refused(tmp_path):
    path = tmp_path / "cut.gguf"
    with open(write(tmp_path / "whole.gguf"), "rb") as whole:
        path.write_bytes(whole.read()[:60])
    with pytest.raises(ValueError, match=r"truncated file|not a readable GGUF file"):
        read_metadata(str(path))


def test_an_unknown_architecture_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"GGUF architecture 'rwkv7' is not supported; supported: .*gemma3"):
        config_dict(read_metadata(write(tmp_path / "rwkv.gguf", "rwkv7")))
