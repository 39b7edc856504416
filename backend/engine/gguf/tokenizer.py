"""The tokenizer a GGUF file carries, with its chat template and special tokens.

transformers builds it from the vocabulary, merges and token types (integrations/gguf/
gguf_tokenizer_mapping.py picks the builder from tokenizer.ggml.model and .pre, whatever the architecture);
tokenizer.chat_template, the bos/eos/unk/pad ids and add_bos/add_eos come along as tokenizer settings.
TokenizersBackend is used directly: AutoTokenizer would first rebuild the model config through
transformers' own GGUF mapping, which knows fewer architectures than families.FAMILIES.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def gguf_tokenizer(gguf_path: str) -> Any:
    """The file's tokenizer (a transformers TokenizersBackend), chat template included."""
    from transformers import TokenizersBackend

    path = Path(gguf_path)
    try:
        return TokenizersBackend.from_pretrained(str(path.parent), gguf_file=path.name)
    except KeyError as exc:  # tokenizer.ggml.tokens missing: a file converted with --no-vocab
        raise ValueError(
            f"{path} carries no tokenizer (missing {exc}); convert it with its vocabulary"
        ) from exc
