"""Tool-calling and structured-output flags for each engine, chosen from the model's family.

The tool-call format is a fact of the model family (Qwen2.5/3, QwQ and Hermes emit Hermes-style
``<tool_call>`` JSON; Llama 3.1-3.3 emit ``{"name", "parameters"}`` JSON; gpt-oss writes harmony messages
to ``functions.NAME``, vLLM's ``openai`` parser), and each engine names its
parser for that format differently. The grammar backend is llguidance everywhere it can be chosen, the
one the playground's own engine uses, so constrained output behaves the same after export.
"""

from __future__ import annotations

import re

FAMILIES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"qwen2\.5|qwen3|qwq|hermes", re.IGNORECASE), "hermes"),
    (re.compile(r"llama-?3\.[123]", re.IGNORECASE), "llama3_json"),
    (re.compile(r"gpt-oss", re.IGNORECASE), "openai"),
)
# vLLM parser name -> the engine's name for the same format. SGLang: docs "Tool Parser" (qwen25, llama3),
# function_call_parser.py's ToolCallParserEnum (gpt-oss).
PARSER_NAMES: dict[str, dict[str, str]] = {
    "vllm": {"hermes": "hermes", "llama3_json": "llama3_json", "openai": "openai"},
    "sglang": {"hermes": "qwen25", "llama3_json": "llama3", "openai": "gpt-oss"},
    "embedded": {"hermes": "hermes", "llama3_json": "llama3_json", "openai": "openai"},
}


def tool_call_parser(model: str) -> str | None:
    """vLLM's ``--tool-call-parser`` name for the model's family; None when the family is unknown."""
    for pattern, parser in FAMILIES:
        if pattern.search(model):
            return parser
    return None


def tool_calling_flags(engine: str, model: str) -> list[str]:
    """Flags that serve tool_choice="auto" (when the family is known) and pick llguidance for grammars.

    TGI needs none: its grammar support and tool calling are on unless ``--disable-grammar-support``.
    """
    parser = tool_call_parser(model)
    name = PARSER_NAMES.get(engine, {}).get(parser or "")
    if engine == "vllm":
        flags = ["--enable-auto-tool-choice", "--tool-call-parser", name] if name else []
        return [*flags, "--structured-outputs-config", '{"backend":"guidance"}']
    if engine == "sglang":
        flags = ["--tool-call-parser", name] if name else []
        return [*flags, "--grammar-backend", "llguidance"]
    if engine == "embedded" and name:
        return ["--enable-auto-tool-choice", "--tool-call-parser", name]
    return []
