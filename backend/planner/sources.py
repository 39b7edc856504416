"""load_model_spec(): a ModelSpec from a bundled preset, a local folder, a GGUF file or a Hub id.

Local folders and Hub repos are read from their safetensors headers (exact bytes per tensor, no weights
downloaded); GGUF files from their tensor table (gguf's GGUFReader). Every config is bounded in size
before it is read and range-checked before anything is computed from it (backend/model_limits.py).

Hub reads send the owner's HF_TOKEN unless they run inside ``anonymous_hub()``: a public app plans a
visitor's pick that way, so a visitor never reads what only the owner's token may see. Hub specs are kept
in a bounded cache keyed by whether a token went with them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache, lru_cache
from pathlib import Path

from backend.errors import ModelNotFound, UserError
from backend.model_limits import MAX_CONFIG_BYTES, UntrustedModelError, check_gguf_header, read_config_json
from backend.planner.catalog import get_quantization, list_presets, preset_document
from backend.planner.memory import weight_bytes_total
from backend.planner.specs import PARAM_KINDS, ModelSpec, spec_from_config


def param_kind(name: str) -> str:
    """Which PARAM_KINDS group a tensor belongs to, from its HF or GGUF name."""
    n = name.lower()
    if any(s in n for s in ("vision", "visual", "multi_modal_projector", "mm_projector")):
        return "vision"
    if n in ("token_embd.weight", "output.weight") or any(
        s in n for s in ("embed_tokens", "lm_head", "wte.")
    ):
        return "embedding"
    if "norm" in n:
        return "other"
    if ".experts." in n or "_exps" in n or "moe.input_linear" in n or "moe.output_linear" in n:  # granitemoe
        return "experts"
    if any(s in n for s in ("self_attn", "attention", ".attn.", "attn_")):
        return "attention"
    if any(s in n for s in ("mlp", "feed_forward", "ffn_")):
        return "mlp"
    return "other"


def _offline_message(model: str, reason: str) -> str:
    return (
        f"Could not read {model!r} from the Hugging Face Hub ({reason}). The Hub may be unreachable: pass a "
        f"local model folder or a .gguf file, or one of the bundled presets: {', '.join(list_presets())}"
    )


def _spec_from_safetensors(config: dict, name: str, source: str, metadata) -> ModelSpec:
    """From huggingface_hub's SafetensorsRepoMetadata (a Hub repo or a local folder): exact byte sizes from
    each tensor's data offsets; parameter counts from shapes unless the weights are packed (quantized)."""
    total_bytes = 0
    params = dict.fromkeys(PARAM_KINDS, 0)
    for file_metadata in metadata.files_metadata.values():
        for tensor_name, info in file_metadata.tensors.items():
            start, end = info.data_offsets
            total_bytes += end - start
            params[param_kind(tensor_name)] += math.prod(info.shape)
    packed = bool(config.get("quantization_config"))  # packed int formats make element counts meaningless
    return spec_from_config(
        config, name, source, params=None if packed else params, weights_bytes=total_bytes
    )


def _local_folder_spec(folder: Path) -> ModelSpec:
    from huggingface_hub import get_local_safetensors_metadata

    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ValueError(
            f"{folder} has no config.json; a local model folder needs config.json and *.safetensors"
        )
    config = read_config_json(config_file)
    if not any(folder.glob("*.safetensors")):
        return spec_from_config(config, folder.name, f"local:{folder} (config.json only, no safetensors)")
    metadata = get_local_safetensors_metadata(folder)
    return _spec_from_safetensors(config, folder.name, f"local:{folder}", metadata)


def _gguf_spec(path: Path) -> ModelSpec:
    stat = path.stat()
    return _gguf_spec_cached(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=32)  # local files, keyed by version: bounded all the same
def _gguf_spec_cached(file: str, mtime_ns: int, size: int) -> ModelSpec:
    """GGUFReader parses the whole tokenizer (seconds): each file version is read once, and what the spec
    is made of is kept beside the engine's GGUF cache for the next process (the Launch card's plan)."""
    from backend.engine import gguf_cache

    path = Path(file)
    saved = gguf_cache.cache_dir() / f"{gguf_cache.file_key(path, GGUF_FACTS_VERSION)}.plan.json"
    facts = gguf_cache.read_json(saved)
    if facts is None:
        facts = _gguf_facts(path)
        gguf_cache.write_json(saved, facts)
    return spec_from_config(**facts)


GGUF_FACTS_VERSION = "planner-gguf-3"  # change it when _gguf_facts reads something else


def _gguf_config(path: Path, field, names: set[str]) -> dict:
    """The transformers config the engine converts the file to (engine/gguf/hf_config.py: layer types,
    head widths, expert counts as llama.cpp means them) for the families it knows; the generic keys of
    llama.cpp's format for any other architecture."""
    from backend.engine.gguf.families import FAMILIES
    from backend.engine.gguf.hf_config import config_dict
    from backend.engine.gguf.metadata import read_metadata

    arch = field("general.architecture", "llama")
    if arch in FAMILIES:
        return config_dict(read_metadata(str(path)))
    heads = field(f"{arch}.attention.head_count")
    hidden = field(f"{arch}.embedding_length")
    return {
        "architectures": [arch],
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": field(f"{arch}.block_count"),
        "intermediate_size": field(f"{arch}.feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": field(f"{arch}.attention.head_count_kv", heads),
        "head_dim": field(f"{arch}.attention.key_length", hidden // heads),
        "vocab_size": field(f"{arch}.vocab_size") or len(field("tokenizer.ggml.tokens", [])),
        "max_position_embeddings": field(f"{arch}.context_length", 2048),
        "sliding_window": field(f"{arch}.attention.sliding_window"),
        "num_local_experts": field(f"{arch}.expert_count"),
        "num_experts_per_tok": field(f"{arch}.expert_used_count"),
        "tie_word_embeddings": "output.weight" not in names,
    }


def _gguf_facts(path: Path) -> dict:
    """spec_from_config's arguments for a GGUF file, read from its metadata and tensor table."""
    from gguf import GGUFReader, LlamaFileType

    from backend.engine.gguf.families import ROPE_TENSORS

    check_gguf_header(path)  # counts and lengths bounded before GGUFReader allocates from them
    reader = GGUFReader(str(path))

    def field(key: str, default=None):
        item = reader.fields.get(key)
        return item.contents() if item is not None else default

    names = {t.name for t in reader.tensors}
    config = _gguf_config(path, field, names)
    params = dict.fromkeys(PARAM_KINDS, 0)
    for tensor in reader.tensors:
        if tensor.name not in ROPE_TENSORS:  # RoPE factors llama.cpp stores as tensors: config, not weights
            params[param_kind(tensor.name)] += int(tensor.n_elements)
    file_type = field("general.file_type")
    dtype = (
        "gguf-" + LlamaFileType(file_type).name.removeprefix("MOSTLY_").lower()
        if file_type is not None
        else "gguf"
    )
    weights = sum(int(t.n_bytes) for t in reader.tensors)
    name = field("general.name") or path.stem
    return dict(
        config=config,
        name=name,
        source=f"gguf:{path}",
        params=params,
        weights_bytes=weights,
        checkpoint_dtype=dtype,
    )


@cache
def _preset_spec(hub_id: str) -> ModelSpec:
    doc = preset_document(hub_id)
    assert doc is not None, "only called for ids _find_preset found"
    config = doc["config"]
    spec = spec_from_config(config, doc["hub_id"], f"preset:presets/models ({doc['params_source']})")
    if spec.params_total != doc["params_total"]:
        raise ValueError(
            f"preset {hub_id}: config gives {spec.params_total} parameters, file says {doc['params_total']}"
        )
    spec.weights_bytes = weight_bytes_total(spec, get_quantization(spec.checkpoint_dtype))
    return spec


def hub_unreachable_reason(timeout: float = 3.0) -> str | None:
    """Why the Hub cannot be reached (offline mode, DNS, no route), or None; fails fast, no retries."""
    import os
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("0", "", "false"):
        return "HF_HUB_OFFLINE is set"
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
    except OSError as exc:
        return f"cannot connect to {host}: {exc}"
    return None


HUB_SPEC_CACHE = 64  # distinct Hub models planned and kept (visitors name any id they like)
# None: huggingface_hub's own choice (the HF_TOKEN of the environment); False: no token at all
_HUB_TOKEN: ContextVar[bool | None] = ContextVar("hub_token", default=None)


@contextmanager
def anonymous_hub() -> Iterator[None]:
    """Within it, Hub reads send no token: what a public app's visitor asks for is read as anyone would."""
    reset = _HUB_TOKEN.set(False)
    try:
        yield
    finally:
        _HUB_TOKEN.reset(reset)


@lru_cache(maxsize=HUB_SPEC_CACHE)
def _hub_spec(repo_id: str, revision: str | None, token: bool | None = None) -> ModelSpec:
    from huggingface_hub import get_safetensors_metadata
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    reason = hub_unreachable_reason()
    if reason:
        raise ValueError(_offline_message(repo_id, reason))
    try:
        config = _hub_config(repo_id, revision, token)
        metadata = get_safetensors_metadata(repo_id, revision=revision, token=token)
    except RepositoryNotFoundError:
        raise ValueError(_offline_message(repo_id, "no such repository, or it is private")) from None
    except GatedRepoError:
        raise ValueError(
            _offline_message(repo_id, "gated repository: log in with a token that has access")
        ) from None
    except UntrustedModelError:
        raise
    except Exception as exc:  # offline, DNS, timeouts, no safetensors: all end in the same advice
        raise ValueError(_offline_message(repo_id, f"{type(exc).__name__}: {str(exc)[:160]}")) from None
    return _spec_from_safetensors(config, repo_id, f"hub:{repo_id}", metadata)


def _hub_config(repo_id: str, revision: str | None, token: bool | None) -> dict:
    """The repo's config.json: its size asked first, downloaded only within MAX_CONFIG_BYTES."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url

    url = hf_hub_url(repo_id, "config.json", revision=revision)
    size = get_hf_file_metadata(url, token=token).size
    if size is None or size > MAX_CONFIG_BYTES:
        raise UntrustedModelError(
            f"{repo_id}'s config.json is {size or 'an unknown number of'} bytes; a model config may be at "
            f"most {MAX_CONFIG_BYTES:,} bytes"
        )
    return read_config_json(hf_hub_download(repo_id, "config.json", revision=revision, token=token))


def _find_preset(model: str) -> str | None:
    if preset_document(model):
        return model
    matches = [hub for hub in list_presets() if hub.split("/")[-1].lower() == model.lower()]
    return matches[0] if len(matches) == 1 else None


def load_model_spec(model: str, revision: str | None = None) -> ModelSpec:
    """A ModelSpec from a local .gguf file or folder, a bundled preset (by Hub id), or the Hub."""
    if not isinstance(model, str) or not model.strip():
        raise UserError(f"model must be a Hub id, a local folder, a .gguf file or a preset; got {model!r}")
    model = model.strip()
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotFound(f"GGUF file not found: {model}")
        return _gguf_spec(path)
    if path.is_dir():
        return _local_folder_spec(path)
    preset = _find_preset(model)
    if preset:
        return _preset_spec(preset)
    if model.count("/") == 1 and not model.startswith((".", "/", "~")):
        return _hub_spec(model, revision, _HUB_TOKEN.get())
    raise ValueError(
        f"unknown model {model!r}: not a local folder or .gguf file, not a Hub id (owner/name), and not a "
        f"bundled preset. Presets: {', '.join(list_presets())}"
    )
