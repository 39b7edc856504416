"""Can the embedded engine run a model? Answered from its config alone, before any weights are fetched.

``check_architecture(model)`` reads what names the model's architecture and nothing else: a local
folder's config.json, a GGUF file's metadata (general.architecture, through llama.cpp's families), a
bundled preset's config snapshot for a Hub id (no network), else the Hub repo's config.json alone
(``hub_config``, the one network read here: tests replace it). The registry (engine/models/registry.py)
decides; an architecture it lacks is refused naming what it is and every architecture that runs. The
Launch tab and the Plan tab's "Launch this plan here" both ask this one function, and the loader asks it
before a Hub download starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from backend.errors import ModelNotFound, Unsupported
from backend.model_limits import MAX_CONFIG_BYTES, UntrustedModelError, read_config_json
from backend.planner.catalog import preset_document

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name, as the loader accepts it


@dataclass(slots=True)
class ModelArchitecture:
    """What a model's description says it is."""

    architectures: tuple[str, ...]  # config.json's "architectures" (transformers class names)
    model_type: str
    source: str  # where it was read: "config.json", "GGUF metadata (gemma3)", "preset", "Hub config.json"


class UnsupportedArchitecture(Unsupported):
    """A model whose architecture the engine has no class for (the message lists the ones it has)."""


def hub_config(repo_id: str) -> dict[str, Any]:
    """A Hub repo's config.json alone: from the local Hugging Face cache when it is there (offline too),
    else downloaded once its size is known to be within MAX_CONFIG_BYTES; OSError when the Hub cannot be
    read. Launch needs the admin token on a public app, so the owner's HF_TOKEN may go with it."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return read_config_json(hf_hub_download(repo_id, "config.json", local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError):
        pass
    try:
        size = get_hf_file_metadata(hf_hub_url(repo_id, "config.json"), timeout=10).size
        if size is None or size > MAX_CONFIG_BYTES:
            raise UntrustedModelError(
                f"{repo_id}'s config.json is {size or 'an unknown number of'} bytes; a model config may be "
                f"at most {MAX_CONFIG_BYTES:,} bytes"
            )
        return read_config_json(hf_hub_download(repo_id, "config.json"))
    except ValueError:
        raise
    except Exception as exc:  # offline, DNS, no such repository, gated: one error the callers explain
        raise OSError(f"could not read {repo_id}'s config.json from the Hugging Face Hub ({exc})") from None


def gguf_architecture(path: str) -> ModelArchitecture:
    """The transformers architecture a GGUF file was converted from (its llama.cpp family)."""
    from backend.engine.gguf.families import family_of
    from backend.engine.gguf.metadata import read_metadata

    meta = read_metadata(path)
    has_experts = bool(meta.fields.get(meta.arch_key("expert_count")))
    source = f"GGUF metadata (general.architecture {meta.architecture})"
    try:
        family = family_of(meta.architecture, has_experts)
    except ValueError:  # a llama.cpp architecture we have no family for: its own name is what we know
        return ModelArchitecture((), meta.architecture, source)
    return ModelArchitecture((family.hf_architecture,), family.model_type, source)


def config_architecture(config: dict[str, Any], source: str) -> ModelArchitecture:
    names = config.get("architectures") or ()
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{source}: architectures must be a list of class names, got {names!r}")
    model_type = config.get("model_type")
    return ModelArchitecture(tuple(names), model_type if isinstance(model_type, str) else "", source)


def read_architecture(model: str) -> ModelArchitecture:
    """What the model's config says it is; nothing but the config is read (OSError: the Hub is not
    reachable for a Hub id that is neither cached nor a preset)."""
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotFound(f"Model path not found: {model} (no such GGUF file)")
        return gguf_architecture(str(path))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFound(f"Model folder {model} has no config.json (not a Hugging Face model folder)")
        return config_architecture(read_config_json(path / "config.json"), f"{path}/config.json")
    if path.exists() or not HUB_ID.match(model):
        raise ModelNotFound(
            f"Model path not found: {model} (expected a local model folder, a .gguf file or a Hub id)"
        )
    preset = preset_document(model)
    if preset is not None:
        return config_architecture(preset["config"], f"the bundled preset of {model}")
    return config_architecture(hub_config(model), f"{model}'s config.json on the Hub")


def check_architecture(model: str) -> str:
    """The registered architecture that runs model; UnsupportedArchitecture naming the model's
    architecture and the supported ones; ModelNotFound for a path that is not a model (as the loader)."""
    from backend.engine.models.registry import resolve_architecture, supported_architectures

    found = read_architecture(model)
    config = SimpleNamespace(architectures=list(found.architectures), model_type=found.model_type)
    try:
        return resolve_architecture(config)
    except ValueError:
        named = ", ".join(found.architectures) or f"model_type {found.model_type or 'unknown'}"
        raise UnsupportedArchitecture(
            f"{model}: architecture {named} (from {found.source}) is not supported by the embedded engine. "
            f"Supported: {', '.join(supported_architectures())}. Serve it with vLLM (Export tab) instead."
        ) from None


def refuse_unsupported(*models: str | None) -> None:
    """UnsupportedArchitecture for the first model (a model, a draft model; None skipped) whose config
    names an architecture the engine lacks. A model that cannot be read is left to the load, whose own
    error says why (a missing path, a corrupt file, the Hub unreachable)."""
    for model in models:
        if model is None:
            continue
        try:
            check_architecture(model)
        except UnsupportedArchitecture:
            raise
        except (ValueError, OSError):  # not a model, an unreadable config, no Hub: the load says which
            pass
