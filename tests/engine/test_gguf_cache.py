"""The GGUF conversion cache (backend/engine/gguf_cache.py): a cached load reads the same config, tokenizer
and tensors as a parse of the file, and the engine generates the same tokens from it. Real GGUF files
written with gguf-py (tests/gguf_utils.py), the cache in a temporary XDG_CACHE_HOME."""

from __future__ import annotations

import numpy as np
import pytest

from backend.engine import gguf_cache
from backend.model_names import served_model_name
from tests.gguf_utils import Q, write_tiny_gguf

PROMPT = [{"role": "user", "content": "Hello there, ünïcödé 123?"}]


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> str:
    """Named as llama.cpp names files: the model's name, then its type."""
    types = {"attn_q": Q.Q4_1, "ffn_down": Q.Q6_K, "attn_v": Q.Q4_K}
    path = tmp_path_factory.mktemp("gguf") / "Tiny-Llama-3.1-8B-Instruct-Q4_1.gguf"
    return str(write_tiny_gguf(path, types, embedding=Q.F16))


@pytest.fixture()
def gguf(gguf_file, tmp_path, monkeypatch) -> str:
    """The file, with an empty cache of its own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return gguf_file


def encoded(tokenizer) -> list[int]:
    text = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_cached_config_tokenizer_and_tensors_match_a_parse_of_the_file(gguf):
    config, tokenizer, cached = gguf_cache.config_and_tokenizer(gguf)
    arch, parsed = gguf_cache.tensors(gguf)
    assert not cached and gguf_cache.cache_dir().is_dir()
    config2, tokenizer2, cached2 = gguf_cache.config_and_tokenizer(gguf)
    arch2, mapped = gguf_cache.tensors(gguf)
    assert cached2 and arch == arch2 == "llama"
    assert config2.to_dict() == config.to_dict()
    assert encoded(tokenizer2) == encoded(tokenizer) and len(encoded(tokenizer)) > 10
    assert (
        tokenizer2.eos_token_id == tokenizer.eos_token_id
        and tokenizer2.chat_template == tokenizer.chat_template
    )
    assert [(t.name, t.tensor_type, t.shape.tolist()) for t in mapped] == [
        (t.name, t.tensor_type, t.shape.tolist()) for t in parsed
    ]
    for a, b in zip(parsed, mapped, strict=True):
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape
        assert np.array_equal(a.data, b.data), a.name


def test_the_engine_generates_the_same_tokens_from_the_cache(gguf):
    from backend.engine import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    runs = []
    for _ in range(2):  # the first load converts and fills the cache, the second reads it
        llm = LLM(gguf, dtype="float32", device="cpu", kv_cache_memory_bytes=8 << 20)
        runs.append(llm.generate([[1, 2, 3, 4, 5]], params)[0].outputs[0].token_ids)
        assert llm.llm_engine.quantization and "Q4_1" in llm.llm_engine.quantization
        # the name the server answers to is the one an exported command serves (it was cut at the first dot)
        assert llm.model_name == "Tiny-Llama-3.1-8B-Instruct" == served_model_name(gguf)
        del llm
    assert runs[0] == runs[1] and len(runs[0]) == 8
    assert gguf_cache.config_and_tokenizer(gguf)[2]  # cached by the first load


def test_a_cache_folder_others_may_write_is_not_trusted(gguf):
    gguf_cache.config_and_tokenizer(gguf)
    folder = next(p for p in gguf_cache.cache_dir().iterdir() if p.is_dir())
    assert gguf_cache.is_usable(folder)
    folder.chmod(0o777)
    assert not gguf_cache.is_usable(folder)
    assert not gguf_cache.config_and_tokenizer(gguf)[2]  # converted again, not read from there


def test_the_planner_reads_a_gguf_once_across_processes(gguf, monkeypatch):
    """The planner's spec of a GGUF file (the Launch card's plan, Plan with a .gguf) is parsed once and kept
    beside the engine's cache: a new process (its in-memory cache cleared) reads it without GGUFReader, and
    a saved file others may write is not trusted."""
    import gguf as gguf_py

    from backend.planner import sources

    sources._gguf_spec_cached.cache_clear()
    parsed = sources.load_model_spec(gguf)
    assert parsed.checkpoint_dtype.startswith("gguf") and parsed.weights_bytes > 0
    saved = next(gguf_cache.cache_dir().glob("*.plan.json"))

    def no_parse(*args, **kwargs):
        raise AssertionError("GGUFReader called although the planner's facts were saved")

    monkeypatch.setattr(gguf_py, "GGUFReader", no_parse)
    sources._gguf_spec_cached.cache_clear()  # as a new process
    assert sources.load_model_spec(gguf) == parsed
    saved.chmod(0o666)
    sources._gguf_spec_cached.cache_clear()
    with pytest.raises(AssertionError, match="GGUFReader called"):  # read from the file again
        sources.load_model_spec(gguf)
    sources._gguf_spec_cached.cache_clear()
