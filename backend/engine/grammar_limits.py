"""Limits on what a structured-output constraint may ask for, checked before anything is compiled.

Two layers. GrammarLimits bounds the request itself (a schema's bytes and nesting, a regex's and a
grammar's length, a choice list), each refused with a ValueError that names the limit, so a client learns
what to shrink. llguidance's own LLParserLimits then bound the work its compiler and its per-token mask
may do (lexer fuel, Earley items, lexer states, grammar size): those are the real guarantees on time and
memory, whatever the text looks like.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import llguidance

from backend.engine.sampling_params import StructuredOutputsParams

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

# JSON whitespace between tokens: vLLM allows any amount; a small model then pads until max_tokens. With
# the separators below, llguidance (1.6) writes exactly ", " and ": " and no other whitespace.
BOUNDED_WHITESPACE = r"[\x20\x0A\x0D\x09]{0,16}"


@dataclass(slots=True, frozen=True)
class GrammarLimits:
    # OpenAI's structured outputs allow 120,000 characters of property names, enum and const values in
    # one schema, 10 levels of object nesting (2 JSON levels each, plus items/anyOf wrappers) and 1,000
    # enum values (platform.openai.com/docs/guides/structured-outputs, "Supported schemas").
    max_schema_bytes: int = 128 * 1024
    max_schema_depth: int = 32
    max_choices: int = 1000
    max_choice_chars: int = 120_000  # all choices together
    # ours: a regex or grammar is a few lines in practice; the compiler's fuel bounds its complexity
    max_regex_chars: int = 8 * 1024
    max_grammar_chars: int = 64 * 1024


DEFAULT_LIMITS = GrammarLimits()


def parser_limits() -> llguidance.LLParserLimits:
    """llguidance's limits for compiling and for each step's mask. Its defaults (LLParserLimits docs)
    except: 50,000 lexer states (its 250,000 at 1-2 kB each is up to 500 MB for one grammar), half its
    step fuel (100,000 at ~14k/ms: at most ~7 ms of a decode step for one constrained row) and no
    grammar text in error messages (they go back to whoever sent the grammar, and into the logs)."""
    return llguidance.LLParserLimits(max_lexer_states=50_000, step_lexer_fuel=100_000, verbose_errors=False)


def json_depth(value: Any) -> int:
    """Nesting depth of a JSON value (a scalar is 0), walked without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    return deepest


def check_schema(schema: Any, what: str, limits: GrammarLimits = DEFAULT_LIMITS) -> None:
    """A JSON schema (response format or a tool's parameters) within the size and nesting limits."""
    if schema is None or isinstance(schema, bool):
        return
    size = len(json.dumps(schema, ensure_ascii=False).encode())
    if size > limits.max_schema_bytes:
        raise ValueError(
            f"{what} is {size:,} bytes as JSON; the limit is {limits.max_schema_bytes:,} bytes "
            "(max_schema_bytes)"
        )
    depth = json_depth(schema)
    if depth > limits.max_schema_depth:
        raise ValueError(
            f"{what} is nested {depth} levels deep; the limit is {limits.max_schema_depth} (max_schema_depth)"
        )


def check_structured_outputs(params: StructuredOutputsParams, limits: GrammarLimits = DEFAULT_LIMITS) -> None:
    """ValueError naming the limit when the constraint is larger than ``limits`` allow."""
    if params.json is not None:
        check_schema(params.json, "structured_outputs.json", limits)
    if params.regex is not None:
        _check_length(params.regex, "structured_outputs.regex", limits.max_regex_chars, "max_regex_chars")
    if params.grammar is not None:
        _check_length(
            params.grammar, "structured_outputs.grammar", limits.max_grammar_chars, "max_grammar_chars"
        )
    if params.whitespace_pattern is not None:
        _check_length(
            params.whitespace_pattern, "whitespace_pattern", limits.max_regex_chars, "max_regex_chars"
        )
    if params.choice is not None:
        if len(params.choice) > limits.max_choices:
            raise ValueError(
                f"structured_outputs.choice has {len(params.choice):,} choices; the limit is "
                f"{limits.max_choices:,} (max_choices)"
            )
        total = sum(len(c) for c in params.choice)
        if total > limits.max_choice_chars:
            raise ValueError(
                f"structured_outputs.choice holds {total:,} characters; the limit is "
                f"{limits.max_choice_chars:,} (max_choice_chars)"
            )


def _check_length(text: str, what: str, limit: int, name: str) -> None:
    if len(text) > limit:
        raise ValueError(f"{what} is {len(text):,} characters long; the limit is {limit:,} ({name})")


def json_options(
    disable_any_whitespace: bool = False, whitespace_pattern: str | None = None
) -> JsonCompileOptions:
    """llguidance's JSON options (also a schema's ``x-guidance`` key inside a Lark ``%json``): compact JSON,
    or json.dumps' separators ", " and ": " (what a chat template's ``tojson`` writes) and no padding."""
    options: JsonCompileOptions = {"whitespace_flexible": not disable_any_whitespace}
    if not disable_any_whitespace:
        options["item_separator"], options["key_separator"] = ", ", ": "
        options["whitespace_pattern"] = whitespace_pattern or BOUNDED_WHITESPACE
    return options
