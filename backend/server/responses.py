"""OpenAI response bodies built from the engine's cumulative RequestOutputs.

A formatter remembers how much text and how many tokens it has sent, so that streaming chunks carry
only the new part; the same formatter builds the non-streaming body from the last output.
"""

from __future__ import annotations

import time
import uuid

from backend.engine.outputs import Logprob
from backend.server.harmony import HarmonyParser, ReasoningStream
from backend.server.tool_calls import ToolCallFormatter
from backend.server.tool_parsers import ToolParser


class ResponseFormatter:
    """Shared state and logprob conversion; subclasses shape chat or completion bodies."""

    object_name = ""
    chunk_object_name = ""
    id_prefix = ""

    def __init__(self, model: str, tokenizer, top_logprobs: int | None):
        self.id = f"{self.id_prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.tokenizer = tokenizer
        self.top_logprobs = top_logprobs
        self.sent_chars = 0
        self.sent_tokens = 0

    def envelope(self, obj: str, choices: list[dict], **extra) -> dict:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }

    @staticmethod
    def usage(output) -> dict:
        prompt, completion = len(output.prompt_token_ids), len(output.outputs[0].token_ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def take_delta(self, output) -> tuple[str, list[int], list | None]:
        """New text, new token ids and their logprob dicts since the last call."""
        comp = output.outputs[0]
        text, ids = comp.text[self.sent_chars :], comp.token_ids[self.sent_tokens :]
        logprobs = comp.logprobs[self.sent_tokens :] if comp.logprobs is not None else None
        self.sent_chars, self.sent_tokens = len(comp.text), len(comp.token_ids)
        return text, ids, logprobs

    def token_text(self, token_id: int, entry) -> str:
        decoded = entry.decoded_token if entry is not None else None
        return decoded if decoded is not None else self.tokenizer.decode([token_id])

    def ranked(self, entries: dict[int, Logprob]) -> list[tuple[int, Logprob]]:
        """The top-N alternatives of one position, most likely first."""
        ordered = sorted(entries.items(), key=lambda kv: kv[1].rank)
        return [(tid, lp) for tid, lp in ordered if lp.rank <= (self.top_logprobs or 0)]

    # The body shapes each subclass writes (chat.completion or text_completion, whole or streamed).
    def first_chunk(self, include_usage: bool) -> dict | None:
        raise NotImplementedError

    def chunk(self, output, include_usage: bool) -> dict | None:
        raise NotImplementedError

    def usage_chunk(self, output) -> dict:
        raise NotImplementedError

    def response(self, output) -> dict:
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
        harmony: HarmonyParser | None = None,
    ):
        super().__init__(model, tokenizer, top_logprobs)
        self.tools = ToolCallFormatter(tool_parser) if tool_parser is not None else None
        # gpt-oss's harmony channels -> reasoning_content and content (harmony.py), read from token ids
        self.reasoning = ReasoningStream(harmony) if harmony is not None else None

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

    def first_chunk(self, include_usage: bool) -> dict:
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return self._chunk([choice], include_usage)

    def chunk(self, output, include_usage: bool) -> dict | None:
        text, ids, logprobs = self.take_delta(output)
        finish_reason = output.outputs[0].finish_reason
        delta = {"content": text} if text else {}
        if self.tools is not None:
            delta, called = self.tools.delta(output.outputs[0].text, finish_reason is not None)
            finish_reason = "tool_calls" if called and finish_reason == "stop" else finish_reason
        elif self.reasoning is not None:
            delta = self.reasoning.delta(output.outputs[0].token_ids, finish_reason is not None)
        parsed = self.tools is not None or self.reasoning is not None
        quiet = not ids or (parsed and self.top_logprobs is None)  # no empty deltas for a header's tokens
        if not delta and finish_reason is None and quiet:
            return None
        choice = {
            "index": 0,
            "delta": delta,
            "logprobs": self.logprobs(ids, logprobs),
            "finish_reason": finish_reason,
        }
        return self._chunk([choice], include_usage)

    def usage_chunk(self, output) -> dict:
        return self.envelope(self.chunk_object_name, [], usage=self.usage(output))

    def _chunk(self, choices: list[dict], include_usage: bool) -> dict:
        extra = {"usage": None} if include_usage else {}
        return self.envelope(self.chunk_object_name, choices, **extra)

    def response(self, output) -> dict:
        comp = output.outputs[0]
        message, finish_reason = {"role": "assistant", "content": comp.text}, comp.finish_reason
        if self.tools is not None:
            message, called = self.tools.message(comp.text)
            finish_reason = "tool_calls" if called and finish_reason == "stop" else finish_reason
        elif self.reasoning is not None:
            split = self.reasoning.parser.split(comp.token_ids, is_finished=True)
            message |= {"content": split.content, "reasoning_content": split.reasoning}
        choice = {
            "index": 0,
            "message": message,
            "logprobs": self.logprobs(comp.token_ids, comp.logprobs),
            "finish_reason": finish_reason,
            "stop_reason": comp.stop_reason,
        }
        return self.envelope(self.object_name, [choice], usage=self.usage(output))


class CompletionFormatter(ResponseFormatter):
    object_name = "text_completion"
    chunk_object_name = "text_completion"
    id_prefix = "cmpl"

    def __init__(self, model: str, tokenizer, top_logprobs: int | None):
        super().__init__(model, tokenizer, top_logprobs)
        self.text_offset = 0

    def logprobs(self, ids: list[int], logprobs: list | None) -> dict | None:
        if logprobs is None or self.top_logprobs is None:
            return None
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for tid, entries in zip(ids, logprobs, strict=True):
            token = self.token_text(tid, entries.get(tid))
            out["tokens"].append(token)
            out["token_logprobs"].append(entries[tid].logprob)
            out["top_logprobs"].append({self.token_text(a, lp): lp.logprob for a, lp in self.ranked(entries)})
            out["text_offset"].append(self.text_offset)
            self.text_offset += len(token)
        return out

    def first_chunk(self, include_usage: bool) -> None:
        return None

    def chunk(self, output, include_usage: bool) -> dict | None:
        text, ids, logprobs = self.take_delta(output)
        finish_reason = output.outputs[0].finish_reason
        if not text and not ids and finish_reason is None:
            return None
        choice = {
            "index": 0,
            "text": text,
            "logprobs": self.logprobs(ids, logprobs),
            "finish_reason": finish_reason,
        }
        extra = {"usage": None} if include_usage else {}
        return self.envelope(self.chunk_object_name, [choice], **extra)

    def usage_chunk(self, output) -> dict:
        return self.envelope(self.chunk_object_name, [], usage=self.usage(output))

    def response(self, output) -> dict:
        comp = output.outputs[0]
        choice = {
            "index": 0,
            "text": comp.text,
            "logprobs": self.logprobs(comp.token_ids, comp.logprobs),
            "finish_reason": comp.finish_reason,
            "stop_reason": comp.stop_reason,
        }
        return self.envelope(self.object_name, [choice], usage=self.usage(output))
