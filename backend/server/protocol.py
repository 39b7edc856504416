"""OpenAI request bodies (the parameters we honour) and their translation to SamplingParams.

Unknown fields are ignored, as OpenAI-compatible servers do; fields we cannot honour (best_of, suffix,
echo on chat) are refused with a message that says so.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, model_validator

from backend.engine.sampling_params import SEED_MAX, SEED_MIN, StructuredOutputsParams
from backend.server.errors import OpenAIError
from backend.server.json_values import check_json_values, check_list_lengths
from backend.server.limits import MAX_TOOLS
from backend.server.structured import ResponseFormat
from backend.server.tools import Tool, ToolCall, ToolChoice

T = TypeVar("T")
# A list field that stops at its first invalid item: a million bad items make one error, not a million
# (pydantic's fail_fast); every list a client sends is one of these.
FailFastList = Annotated[list[T], Field(fail_fast=True)]
# Ours: a conversation of more messages than this fits no context we serve (each message costs a few
# template tokens), and a batch of more prompts is what a benchmark client would split anyway
MAX_MESSAGES = 4096
MAX_CONTENT_PARTS = 4096  # text parts and earlier tool calls, across all messages
MAX_BATCH_PROMPTS = 2048
MAX_N = 128  # OpenAI's API reference bounds n to [1, 128]
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs, for logprobs and prompt_logprobs alike


class StrictJSON(BaseModel):
    """Base of the request bodies: the whole raw body is checked once, before field validation: list
    lengths against ``list_limits``, then every value (check_json_values)."""

    list_limits: ClassVar[dict[str, int]] = {}

    @model_validator(mode="before")
    @classmethod
    def _standard_json_only(cls, data: Any) -> Any:
        check_list_lengths(data, cls.list_limits)
        check_json_values(data)
        return data


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(StrictJSON):
    """Parameters shared by /v1/completions and /v1/chat/completions (plus vLLM's extras)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | FailFastList[str] | None = None
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)  # torch.Generator's 64-bit range
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    user: str | None = None
    # vLLM's extra sampling parameters
    top_k: int | None = Field(None, ge=-1)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0)
    ignore_eos: bool = False
    stop_token_ids: FailFastList[int] | None = None
    skip_special_tokens: bool = True
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsParams | None = None
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    logit_bias: dict[int, float] | None = None  # OpenAI's; JSON keys are token ids as strings


class CompletionRequest(SamplingFields):
    prompt: str | FailFastList[int] | FailFastList[str] | FailFastList[FailFastList[int]]

    @model_validator(mode="before")
    @classmethod
    def _bounded_batch(cls, data: Any) -> Any:
        """A batch of prompts (strings or token-id lists) at most MAX_BATCH_PROMPTS long; one prompt of
        token ids is bounded by the body and the context (ints validate in ~30 ns each)."""
        prompt = data.get("prompt") if isinstance(data, dict) else None
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list | str):
            check_list_lengths({"prompt": prompt}, {"prompt": MAX_BATCH_PROMPTS})
        return data

    max_tokens: int | None = Field(16, ge=0)  # OpenAI's default for completions; 0 only with echo
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool"]
    content: str | FailFastList[TextPart] | None = None
    tool_calls: FailFastList[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool result: the call it answers


class ChatCompletionRequest(SamplingFields):
    # strings and ints validate in ~20-30 ns each, so stop and token-id lists are left to the body limit
    # and to SamplingParams' own counts; each message or tool costs ~10 us
    list_limits: ClassVar[dict[str, int]] = {"messages": MAX_MESSAGES, "tools": MAX_TOOLS}

    messages: Annotated[list[ChatMessage], Field(min_length=1, fail_fast=True)]
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False  # refused: /v1/completions echoes prompts
    tools: FailFastList[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    # OpenAI's reasoning models' knob; gpt-oss's chat template writes it into the system message
    reasoning_effort: Literal["low", "medium", "high"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _bounded_parts(cls, data: Any) -> Any:
        """Content parts and earlier tool calls, counted over the (bounded) messages before validation."""
        messages = data.get("messages") if isinstance(data, dict) else None
        if isinstance(messages, list) and len(messages) <= MAX_MESSAGES:
            parts = sum(
                len(m.get("content") or []) * isinstance(m.get("content"), list)
                + len(m.get("tool_calls") or []) * isinstance(m.get("tool_calls"), list)
                for m in messages
                if isinstance(m, dict)
            )
            if parts > MAX_CONTENT_PARTS:
                raise ValueError(
                    f"messages hold {parts:,} content parts and tool calls; the limit is "
                    f"{MAX_CONTENT_PARTS:,}"
                )
        return data


def refuse_unsupported(req: SamplingFields) -> None:
    if req.prompt_logprobs is not None and req.stream:
        raise OpenAIError(
            400,
            "prompt_logprobs is not available with stream=true (as in vLLM); send stream=false",
            param="prompt_logprobs",
        )
    if isinstance(req, ChatCompletionRequest) and req.echo:
        raise OpenAIError(
            400, "echo is supported on /v1/completions only, not on /v1/chat/completions", param="echo"
        )
    if isinstance(req, CompletionRequest):
        if req.max_tokens == 0 and not req.echo:
            raise OpenAIError(
                400,
                "max_tokens=0 is allowed only with echo=true (it returns the prompt alone); "
                "send max_tokens >= 1",
                param="max_tokens",
            )
        if req.best_of not in (None, 1):
            raise OpenAIError(400, f"best_of={req.best_of} is not supported (only 1)", param="best_of")
        if req.suffix:
            raise OpenAIError(400, "suffix is not supported", param="suffix")


def message_dicts(messages: list[ChatMessage]) -> list[dict]:
    """Messages as the chat template expects them: role and plain-text content, plus tool fields."""
    out = []
    for m in messages:
        content = m.content if isinstance(m.content, str) else "".join(p.text for p in m.content or [])
        message: dict = {"role": m.role, "content": content}
        if m.tool_calls:
            message["tool_calls"] = [c.model_dump() for c in m.tool_calls]
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        out.append(message)
    return out


def message_texts(messages: list[ChatMessage], tools: list[Tool] | None = None) -> list[str]:
    """Every text a conversation puts into its prompt (contents, earlier calls, tool schemas), so that
    their length can be bounded before the chat template and the tokenizer see them."""
    texts: list[str] = []
    for m in messages:
        if isinstance(m.content, str):
            texts.append(m.content)
        else:
            texts.extend(p.text for p in m.content or [])
        for call in m.tool_calls or []:
            texts += [call.function.name, call.function.arguments]
    texts.extend(t.model_dump_json() for t in tools or [])
    return texts


def prompt_batch(prompt: str | list[int] | list[str] | list[list[int]]) -> list[str | list[int]]:
    """The prompts of a completion request: one string or token-id list, or a list of them (at most
    MAX_BATCH_PROMPTS, checked when the body was parsed)."""
    if not prompt:
        raise OpenAIError(400, "prompt must not be empty", param="prompt")
    if isinstance(prompt, str) or isinstance(prompt[0], int):
        return [prompt]
    prompts = cast(list[str | list[int]], list(prompt))
    if any(not p for p in prompts):
        raise OpenAIError(400, "prompt: each prompt of the list must be non-empty", param="prompt")
    return prompts


def sampling_params(
    req: SamplingFields, prompt_len: int, max_model_len: int, logprobs: int | None, structured=None
):
    """SamplingParams for the request, after checking the prompt and max_tokens against the context;
    ``structured`` (a StructuredOutputsParams) constrains the output. With echo, prompt logprobs come
    with logprobs (vLLM), and max_tokens=0 samples one token that is not sent."""
    from backend.engine import SamplingParams

    max_tokens = req.max_tokens
    prompt_logprobs = req.prompt_logprobs
    if isinstance(req, CompletionRequest) and req.echo:
        prompt_logprobs = logprobs if prompt_logprobs is None else prompt_logprobs
        max_tokens = 1 if max_tokens == 0 else max_tokens
    if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None:
        max_tokens = req.max_completion_tokens
    if prompt_len >= max_model_len:
        raise OpenAIError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{prompt_len} input tokens. Please reduce the length of the input.",
            code="context_length_exceeded",
        )
    if max_tokens is None:
        max_tokens = max_model_len - prompt_len
    elif prompt_len + max_tokens > max_model_len:
        raise OpenAIError(
            400,
            f"max_tokens is too large: {max_tokens}. This model's maximum context length is {max_model_len} "
            f"tokens and your request has {prompt_len} input tokens ({max_tokens} > {max_model_len} - "
            f"{prompt_len}).",
            code="context_length_exceeded",
            param="max_tokens",
        )
    try:
        return SamplingParams(
            n=req.n,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=-1 if req.top_k is None else req.top_k,
            min_p=req.min_p,
            seed=req.seed,
            max_tokens=max_tokens,
            stop=req.stop,
            stop_token_ids=req.stop_token_ids,
            ignore_eos=req.ignore_eos,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            repetition_penalty=req.repetition_penalty,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            skip_special_tokens=req.skip_special_tokens,
            structured_outputs=structured,
            # vLLM clamps each bias to [-100, 100]
            logit_bias={k: min(100.0, max(-100.0, v)) for k, v in req.logit_bias.items()}
            if req.logit_bias
            else None,
        )
    except ValueError as exc:
        raise OpenAIError(400, str(exc)) from None
