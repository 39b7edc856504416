"""llama.cpp's tools as the Makefile provides them (llama-cpp-python's sdist, `make llama-cpp-src` and
`make llama-cpp`): the folders, the converter (convert_hf_to_gguf.py) and llama-quantize / llama-bench /
llama-batched-bench run as subprocesses.

The built binaries find their shared libraries through the RUNPATH cmake wrote (an absolute path into the
build folder); tool_env() puts the build's bin/ first on LD_LIBRARY_PATH, so a build folder copied from
another checkout runs against its own libraries.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from backend.cpu_features import ISA_VARIABLE, cpu_isa

REPO = Path(__file__).resolve().parents[2]
CONVERTER_TYPES = ("f32", "f16", "bf16", "q8_0")  # what convert_hf_to_gguf.py --outtype writes


def llama_cpp_dir(kind: str = "src") -> Path:
    """.cache/llama.cpp/<kind>-<version> (the version the Makefile pins): src (make llama-cpp-src, part of
    make test) or build (make llama-cpp: llama-bench, llama-batched-bench, llama-quantize; with
    PLAYGROUND_CPU_ISA=avx2, ggml's AVX2 build in build-<version>-avx2)."""
    version = re.search(r"^LLAMA_CPP_PYTHON := (\S+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert version, "the Makefile pins LLAMA_CPP_PYTHON"
    isa = cpu_isa() if kind == "build" else ""
    folder = REPO / ".cache" / "llama.cpp" / (f"{kind}-{version.group(1)}" + (f"-{isa}" if isa else ""))
    stamp = folder / (".unpacked" if kind == "src" else ".built")
    if not stamp.is_file():
        target = "llama-cpp-src" if kind == "src" else "llama-cpp"
        prefix = f"{ISA_VARIABLE}={isa} " if isa else ""
        raise RuntimeError(f"llama.cpp's {kind} is not at {folder}: run `{prefix}make {target}` first")
    return folder


def tool(name: str) -> Path:
    """A built llama.cpp binary (llama-bench, llama-batched-bench, llama-quantize)."""
    return llama_cpp_dir("build") / "bin" / name


def tool_env() -> dict[str, str]:
    """The environment the binaries run in: this one, the build's bin/ first on LD_LIBRARY_PATH."""
    env = dict(os.environ)
    libs = str(llama_cpp_dir("build") / "bin")
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libs, env.get("LD_LIBRARY_PATH")) if p)
    return env


def run_tool(name: str, *args: str, timeout: float | None = None) -> str:
    """stdout of `name *args`; RuntimeError with its stderr's end when it fails."""
    done = subprocess.run(
        [str(tool(name)), *args], capture_output=True, text=True, env=tool_env(), timeout=timeout
    )
    if done.returncode != 0:
        raise RuntimeError(f"{name} {' '.join(args)} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


_CONVERT_EACH = """import os, runpy, sys
converter, folder, *pairs = sys.argv[1:]
sys.path.insert(0, os.path.dirname(converter))  # its conversion/ package, as `python converter` would
for outtype, out in zip(pairs[::2], pairs[1::2]):
    sys.argv = [converter, folder, "--outtype", outtype, "--outfile", out]
    runpy.run_path(converter, run_name="__main__")
"""


def convert_hf_to_gguf(folder: str | Path, *outtypes: str) -> dict[str, Path]:
    """{outtype: <folder>-<OUTTYPE>.gguf}, written by llama.cpp's convert_hf_to_gguf.py (which puts its own,
    newer gguf-py first on sys.path) in one subprocess of this Python; each file written once, then reused."""
    if unknown := [t for t in outtypes if t not in CONVERTER_TYPES]:
        raise ValueError(f"the converter writes {', '.join(CONVERTER_TYPES)}; got {unknown}")
    folder = Path(folder)
    outs = {outtype: folder.parent / f"{folder.name}-{outtype.upper()}.gguf" for outtype in outtypes}
    missing = [arg for outtype, out in outs.items() if not out.is_file() for arg in (outtype, str(out))]
    if missing:
        converter = llama_cpp_dir() / "convert_hf_to_gguf.py"
        command = [sys.executable, "-c", _CONVERT_EACH, str(converter), str(folder), *missing]
        result = subprocess.run(command, capture_output=True, text=True, timeout=3600)
        if result.returncode != 0:
            for out in outs.values():
                out.unlink(missing_ok=True)
            raise RuntimeError(f"convert_hf_to_gguf.py failed on {folder}:\n{result.stderr[-3000:]}")
    return outs


def llama_quantize(path: Path, type_name: str, *extra: str) -> Path:
    """The file quantized by llama.cpp's llama-quantize (make llama-cpp) to type_name (Q4_0, Q4_K_M, ...);
    extra: its options (--pure: every tensor type_name, no mix). Written once, then reused."""
    suffix = "".join(e.strip("-").upper() + "-" for e in extra)
    out = path.with_name(path.name.replace(".gguf", f"-{suffix}{type_name}.gguf"))
    if not out.is_file():
        partial = out.with_name(out.name + ".partial")
        run_tool("llama-quantize", *extra, str(path), str(partial), type_name)
        partial.rename(out)
    return out
