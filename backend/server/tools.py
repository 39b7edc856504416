"""Tool calling on /v1/chat/completions: request shapes, prompt rendering, constraint and parser choice.

``tool_choice``: "none" (tools may be shown, never parsed), "auto" (the model decides; its output is
parsed by the server's ``--tool-call-parser``, which needs ``--enable-auto-tool-choice``, as in vLLM),
"required" (output constrained to vLLM's JSON list of calls over the tools' schemas) or a named function
(output constrained to that function's parameters). Constrained calls always parse. A model that speaks
harmony (gpt-oss) is constrained to its own call shape instead: it may reason first, then writes one
message to ``functions.NAME`` (``harmony_tool_constraint``), read back by the ``openai`` parser.

Tools reach the model through its chat template (``apply_chat_template(tools=...)``). A template that
does not render tools (no ``tools`` in its source) gets them as a Hermes-style system prompt, and the
assistant's earlier calls and the tool results become ``<tool_call>`` / ``<tool_response>`` text.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from backend.engine.grammar_limits import json_options
from backend.engine.sampling_params import StructuredOutputsParams
from backend.server.errors import OpenAIError
from backend.server.tool_parsers import (
    TOOL_PARSERS,
    NamedToolParser,
    OpenAIToolParser,
    RequiredToolParser,
    ToolParser,
)

HERMES_TOOLS_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""  # the tools block of Qwen2.5's chat template


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class Tool(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class FunctionName(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionName


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


def resolve_tool_choice(tools: list[Tool] | None, tool_choice: ToolChoice | None) -> ToolChoice:
    """OpenAI's default: "auto" when tools are given, "none" otherwise; checks names and presence."""
    if tool_choice is None:
        return "auto" if tools else "none"
    if tool_choice != "none" and not tools:
        raise OpenAIError(400, f"tool_choice={_describe(tool_choice)} needs `tools`", param="tool_choice")
    if isinstance(tool_choice, NamedToolChoice):
        names = [t.function.name for t in tools or []]
        if tool_choice.function.name not in names:
            raise OpenAIError(
                400,
                f"tool_choice names the function {tool_choice.function.name!r}, which is not among the "
                f"tools ({', '.join(names)})",
                param="tool_choice",
            )
    return tool_choice


def _describe(tool_choice: ToolChoice) -> str:
    return tool_choice.function.name if isinstance(tool_choice, NamedToolChoice) else repr(tool_choice)


def tool_constraint(
    tools: list[Tool] | None, tool_choice: ToolChoice, parallel_tool_calls: bool = True
) -> StructuredOutputsParams | None:
    """The grammar that makes "required" and named calls always parse (None for "none" and "auto");
    ``parallel_tool_calls=False`` allows exactly one call."""
    if isinstance(tool_choice, NamedToolChoice):
        function = next(t.function for t in tools or [] if t.function.name == tool_choice.function.name)
        return StructuredOutputsParams(json=function.parameters)
    if tool_choice != "required":
        return None
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": t.function.name}, "parameters": t.function.parameters},
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for t in tools or []
    ]
    schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if not parallel_tool_calls:
        schema["maxItems"] = 1
    return StructuredOutputsParams(json=schema)


def harmony_tool_constraint(
    tools: list[Tool] | None, tool_choice: ToolChoice
) -> StructuredOutputsParams | None:
    """The grammar that makes "required" and named calls always parse for a harmony model (gpt-oss), in
    the shape it was trained to write (OpenAI's harmony format): an optional analysis message (its
    reasoning, unconstrained), then one commentary message to ``functions.NAME``, constrained to json,
    whose text is the arguments as compact JSON (as OpenAI's harmony guide writes a call; with free
    whitespace a model may pad the arguments until max_tokens), closed by ``<|call|>`` (where harmony
    stops: one call per turn). None for "none" and "auto". Names are ``[A-Za-z0-9_.-]``
    (FunctionDefinition), safe in Lark."""
    if isinstance(tool_choice, NamedToolChoice):
        functions = [t.function for t in tools or [] if t.function.name == tool_choice.function.name]
    elif tool_choice == "required":
        functions = [t.function for t in tools or []]
    else:
        return None
    rules = [
        "start: analysis? (" + " | ".join(f"call_{i}" for i in range(len(functions))) + ")",
        'analysis: <|channel|> "analysis" <|message|> THINK <|end|> <|start|> "assistant"',
        "THINK: /(?s:.*)/",
    ]
    for i, function in enumerate(functions):
        head = f'<|channel|> "commentary to=functions.{function.name} " <|constrain|> "json" <|message|>'
        compact = {"x-guidance": json_options(disable_any_whitespace=True)}
        schema = compact | function.parameters  # a tool's own x-guidance wins
        rules += [f"call_{i}: {head} args_{i} <|call|>", f"args_{i}: %json {json.dumps(schema)}"]
    return StructuredOutputsParams(grammar="\n".join(rules))


def tool_parser(
    tool_choice: ToolChoice, parser_name: str | None, enable_auto_tool_choice: bool, harmony: bool = False
) -> ToolParser | None:
    """How to read tool calls out of the output of a request with this tool_choice; a forced call from a
    harmony model (``harmony``) is a harmony message, read by the ``openai`` parser whatever the server's."""
    if harmony and (tool_choice == "required" or isinstance(tool_choice, NamedToolChoice)):
        return OpenAIToolParser()
    if isinstance(tool_choice, NamedToolChoice):
        return NamedToolParser(tool_choice.function.name)
    if tool_choice == "required":
        return RequiredToolParser()
    if tool_choice == "auto":
        if not enable_auto_tool_choice or parser_name is None:
            raise OpenAIError(
                400,
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set '
                'on the server; send tool_choice="required", a named function or "none" instead',
                param="tool_choice",
            )
        return TOOL_PARSERS[parser_name]()
    return None


def hermes_call(function: dict) -> str:
    head = json.dumps({"name": function["name"]})[:-1]
    return f'<tool_call>\n{head}, "arguments": {function["arguments"] or "{}"}}}\n</tool_call>'


def template_renders_tools(tokenizer: Any) -> bool:
    return "tools" in (getattr(tokenizer, "chat_template", None) or "")


def native_calls(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message's calls with their arguments as objects, as templates expect them (gpt-oss's
    writes ``arguments|tojson``) and as vLLM hands them over (chat_utils' ``_postprocess_messages``)."""
    calls = []
    for call in message["tool_calls"]:
        arguments = call["function"].get("arguments") or "{}"
        try:
            decoded = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            raise OpenAIError(
                400,
                f"tool call {call['function']['name']!r} has arguments that are not JSON: {arguments[:80]!r}",
                param="messages",
            ) from None
        calls.append(call | {"function": call["function"] | {"arguments": decoded}})
    return message | {"tool_calls": calls}


def render_messages(messages: list[dict[str, Any]], tools: list[Tool] | None, native: bool) -> list[dict]:
    """Messages for a template; when it cannot render tools (``native`` False), tools and calls become
    Hermes-style text, so any chat model sees them."""
    if native:
        return [native_calls(m) if m.get("tool_calls") else m for m in messages]
    if not tools and not any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
        return messages
    out = []
    for m in messages:
        if m["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"})
        elif m.get("tool_calls"):
            calls = "\n".join(hermes_call(c["function"]) for c in m["tool_calls"])
            out.append({"role": "assistant", "content": ((m.get("content") or "") + "\n" + calls).strip()})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    if tools:
        listing = "\n".join(json.dumps(t.model_dump()) for t in tools)
        prompt = HERMES_TOOLS_PROMPT.format(tools=listing)
        if out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out
