"""Untrusted model descriptions (backend/model_limits.py): an oversized or out-of-range config.json, and
GGUF files whose counts or lengths exceed the file, are refused with a message naming the field, before
anything is read or allocated from them, by `app.py serve`, the planner and the GGUF reader. The owner's
HF_TOKEN goes with the owner's Hub reads only (the Hub is unreachable here: its calls are mocked)."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType

from backend.model_limits import (
    MAX_CONFIG_BYTES,
    UntrustedModelError,
    check_config,
    check_gguf_header,
    check_gguf_metadata,
)
from backend.planner import load_model_spec, sources
from tests.common_utils import ROOT
from tests.engine_utils import tiny_model
from tests.gguf_utils import write_tiny_gguf


def hostile_folder(tmp_path: Path, **fields) -> Path:
    """The tiny Llama's folder with its config.json changed."""
    folder = tmp_path / "hostile"
    shutil.copytree(tiny_model("llama")[0], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))
    return folder


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_hidden_layers", 10**12),
        ("vocab_size", -1),
        ("max_position_embeddings", 2**40),
        ("hidden_size", "64"),
    ],
)
def test_serve_refuses_a_config_out_of_range_before_loading(tmp_path, field, value):
    folder = hostile_folder(tmp_path, **{field: value})
    command = [sys.executable, "app.py", "serve", "--model", str(folder), "--port", "0"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert f"config.{field} = {str(value)[:40]} is outside what any model has" in done.stdout + done.stderr


def test_an_oversized_config_is_not_read(tmp_path):
    folder = hostile_folder(tmp_path)
    (folder / "config.json").write_text(json.dumps({"pad": "x" * MAX_CONFIG_BYTES}))
    with pytest.raises(UntrustedModelError, match="a model config may be at most"):
        load_model_spec(str(folder))


def test_the_planner_checks_every_config_it_builds_a_spec_from(tmp_path):
    with pytest.raises(UntrustedModelError, match="num_attention_heads"):
        load_model_spec(str(hostile_folder(tmp_path, num_attention_heads=0)))
    with pytest.raises(UntrustedModelError, match=r"text_config.num_hidden_layers"):
        check_config({"text_config": {"num_hidden_layers": 10**9}})
    check_config({"num_hidden_layers": 126, "hidden_size": 16384, "vocab_size": 262144})  # real extremes


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return write_tiny_gguf(path, {}, GGMLQuantizationType.Q8_0)


def patched(source: Path, target: Path, offset: int, value: int) -> Path:
    data = bytearray(source.read_bytes())
    data[offset : offset + 8] = struct.pack("<Q", value)
    target.write_bytes(bytes(data))
    return target


def test_a_gguf_header_is_walked_before_it_is_parsed(small_gguf, tmp_path):
    check_gguf_header(small_gguf)  # a real file passes
    with pytest.raises(UntrustedModelError, match="tensor count"):
        check_gguf_header(patched(small_gguf, tmp_path / "tensors.gguf", 8, 2**40))
    with pytest.raises(UntrustedModelError, match="runs past the end of the file"):
        check_gguf_header(patched(small_gguf, tmp_path / "string.gguf", 24, 2**62))  # the first key's length
    with pytest.raises(UntrustedModelError, match="not a GGUF file"):
        check_gguf_header(_write(tmp_path / "x.gguf", b"GGML" + bytes(20)))


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_the_planner_and_engine_refuse_a_gguf_with_a_lying_header(small_gguf, tmp_path):
    lying = patched(small_gguf, tmp_path / "lying.gguf", 24, 2**62)
    with pytest.raises(UntrustedModelError, match="runs past the end"):
        load_model_spec(str(lying))
    from backend.engine import gguf_cache

    with pytest.raises(UntrustedModelError, match="runs past the end"):
        gguf_cache.tensors(str(lying))


def test_gguf_metadata_fields_are_range_checked():
    check_gguf_metadata(
        {"general.architecture": "llama", "llama.block_count": 30, "llama.context_length": 8192}
    )
    with pytest.raises(UntrustedModelError, match="num_hidden_layers = 1000000000"):
        check_gguf_metadata({"general.architecture": "llama", "llama.block_count": 10**9})
    with pytest.raises(UntrustedModelError, match="num_local_experts"):
        check_gguf_metadata({"general.architecture": "qwen3moe", "qwen3moe.expert_count": 10**6})


class MockHub:
    """Stands in for the Hub (unreachable here): records the token each call was given."""

    def __init__(self, monkeypatch, config: dict) -> None:
        import huggingface_hub

        self.tokens: list[object] = []
        self.config = config
        monkeypatch.setattr(sources, "hub_unreachable_reason", lambda: None)
        monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", self.metadata)
        monkeypatch.setattr(huggingface_hub, "hf_hub_download", self.download)
        monkeypatch.setattr(huggingface_hub, "get_safetensors_metadata", self.safetensors)
        self.folder: Path | None = None

    def metadata(self, url, token=None):
        self.tokens.append(token)
        return type("Meta", (), {"size": len(json.dumps(self.config))})()

    def download(self, repo_id, filename, revision=None, token=None):
        self.tokens.append(token)
        assert self.folder is not None
        path = self.folder / filename
        path.write_text(json.dumps(self.config))
        return str(path)

    def safetensors(self, repo_id, revision=None, token=None):
        self.tokens.append(token)
        return type("Metadata", (), {"files_metadata": {}})()


def test_a_visitors_hub_pick_is_read_without_the_owners_token_mock_hub(monkeypatch, tmp_path):
    config = json.loads((Path(tiny_model("llama")[0]) / "config.json").read_text())
    hub = MockHub(monkeypatch, config)
    hub.folder = tmp_path
    sources._hub_spec.cache_clear()
    load_model_spec("owner/model")  # the owner: huggingface_hub's own choice (HF_TOKEN)
    with sources.anonymous_hub():
        load_model_spec("owner/model")  # a visitor: no token, and not the owner's cached spec
    assert hub.tokens == [None, None, None, False, False, False]
    assert sources._hub_spec.cache_info().maxsize == sources.HUB_SPEC_CACHE
    hub.config = {**config, "pad": "x" * MAX_CONFIG_BYTES}
    with sources.anonymous_hub(), pytest.raises(UntrustedModelError, match="may be at most"):
        load_model_spec("someone/huge-config")
    sources._hub_spec.cache_clear()
