"""OpenAI response bodies built from the engine's cumulative RequestOutputs.

A formatter remembers, per choice, how much text and how many tokens it has sent, so that streaming
chunks carry only the new part; the same formatter builds the non-streaming body from the last outputs.
A response has one choice per prompt and sample: choice index = prompt index * n + sample index (as
vLLM and OpenAI number them); a streamed chunk carries one choice. Usage counts each prompt once and the
tokens of every choice.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from backend.engine.outputs import Logprob
from backend.server.harmony import HarmonyParser, HarmonyTokens, ReasoningStream
from backend.server.tool_calls import ToolCallFormatter
from backend.server.tool_parsers import ToolParser

# OpenAI's JSON has no -inf: vLLM sends -9999.0 for a logprob of -inf (clamp_prompt_logprobs)
MIN_JSON_LOGPROB = -9999.0


@dataclass(slots=True)
class ChoiceStream:
    """What one choice has been sent so far."""

    sent_chars: int = 0
    sent_tokens: int = 0
    text_offset: int = 0  # the legacy completions logprobs' offset of the next token
    started: bool = False  # chat: its role sent; completions: its prompt echoed


def prompt_logprobs_json(entries: list[dict[int, Logprob] | None] | None) -> list | None:
    """vLLM's `prompt_logprobs` field: per prompt token None or {token id: {logprob, rank, decoded_token}}."""
    if entries is None:
        return None
    return [
        None
        if entry is None
        else {
            str(token_id): {
                "logprob": max(lp.logprob, MIN_JSON_LOGPROB),
                "rank": lp.rank,
                "decoded_token": lp.decoded_token,
            }
            for token_id, lp in entry.items()
        }
        for entry in entries
    ]


class ResponseFormatter:
    """Shared state and logprob conversion; subclasses shape chat or completion bodies."""

    object_name = ""
    chunk_object_name = ""
    id_prefix = ""

    def __init__(self, model: str, tokenizer, top_logprobs: int | None, n: int = 1):
        self.id = f"{self.id_prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.tokenizer = tokenizer
        self.top_logprobs = top_logprobs
        self.n = n
        self.streams: dict[int, ChoiceStream] = {}

    def choice_index(self, prompt_index: int, sample_index: int) -> int:
        return prompt_index * self.n + sample_index

    def stream(self, index: int) -> ChoiceStream:
        return self.streams.setdefault(index, ChoiceStream())

    def envelope(self, obj: str, choices: list[dict], **extra) -> dict:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }

    def usage(self, outputs: list) -> dict:
        prompt = sum(len(out.prompt_token_ids) for out in outputs)
        completion = sum(len(comp.token_ids) for out in outputs for comp in out.outputs)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def take_delta(self, stream: ChoiceStream, comp) -> tuple[str, list[int], list | None]:
        """New text, new token ids and their logprob dicts of one choice since the last call."""
        text, ids = comp.text[stream.sent_chars :], comp.token_ids[stream.sent_tokens :]
        logprobs = comp.logprobs[stream.sent_tokens :] if comp.logprobs is not None else None
        stream.sent_chars, stream.sent_tokens = len(comp.text), len(comp.token_ids)
        return text, ids, logprobs

    def token_text(self, token_id: int, entry) -> str:
        decoded = entry.decoded_token if entry is not None else None
        return decoded if decoded is not None else self.tokenizer.decode([token_id])

    def ranked(self, entries: dict[int, Logprob]) -> list[tuple[int, Logprob]]:
        """The top-N alternatives of one position, most likely first."""
        ordered = sorted(entries.items(), key=lambda kv: kv[1].rank)
        return [(tid, lp) for tid, lp in ordered if lp.rank <= (self.top_logprobs or 0)]

    def chunk_envelope(self, choice: dict, include_usage: bool) -> dict:
        extra = {"usage": None} if include_usage else {}
        return self.envelope(self.chunk_object_name, [choice], **extra)

    def usage_chunk(self, outputs: list) -> dict:
        return self.envelope(self.chunk_object_name, [], usage=self.usage(outputs))

    # The body shapes each subclass writes (chat.completion or text_completion, whole or streamed).
    def first_chunks(self, include_usage: bool) -> list[dict]:
        raise NotImplementedError

    def chunks(self, prompt_index: int, output, include_usage: bool) -> list[dict]:
        """The streamed chunks (one choice each) for what output, of prompt prompt_index, adds."""
        raise NotImplementedError

    def response(self, outputs: list) -> dict:
        """The whole body from each prompt's last output, in prompt order."""
        raise NotImplementedError


class ChatFormatter(ResponseFormatter):
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"
    id_prefix = "chatcmpl"

    def __init__(
        self,
        model: str,
        tokenizer,
        top_logprobs: int | None,
        tool_parser: ToolParser | None,
        n: int = 1,
        harmony: HarmonyTokens | None = None,
    ):
        super().__init__(model, tokenizer, top_logprobs, n)
        self.tool_parser = tool_parser
        self.tools: dict[int, ToolCallFormatter] = {}  # per choice
        # gpt-oss's harmony channels -> reasoning_content and content (harmony.py), read from token ids;
        # the parser keeps state per output, so each choice has its own; with the `openai` tool parser its
        # messages to functions.NAME are the tool calls
        use_harmony = tool_parser is None or tool_parser.reads_harmony
        self.harmony = harmony if use_harmony else None
        self.reasonings: dict[int, ReasoningStream] = {}  # per choice

    def tool_formatter(self, index: int) -> ToolCallFormatter | None:
        if self.tool_parser is None:
            return None
        return self.tools.setdefault(index, ToolCallFormatter(self.tool_parser))

    def reasoning_stream(self, index: int) -> ReasoningStream | None:
        if self.harmony is None:
            return None
        if index not in self.reasonings:
            self.reasonings[index] = ReasoningStream(HarmonyParser(self.tokenizer, self.harmony))
        return self.reasonings[index]

    def logprobs(self, ids: list[int], logprobs: list | None) -> dict | None:
        if logprobs is None or self.top_logprobs is None:
            return None
        content = []
        for tid, entries in zip(ids, logprobs, strict=True):
            token = self.token_text(tid, entries.get(tid))
            alternatives = [
                {"token": (t := self.token_text(alt, lp)), "logprob": lp.logprob, "bytes": list(t.encode())}
                for alt, lp in self.ranked(entries)
            ]
            content.append(
                {
                    "token": token,
                    "logprob": entries[tid].logprob,
                    "bytes": list(token.encode()),
                    "top_logprobs": alternatives,
                }
            )
        return {"content": content}

    def first_chunks(self, include_usage: bool) -> list[dict]:
        return [
            self.chunk_envelope(
                {
                    "index": index,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                },
                include_usage,
            )
            for index in range(self.n)
        ]

    def chunks(self, prompt_index: int, output, include_usage: bool) -> list[dict]:
        out = []
        for comp in output.outputs:
            choice = self.choice_chunk(comp)
            if choice is not None:
                out.append(self.chunk_envelope(choice, include_usage))
        return out

    def choice_chunk(self, comp) -> dict | None:
        text, ids, logprobs = self.take_delta(self.stream(comp.index), comp)
        finish_reason, called = comp.finish_reason, False
        delta: dict[str, Any] = {"content": text} if text else {}
        tools = self.tool_formatter(comp.index)
        reasoning = self.reasoning_stream(comp.index)
        if reasoning is not None:
            delta = reasoning.delta(comp.token_ids, finish_reason is not None)
            if tools is not None and (updates := tools.call_updates(reasoning.calls)):
                delta["tool_calls"] = updates  # harmony's calls (the openai parser)
            called = tools is not None and bool(tools.sent_arguments)
        elif tools is not None:
            delta, called = tools.delta(comp.text, finish_reason is not None)
        finish_reason = "tool_calls" if called and finish_reason == "stop" else finish_reason
        parsed = tools is not None or self.harmony is not None
        quiet = not ids or (parsed and self.top_logprobs is None)  # no empty deltas for a header's tokens
        if not delta and finish_reason is None and quiet:
            return None
        return {
            "index": comp.index,
            "delta": delta,
            "logprobs": self.logprobs(ids, logprobs),
            "finish_reason": finish_reason,
        }

    def message(self, comp) -> tuple[dict, str | None]:
        """The whole message of one choice and its finish reason: tool calls read by the tool parser, or
        harmony's channels as reasoning_content and content, else the text."""
        message: dict[str, Any] = {"role": "assistant", "content": comp.text}
        finish_reason = comp.finish_reason
        tools = self.tool_formatter(comp.index)
        reasoning = self.reasoning_stream(comp.index)
        called = False
        if reasoning is not None:
            split = reasoning.parser.split(comp.token_ids, is_finished=True)
            message |= {"content": split.content, "reasoning_content": split.reasoning}
            if tools is not None:  # harmony's calls (the openai parser), as vLLM's harmony path returns them
                message["tool_calls"] = tools.tool_calls(split.calls)
                called = bool(message["tool_calls"])
        elif tools is not None:
            message, called = tools.message(comp.text)
        finish_reason = "tool_calls" if called and finish_reason == "stop" else finish_reason
        return message, finish_reason

    def response(self, outputs: list) -> dict:
        (output,) = outputs  # a chat request has one prompt
        choices = []
        for comp in output.outputs:
            message, finish_reason = self.message(comp)
            choices.append(
                {
                    "index": comp.index,
                    "message": message,
                    "logprobs": self.logprobs(comp.token_ids, comp.logprobs),
                    "finish_reason": finish_reason,
                    "stop_reason": comp.stop_reason,
                }
            )
        extra = {"prompt_logprobs": prompt_logprobs_json(output.prompt_logprobs)}
        if extra["prompt_logprobs"] is None:
            extra = {}
        return self.envelope(self.object_name, choices, usage=self.usage(outputs), **extra)
