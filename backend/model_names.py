"""How a model is named to people: "SmolLM2-135M-Instruct · GGUF Q4_1", never a path in site-packages."""

from __future__ import annotations

import re
from pathlib import Path

_GGUF_TYPE = re.compile(r"[.\-_]((?:I?Q\d\w*)|BF16|F16|F32)$", re.IGNORECASE)  # llama.cpp's file naming
_COUNTS = re.compile(r"(\w+) \((\d+) tensors?\)")


def gguf_type(quantization: str | None) -> str | None:
    """The type most tensors have, from the engine's description ("gguf Q4_1 (210 tensors), Q8_0 (1)")."""
    counts = [(int(n), t) for t, n in _COUNTS.findall(quantization or "")]
    return max(counts)[1] if counts else None


def gguf_file_name(path: Path) -> tuple[str, str | None]:
    """("Llama-3.1-8B-Instruct", "Q4_K_M") for .../Llama-3.1-8B-Instruct-Q4_K_M.gguf: llama.cpp's file
    naming, the model's name and then its type (None when the name has no type)."""
    stem = path.name.removesuffix(".gguf")
    match = _GGUF_TYPE.search(stem)
    return (stem[: match.start()], match.group(1).upper()) if match else (stem, None)


def served_model_name(model: str) -> str:
    """The name a server answers to for `model` when none is given (vLLM's --served-model-name): a Hub id
    as it is; a local .gguf file by its model name (gguf_file_name: "Llama-3.1-8B-Instruct"), a local
    folder by its own name. A path says where the weights are; clients should not have to send it."""
    path = Path(model)
    if path.suffix == ".gguf":
        name = gguf_file_name(path)[0]
    elif path.is_absolute() or model.startswith((".", "~")) or path.exists():
        name = path.name or path.resolve().name
    else:
        return model
    return name.lstrip("-") or "model"  # a leading '-' would read as a flag


def display_name(model: str, quantization: str | None = None, dtype: str | None = None) -> str:
    """A GGUF file as its name and type, a folder as its name, a Hub id as it is; with the weights'
    format after a dot: the engine's quantization when it runs quantized, else dtype when given."""
    path = Path(model)
    if path.suffix == ".gguf":
        name, file_type = gguf_file_name(path)
        kind = gguf_type(quantization) or file_type
        return f"{name} · GGUF {kind}" if kind else f"{name} · GGUF"
    name = path.name if path.is_absolute() or model.startswith((".", "~")) else model
    kind = quantization.split(" (")[0] if quantization else dtype
    return f"{name} · {kind}" if kind else name
