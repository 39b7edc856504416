"""gpt-oss's harmony output format, read into vLLM's ``reasoning_content`` and ``content``.

A harmony model answers in messages, each ``[<|start|>role] <|channel|>channel [to=recipient]
[<|constrain|>type] <|message|>text`` closed by ``<|end|>``, ``<|return|>`` (the last) or ``<|call|>`` (a
tool call); the prompt already ends with ``<|start|>assistant``. The control tokens are special tokens, so
the engine's text (special tokens skipped) cannot show where a message begins: the parser reads token ids.
As vLLM's parse_chat_output (vllm/entrypoints/harmony_utils.py) does: ``analysis`` messages are the
reasoning, ``final`` ones and ``commentary`` without a recipient (preambles) the content, several joined by
newlines, a message still open counted as far as it goes; a message to a recipient is neither. A message
to ``functions.NAME`` is a tool call (vLLM's ``openai`` tool parser): its text is the call's arguments.
Beyond vLLM: a message without a channel is content, and an output holding no control token at all (a
model that does not speak harmony) is content once it ends, so nothing is lost.

openai-harmony (the reference parser) loads its o200k vocabulary from the network at first use and knows
only that vocabulary's ids; this parser works offline for any tokenizer that has the control tokens.
Parsing is incremental: each call reads only the ids added since the last and decodes only the open
message again, so a stream costs O(new tokens + open message) per step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from backend.server.tool_parsers import ParsedCall

CONTROL_TOKENS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>")
CONSTRAIN_TOKEN = "<|constrain|>"  # optional: a tool call's argument type (`<|constrain|>json`)
REASONING_CHANNELS = ("analysis",)
_RECIPIENT = re.compile(r"to=(\S+)")
FUNCTIONS = "functions."  # the namespace of the request's tools (gpt-oss's template: `namespace functions`)


def token_id(tokenizer: Any, token: str) -> int | None:
    """The id of a token the vocabulary holds whole (an unknown token maps to the unk id: not it)."""
    found = tokenizer.convert_tokens_to_ids(token)
    return found if found is not None and tokenizer.convert_ids_to_tokens(found) == token else None


@dataclass(slots=True, frozen=True)
class HarmonyTokens:
    """The ids of harmony's control tokens in one tokenizer."""

    start: int
    channel: int
    message: int
    ends: frozenset[int]  # <|end|>, <|return|>, <|call|>: a message is complete
    constrain: int | None
    call: int  # <|call|>: a tool call is complete, the model waits for its result

    @classmethod
    def of(cls, tokenizer: Any) -> HarmonyTokens | None:
        """The ids when the tokenizer has every control token as one token (it speaks harmony), else None."""
        found = [i for i in (token_id(tokenizer, token) for token in CONTROL_TOKENS) if i is not None]
        if len(found) < len(CONTROL_TOKENS):
            return None
        start, channel, message, end, returned, call = found
        ends = frozenset((end, returned, call))
        return cls(start, channel, message, ends, token_id(tokenizer, CONSTRAIN_TOKEN), call)

    def is_control(self, token_id: int) -> bool:
        return token_id in (self.start, self.channel, self.message, self.constrain) or token_id in self.ends


@dataclass(slots=True)
class HarmonyMessage:
    channel: str | None  # None: the header named none
    recipient: str | None  # "functions.get_weather" for a tool call
    text: str
    is_complete: bool
    num_tokens: int = 0  # the text's token ids


@dataclass(slots=True)
class ReasoningSplit:
    """An output as vLLM's chat response carries it (None: nothing of that kind)."""

    reasoning: str | None
    content: str | None
    calls: list[ParsedCall] = field(default_factory=list)  # messages to functions.NAME, in order
    reasoning_tokens: int = 0  # the analysis messages' text tokens (the Responses API's usage)


@dataclass(slots=True)
class HarmonyParser:
    """One output's messages, read incrementally: call ``split(token_ids, is_finished)`` with the whole
    output so far each time (the ids only grow)."""

    tokenizer: Any
    tokens: HarmonyTokens
    messages: list[HarmonyMessage] = field(default_factory=list)  # the complete ones
    read: int = 0  # ids consumed
    header: list[int] = field(default_factory=list)  # the open header's ids (role, channel, recipient)
    body: list[int] | None = None  # the open message's text ids, once its <|message|> came
    saw_control: bool = False

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> HarmonyParser | None:
        tokens = HarmonyTokens.of(tokenizer)
        return cls(tokenizer, tokens) if tokens is not None else None

    def feed(self, token_ids: list[int]) -> None:
        for token_id in token_ids[self.read :]:
            self.saw_control |= self.tokens.is_control(token_id)
            if self.body is None:
                if token_id == self.tokens.message:
                    self.body = []
                elif token_id == self.tokens.start or token_id in self.tokens.ends:  # a new header
                    self.header = []
                else:
                    self.header.append(token_id)
            elif token_id in self.tokens.ends:
                self.messages.append(self.message(is_complete=True))
                self.header, self.body = [], None
            elif token_id != self.tokens.start:
                self.body.append(token_id)
        self.read = len(token_ids)

    def message(self, is_complete: bool) -> HarmonyMessage:
        """The open message (its header and the text so far)."""
        channel, recipient = self.read_header()
        text = self.tokenizer.decode(self.body or [], skip_special_tokens=True)
        if not is_complete:
            text = text.rstrip("\ufffd")  # a character whose bytes have not all come yet
        return HarmonyMessage(channel, recipient, text, is_complete, len(self.body or []))

    def read_header(self) -> tuple[str | None, str | None]:
        """(channel, recipient) of the open header: `assistant to=x<|channel|>commentary json` and
        `<|channel|>commentary to=x <|constrain|>json` both name channel commentary and recipient x."""
        segments: list[tuple[int | None, list[int]]] = [(None, [])]  # (the control token opening it, ids)
        for token_id in self.header:
            if token_id in (self.tokens.channel, self.tokens.constrain):
                segments.append((token_id, []))
            else:
                segments[-1][1].append(token_id)
        texts = [(opener, self.tokenizer.decode(ids, skip_special_tokens=True)) for opener, ids in segments]
        channels = [text.split() for opener, text in texts if opener == self.tokens.channel]
        channel = (channels[0][0] if channels[0] else "") if channels else None
        recipient = next((m.group(1) for _, text in texts if (m := _RECIPIENT.search(text))), None)
        return channel, recipient

    def split(self, token_ids: list[int], is_finished: bool = False) -> ReasoningSplit:
        """reasoning_content and content of the output so far (vLLM's parse_chat_output)."""
        self.feed(token_ids)
        messages = [*self.messages, *([self.message(is_complete=False)] if self.body is not None else [])]
        shown = [m for m in messages if m.recipient is None and m.text]  # a tool call is neither
        reasoning = [m.text for m in shown if m.channel in REASONING_CHANNELS]
        content = [m.text for m in shown if m.channel not in REASONING_CHANNELS]
        if is_finished and not self.saw_control:  # not harmony at all: the text is the answer
            content = [self.tokenizer.decode(token_ids, skip_special_tokens=True)]
        calls = [
            ParsedCall((m.recipient or "")[len(FUNCTIONS) :], m.text, m.is_complete)
            for m in messages
            if (m.recipient or "").startswith(FUNCTIONS) and len(m.recipient or "") > len(FUNCTIONS)
        ]
        thought = sum(m.num_tokens for m in messages if m.channel in REASONING_CHANNELS)
        return ReasoningSplit("\n".join(reasoning) or None, "\n".join(content) or None, calls, thought)


@dataclass(slots=True)
class ReasoningStream:
    """What one streamed choice has sent of its reasoning and content (vLLM's streaming deltas: the new
    part of each, the whole when an earlier part changed)."""

    parser: HarmonyParser
    sent_reasoning: str = ""
    sent_content: str = ""
    calls: list[ParsedCall] = field(default_factory=list)  # the tool calls as of the last delta

    def delta(self, token_ids: list[int], is_finished: bool) -> dict[str, Any]:
        split = self.parser.split(token_ids, is_finished)
        self.calls = split.calls
        delta: dict[str, Any] = {}
        for key, now, sent in (
            ("reasoning_content", split.reasoning or "", self.sent_reasoning),
            ("content", split.content or "", self.sent_content),
        ):
            new = now[len(sent) :] if now.startswith(sent) else now
            if new:
                delta[key] = new
        self.sent_reasoning, self.sent_content = split.reasoning or "", split.content or ""
        return delta
