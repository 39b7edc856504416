"""Tool-call parsers: find function calls in a model's text output (vLLM's ``--tool-call-parser`` names).

Every parser reads the whole text generated so far and returns the content safe to show plus the calls
found, each with its name and the raw text of its arguments up to where generation has reached. Calls
only ever grow, so streaming sends the difference from the previous parse, and the final parse gives the
non-streamed response: both agree by construction.

Formats: ``hermes`` (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, as Qwen2.5/3 and
Hermes emit), ``llama3_json`` (``{"name": ..., "parameters": {...}}``, ``;``-separated, as Llama 3.1/3.2
emit), ``openai`` (gpt-oss's harmony messages to ``functions.NAME``, read from token ids by
``harmony.py``), and two internal ones for constrained output: ``required`` (vLLM's JSON array of
``{"name", "parameters"}``) and ``named`` (the arguments object of one known function).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

_CALL_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


@dataclass(slots=True)
class ParsedCall:
    name: str | None  # None until the name is complete
    arguments: str = ""  # raw JSON text of the arguments so far
    is_complete: bool = False


@dataclass(slots=True)
class ParsedOutput:
    content: str
    calls: list[ParsedCall] = field(default_factory=list)
    reasoning: str = ""  # harmony's analysis channel (gpt-oss); empty for other models
    reasoning_tokens: int = 0  # its token count


def value_end(text: str, start: int) -> int | None:
    """Index just past the JSON object/array opening at text[start]; None while it is still open."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def parse_call(text: str, start: int, final: bool) -> tuple[ParsedCall | None, int | None]:
    """The call object whose '{' is at text[start], and the index past it (None while open)."""
    end = value_end(text, start)
    head = _CALL_HEAD.match(text, start)
    if head is not None:
        args_start = head.end()
        if args_start >= len(text):
            return ParsedCall(json.loads(f'"{head.group(1)}"')), end
        args_end = value_end(text, args_start) if text[args_start] in "{[" else None
        arguments = text[args_start : args_end if args_end is not None else len(text)]
        return ParsedCall(json.loads(f'"{head.group(1)}"'), arguments, args_end is not None), end
    if end is None or not final:
        return None, end
    try:  # keys in another order: only the complete object can be read
        obj = json.loads(text[start:end])
        args = obj.get("arguments", obj.get("parameters", {}))
        return ParsedCall(str(obj["name"]), json.dumps(args, ensure_ascii=False), True), end
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, end


def _skip(text: str, i: int, chars: str) -> int:
    while i < len(text) and text[i] in chars:
        i += 1
    return i


def _call_list(text: str, pos: int, final: bool, separators: str) -> list[ParsedCall]:
    """Consecutive call objects from text[pos], separated by any of ``separators``."""
    calls = []
    while pos < len(text) and text[pos] == "{":
        call, end = parse_call(text, pos, final)
        if call is not None:
            calls.append(call)
        if end is None:
            break
        pos = _skip(text, end, separators)
    return calls


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of text that could be the start of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ToolParser:
    """Parse the text generated so far; ``final`` once generation has ended."""

    reads_harmony = False  # True: the calls are harmony messages, read from token ids (harmony.py)

    def parse(self, text: str, final: bool) -> ParsedOutput:
        raise NotImplementedError


class HermesToolParser(ToolParser):
    start_tag, end_tag = "<tool_call>", "</tool_call>"

    def parse(self, text: str, final: bool) -> ParsedOutput:
        first = text.find(self.start_tag)
        if first == -1:
            hold = 0 if final else _partial_suffix(text, self.start_tag)
            return ParsedOutput(text[: len(text) - hold])
        out = ParsedOutput(text[:first])
        pos = first
        while pos != -1:
            body = _skip(text, pos + len(self.start_tag), " \n\t\r")
            if body >= len(text) or text[body] != "{":
                break
            call, end = parse_call(text, body, final)
            if call is not None:
                out.calls.append(call)
            if end is None:
                break
            pos = text.find(self.start_tag, end)
        if final and not out.calls:
            out.content = text
        return out


class Llama3JsonToolParser(ToolParser):
    python_tag = "<|python_tag|>"

    def parse(self, text: str, final: bool) -> ParsedOutput:
        stripped = text.lstrip()
        if stripped.startswith(self.python_tag):
            stripped = stripped[len(self.python_tag) :].lstrip()
        if not stripped.startswith("{"):
            undecided = not final and (not stripped or self.python_tag.startswith(stripped))
            return ParsedOutput("" if undecided else text)
        out = ParsedOutput("", _call_list(stripped, 0, final, " \n\t\r;"))
        if final and not out.calls:
            out.content = text
        return out


class RequiredToolParser(ToolParser):
    """Output constrained to vLLM's ``[{"name": ..., "parameters": {...}}, ...]``."""

    def parse(self, text: str, final: bool) -> ParsedOutput:
        pos = _skip(text, 0, " \n\t\r")
        if pos >= len(text) or text[pos] != "[":
            return ParsedOutput("")
        return ParsedOutput("", _call_list(text, _skip(text, pos + 1, " \n\t\r"), final, " \n\t\r,"))


class NamedToolParser(ToolParser):
    """Output constrained to the arguments of one known function."""

    def __init__(self, name: str) -> None:
        self.name = name

    def parse(self, text: str, final: bool) -> ParsedOutput:
        start = _skip(text, 0, " \n\t\r")
        end = value_end(text, start) if start < len(text) else None
        arguments = text[start : end if end is not None else len(text)]
        return ParsedOutput("", [ParsedCall(self.name, arguments, end is not None)])


class OpenAIToolParser(ToolParser):
    """vLLM's ``openai`` parser (gpt-oss): a call is a harmony message to ``functions.NAME`` whose text is
    its arguments. Harmony's control tokens are special tokens, absent from the text, so the calls are read
    from token ids (``harmony.HarmonyParser.split``); this class only names the choice."""

    reads_harmony = True

    def parse(self, text: str, final: bool) -> ParsedOutput:
        raise TypeError("the openai tool parser reads harmony token ids (harmony.HarmonyParser), not text")


TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "openai": OpenAIToolParser,
}
