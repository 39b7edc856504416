"""The native kernel build never breaks loading: with no compiler, a cache folder that cannot be written,
or a planted library that others could have written, the engine still loads, says why once, and
generates the same tokens as transformers."""

from __future__ import annotations

import logging
import shutil
import subprocess

import pytest

from backend.engine import LLM, SamplingParams, cpu_kernels
from tests.engine_utils import (
    assert_engine_clean,
    hf_greedy,
    prompts,
    tiny_model,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ARCH = "llama"
HAS_COMPILER = shutil.which("g++") is not None


@pytest.fixture(autouse=True)
def fresh_kernel_cache():
    """load_library() remembers its answer per process: forget it around each test."""
    cpu_kernels.load_library.cache_clear()
    yield
    cpu_kernels.load_library.cache_clear()


def generate_and_check(expect_kernels: bool) -> None:
    llm = LLM(tiny_model(ARCH)[0], dtype="float32", device="cpu")
    assert llm.llm_engine.runner.decode_kernel is expect_kernels
    batch = prompts(seed=11)[:3]
    outs = llm.generate(batch, SamplingParams(temperature=0.0, max_tokens=12))
    for prompt, out in zip(batch, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(ARCH, prompt, 12)
    assert_engine_clean(llm)


def kernel_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == cpu_kernels.__name__ and r.levelno >= 30]


@pytest.mark.parametrize("missing", ["CXX points nowhere", "no g++ on PATH"])
def test_no_compiler_falls_back_with_one_warning(monkeypatch, caplog, tmp_path, missing):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    if missing == "CXX points nowhere":
        monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    else:
        monkeypatch.delenv("CXX", raising=False)
        monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no g++, no c++
    with caplog.at_level(logging.WARNING):
        generate_and_check(expect_kernels=False)
        generate_and_check(expect_kernels=False)  # a second engine: no second warning
    (warning,) = kernel_warnings(caplog)
    assert ("no-such-g++" in warning) if missing == "CXX points nowhere" else ("no C++ compiler" in warning)


def test_unwritable_cache_folder_falls_back_with_one_warning(monkeypatch, caplog, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # the cache folder would have to live inside a file: it cannot be created
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "cache"))
    with caplog.at_level(logging.WARNING):
        generate_and_check(expect_kernels=False)
    (warning,) = kernel_warnings(caplog)
    assert "NotADirectoryError" in warning


def test_a_library_that_does_not_load_falls_back(monkeypatch, caplog, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = cpu_kernels.library_path(cpu_kernels.find_compiler()) if HAS_COMPILER else None
    if path is None:
        pytest.skip("needs a C++ compiler to name the cached library")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not an ELF file")
    path.chmod(0o755)
    with caplog.at_level(logging.WARNING):
        generate_and_check(expect_kernels=False)
    assert len(kernel_warnings(caplog)) == 1


@pytest.mark.skipif(not HAS_COMPILER, reason="plants a compiled library: needs g++")
def test_a_planted_world_writable_library_is_never_loaded(monkeypatch, tmp_path):
    """A library others could have written is rebuilt, not loaded: its load-time code never runs."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    marker = tmp_path / "planted-code-ran"
    source = tmp_path / "planted.cpp"
    source.write_text(
        "#include <cstdio>\n__attribute__((constructor)) static void run() "
        f'{{ std::FILE* f = std::fopen("{marker}", "w"); if (f) std::fclose(f); }}\n'
    )
    path = cpu_kernels.library_path(cpu_kernels.find_compiler())
    path.parent.mkdir(parents=True)
    subprocess.run(["g++", "-shared", "-fPIC", "-o", str(path), str(source)], check=True)
    path.chmod(0o777)
    generate_and_check(expect_kernels=True)  # rebuilt from our sources, then loaded
    assert not marker.exists()
    assert cpu_kernels.is_trusted(path) and cpu_kernels.is_trusted(path.parent)
