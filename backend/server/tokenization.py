"""vLLM's tokenizer endpoints: POST /tokenize, POST /detokenize, GET /tokenizer_info, and GET /version.

Shapes as vLLM's ``serve/tokenize/protocol.py``: /tokenize takes a ``prompt`` (text; special tokens
added by default) or chat ``messages`` (rendered by the chat template exactly as /v1/chat/completions
renders them; no special tokens on top by default) and answers ``{count, max_model_len, tokens,
token_strs}``; /detokenize takes ``tokens`` and answers ``{prompt}``. lm-evaluation-harness's
``tokenizer_backend=remote`` (its default when /tokenizer_info answers) uses all three.

Bounded work, as on the completion routes (limits.InputLimits): a text (or a chat's texts together) is
refused before tokenizing when it is too long for any tokenization of it to fit the context or the
server's input cap, and the tokens after; token lists longer than the context are refused likewise.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from fastapi import APIRouter, Depends
from pydantic import ConfigDict, Field, model_validator

from backend.server.chat_prompt import ChatTemplateOptions, chat_prompt_ids
from backend.server.errors import OpenAIError
from backend.server.limits import MAX_TOOLS
from backend.server.protocol import MAX_MESSAGES, ChatMessage, FailFastList, StrictJSON, message_texts
from backend.server.request_body import body_schema, json_body
from backend.server.serving import ServingContext
from backend.server.tools import Tool
from backend.version import project_version


class TokenizeRequest(StrictJSON):
    """vLLM's TokenizeCompletionRequest (``prompt``) and TokenizeChatRequest (``messages``) in one body."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    list_limits: ClassVar[dict[str, int]] = {"messages": MAX_MESSAGES, "tools": MAX_TOOLS}

    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage] | None, Field(min_length=1, fail_fast=True)] = None
    tools: FailFastList[Tool] | None = None
    add_special_tokens: bool | None = None  # vLLM's defaults: true for a prompt, false for messages
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("send either `prompt` (a text) or `messages` (a chat), not both and not neither")
        if self.chat_template is not None:
            raise ValueError(
                "chat_template: a request may not bring its own chat template on this server (vLLM "
                "needs --trust-request-chat-template for it); the model's template is used"
            )
        return self


class DetokenizeRequest(StrictJSON):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: str | None = None
    tokens: FailFastList[int]


def encode_text(tokenizer, text: str, add_special_tokens: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


def check_token_ids(tokens: list[int], vocab_size: int, max_model_len: int) -> None:
    if len(tokens) > max_model_len:
        raise OpenAIError(
            400,
            f"tokens holds {len(tokens)} ids; at most {max_model_len} (this model's context) are allowed",
            param="tokens",
        )
    bad = next((t for t in tokens if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise OpenAIError(
            400, f"token id {bad} is not in the vocabulary (0 to {vocab_size - 1})", param="tokens"
        )


def tokenizer_info(tokenizer) -> dict[str, Any]:
    """The tokenizer_config.json fields clients read (lm-eval: the special tokens, the chat template);
    no file paths."""
    info: dict[str, Any] = {"tokenizer_class": type(tokenizer).__name__}
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        value = getattr(tokenizer, name, None)
        info[name] = None if value is None else str(value)
    info["chat_template"] = getattr(tokenizer, "chat_template", None)
    return info


def tokenization_router(ctx: ServingContext) -> APIRouter:
    router = APIRouter()

    @router.post("/tokenize", openapi_extra=body_schema(TokenizeRequest))
    async def tokenize(req: Annotated[TokenizeRequest, Depends(json_body(TokenizeRequest))]) -> dict:
        engine = ctx.engine(req.model)
        tokenizer, max_model_len = engine.tokenizer, engine.max_model_len
        limits = await ctx.input_limits(engine)
        if req.messages is not None:
            limits.check_count(len(req.messages), "messages", "messages")
            limits.check_text(message_texts(req.messages, req.tools), "messages")
            options = ChatTemplateOptions(
                req.add_generation_prompt,
                req.continue_final_message,
                bool(req.add_special_tokens),
                dict(req.chat_template_kwargs or {}),
            )
            ids = await engine.run_in_tokenizer(chat_prompt_ids, tokenizer, req, options)
        else:
            assert req.prompt is not None
            limits.check_text(req.prompt, "prompt")
            special = req.add_special_tokens is not False
            ids = await engine.run_in_tokenizer(encode_text, tokenizer, req.prompt, special)
        limits.check_tokens(len(ids), "messages" if req.messages is not None else "prompt")
        token_strs = tokenizer.convert_ids_to_tokens(ids) if req.return_token_strs else None
        return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": token_strs}

    @router.post("/detokenize", openapi_extra=body_schema(DetokenizeRequest))
    async def detokenize(req: Annotated[DetokenizeRequest, Depends(json_body(DetokenizeRequest))]) -> dict:
        engine = ctx.engine(req.model)
        check_token_ids(req.tokens, len(engine.tokenizer), engine.max_model_len)
        return {"prompt": await engine.run_in_tokenizer(engine.tokenizer.decode, req.tokens)}

    @router.get("/tokenizer_info")
    async def get_tokenizer_info() -> dict:
        return tokenizer_info(ctx.engine().tokenizer)

    @router.get("/version")
    async def show_version() -> dict:
        return {"version": project_version()}

    return router
