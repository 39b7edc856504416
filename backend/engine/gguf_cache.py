"""A GGUF file's config and tokenizer, converted once and kept as a Hugging Face folder, and its tensor
table (names, types, shapes, offsets).

The config comes from the file's metadata (gguf/hf_config.py, every llama.cpp architecture of
gguf/families.py); the tokenizer from transformers' GGUF tokenizer builder (tens of thousands of
vocabulary strings, seconds on a small CPU). The converted config.json and tokenizer files are saved
under ~/.cache/llm-playground/gguf/<key>/, the key made of the file's resolved path, inode, size,
modification time, the transformers version and CONVERSION_VERSION, so a changed file, a new transformers
or a new conversion converts again. A folder is used only when it is complete (written to a temporary folder,
then renamed) and belongs to the current user; when the cache cannot be written, the load goes on
without it. With the tensor table, a cached load memory-maps the weights and parses nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader
from gguf.quants import quant_shape_to_byte_shape

from backend.engine.gguf.hf_config import config_dict
from backend.engine.gguf.metadata import read_metadata
from backend.engine.gguf.tokenizer import gguf_tokenizer
from backend.model_limits import check_config, check_gguf_header

log = logging.getLogger(__name__)
COMPLETE = "converted-from-gguf"  # the marker written last
CONVERSION_VERSION = "families-1"  # part of the key: change it when gguf/hf_config.py converts differently


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "llm-playground" / "gguf"


def cache_key(path: Path) -> str:
    import transformers

    return file_key(path, f"{transformers.__version__}|{CONVERSION_VERSION}")


def file_key(path: Path, version: str) -> str:
    """A name for what was read from this version of the file by this version of its reader."""
    stat = path.stat()
    ident = f"{path.resolve()}|{stat.st_ino}|{stat.st_size}|{stat.st_mtime_ns}|{version}"
    return hashlib.sha256(ident.encode()).hexdigest()[:20]


def is_usable(folder: Path) -> bool:
    """A complete folder, owned by this user and writable by nobody else."""
    try:
        info = folder.stat()
    except OSError:
        return False
    owned = info.st_uid == os.getuid() and not info.st_mode & 0o022
    return owned and (folder / COMPLETE).is_file()


def _convert(path: Path) -> tuple[Any, Any]:
    from transformers import AutoConfig

    config = AutoConfig.for_model(**config_dict(read_metadata(str(path))))
    check_config(config.to_dict())
    config._name_or_path = str(path.parent)
    return config, gguf_tokenizer(str(path))


def _save(config: Any, tokenizer: Any, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    config.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    (staging / COMPLETE).write_text("")
    try:
        staging.rename(target)
    except OSError:  # another process converted the same file first: keep theirs
        for child in staging.iterdir():
            child.unlink()
        staging.rmdir()


def config_and_tokenizer(gguf_path: str, trust_remote_code: bool = False) -> tuple[Any, Any, bool]:
    """(config, tokenizer, from_cache) of a GGUF file (trust_remote_code applies to a cached folder only:
    the config and tokenizer classes of a GGUF are transformers' own)."""
    from transformers import AutoConfig, AutoTokenizer

    path = Path(gguf_path)
    target = cache_dir() / cache_key(path)
    if is_usable(target):
        config = AutoConfig.from_pretrained(target, trust_remote_code=trust_remote_code)
        config._name_or_path = str(path.parent)  # as transformers names a config read from the file
        return config, AutoTokenizer.from_pretrained(target, trust_remote_code=trust_remote_code), True
    config, tokenizer = _convert(path)
    try:
        _save(config, tokenizer, target)
    except OSError as exc:  # read-only home, full disk: this load is fine, the next one converts again
        log.warning("cannot cache the converted config and tokenizer of %s (%s)", path.name, exc)
    return config, tokenizer, False


# --- the tensor table: names, types, shapes and offsets, so a cached load memory-maps the weights without
# parsing the metadata (GGUFReader parses every vocabulary string before it lists a single tensor)

_ITEM_TYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I8": np.int8}
_ITEM_TYPES |= {"I16": np.int16, "I32": np.int32, "I64": np.int64}


@dataclass(slots=True)
class GGUFTensor:
    """What the weight reader uses of gguf's ReaderTensor."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: np.ndarray  # GGUF order, innermost dimension first
    data: np.ndarray  # a view into the memory-mapped file, shaped as GGUFReader shapes it


def _table_path(path: Path) -> Path:
    return cache_dir() / f"{cache_key(path)}.tensors.json"


def _tensor(file: np.memmap, name: str, type_name: str, dims: list[int], offset: int) -> GGUFTensor:
    qtype = GGMLQuantizationType[type_name]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    n_elements = int(np.prod(dims))
    np_dims: tuple[int, ...] = tuple(reversed(dims))
    if type_name in _ITEM_TYPES:
        item_type, count = _ITEM_TYPES[type_name], n_elements
    else:
        item_type, count = np.uint8, n_elements * type_size // block_size
        np_dims = quant_shape_to_byte_shape(np_dims, qtype)
    raw = file[offset : offset + count * np.dtype(item_type).itemsize]
    return GGUFTensor(name, qtype, np.array(dims, dtype=np.uint64), raw.view(item_type).reshape(np_dims))


def tensors(gguf_path: str) -> tuple[str, list[GGUFTensor]]:
    """(general.architecture, tensors) of a GGUF file: from the cached table when there is one, else from
    GGUFReader (and the table is saved for the next load)."""
    path = Path(gguf_path)
    table = _table_path(path)
    saved = read_json(table)
    if saved is not None:
        file = np.memmap(path, dtype=np.uint8, mode="r")
        return saved["architecture"], [_tensor(file, *entry) for entry in saved["tensors"]]
    check_gguf_header(path)
    reader = GGUFReader(path)
    field = reader.fields["general.architecture"]
    architecture = bytes(field.parts[field.data[0]]).decode()
    if reader.byte_order == "I":  # a byte-swapped file is read through GGUFReader every time
        entries = [[t.name, t.tensor_type.name, t.shape.tolist(), t.data_offset] for t in reader.tensors]
        write_json(table, {"architecture": architecture, "tensors": entries})
    return architecture, [GGUFTensor(t.name, t.tensor_type, t.shape, t.data) for t in reader.tensors]


def read_json(table: Path) -> dict | None:
    """A table this cache wrote: only when the current user owns it and nobody else can write it."""
    try:
        info = table.stat()
        if info.st_uid != os.getuid() or info.st_mode & 0o022:
            return None
        return json.loads(table.read_text())
    except (OSError, ValueError):  # missing, unreadable or cut short: read the file instead
        return None


def write_json(table: Path, content: dict) -> None:
    """Save content as table for the next read (read_json); a failure only costs the next read a parse."""
    try:
        table.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        staging = table.with_suffix(f".{os.getpid()}.tmp")
        staging.write_text(json.dumps(content))
        staging.chmod(0o600)
        os.replace(staging, table)
    except OSError as exc:  # read-only home, full disk: the next load parses the file again
        log.warning("cannot cache %s (%s)", table.name, exc)
