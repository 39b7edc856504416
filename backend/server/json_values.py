"""The raw JSON of a request body, checked before pydantic sees it: what standard JSON cannot carry,
nesting, and list lengths. Each check costs one pass over the body at most (linear in its size)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

MAX_JSON_DEPTH = 64  # request bodies are shallow; deeper nesting is refused before it is walked
MAX_KEY_CHARS_SHOWN = 40  # a key in an error's path is cut to this many characters


def check_json_values(value: Any, where: str = "body") -> None:
    """Refuse what standard JSON cannot carry but Python's parser lets through: NaN and Infinity
    (non-standard constants) and lone UTF-16 surrogates in strings ("\\ud800"), anywhere in the body.

    One pass, linear in the body: containers are pushed with a (parent, key) link, and a path string is
    only built for the value that fails (building one per element cost a copy of every key above it)."""
    _check_scalar(value, where, None)
    stack: list[tuple[Any, int, tuple | None]] = [(value, 0, None)]
    while stack:
        item, depth, link = stack.pop()
        if not isinstance(item, dict | list):
            continue
        if depth >= MAX_JSON_DEPTH:
            raise ValueError(f"{_path(where, link)}: nested deeper than {MAX_JSON_DEPTH} levels")
        pairs = item.items() if isinstance(item, dict) else enumerate(item)
        for key, child in pairs:
            if isinstance(key, str) and not key.isascii() and not _encodes(key):
                raise ValueError(f"{_path(where, link)}: a key holds a lone surrogate (invalid Unicode)")
            if isinstance(child, dict | list):
                stack.append((child, depth + 1, (link, key)))
            elif isinstance(child, str | float):
                _check_scalar(child, where, (link, key))


def _check_scalar(value: Any, where: str, link: tuple | None) -> None:
    if isinstance(value, str):
        if not value.isascii() and not _encodes(value):
            raise ValueError(f"{_path(where, link)}: the text holds a lone surrogate (invalid Unicode)")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError(
            f"{_path(where, link)}: {value} is not a JSON number (NaN and Infinity are not allowed)"
        )


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _path(where: str, link: tuple | None) -> str:
    """'body.messages[3].content' for a value's (parent, key) chain; long keys cut short."""
    parts: list[str] = []
    while link is not None:
        link, key = link
        if isinstance(key, int):
            parts.append(f"[{key}]")
        else:
            shown = key if len(key) <= MAX_KEY_CHARS_SHOWN else key[:MAX_KEY_CHARS_SHOWN] + "…"
            parts.append(f".{shown}")
    return where + "".join(reversed(parts))


def check_list_lengths(data: Any, limits: Mapping[str, int]) -> None:
    """Refuse a top-level list longer than its limit before pydantic validates it: validation holds the
    GIL for the whole list (100,000 chat messages took ~0.9 s in one call, the event loop stalled)."""
    if not isinstance(data, dict):
        return
    for name, limit in limits.items():
        value = data.get(name)
        if isinstance(value, list) and len(value) > limit:
            raise ValueError(f"{name} has {len(value):,} items; the limit is {limit:,}")
