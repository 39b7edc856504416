"""The OpenAI routes: /v1/models, /v1/completions, /v1/chat/completions.

Each request takes its place in its client's waiting share (one place per prompt), is bounded by the
input limits before it is tokenized (a batch of prompts or a conversation as a whole), tokenized off the
event loop (chat template included, so usage counts are exact), checked against the context length, its
grammar compiled off the engine thread, then admitted by the engine (input checks and the waiting-queue
limit, a batch all at once or not at all) before any response starts, so a refused request gets its
4xx/503 even when it asked to stream. It then runs as a ``Job`` (job.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from backend.engine.exceptions import EngineDeadError, EngineOverloadedError
from backend.server.chat_prompt import chat_options, chat_prompt_ids
from backend.server.completion_batch import completion_prompts, echo_texts
from backend.server.completion_response import CompletionFormatter
from backend.server.engine_provider import EngineProvider
from backend.server.errors import OpenAIError
from backend.server.fairness import ClientLine, WaitingTicket, client_id
from backend.server.harmony import HarmonyTokens
from backend.server.job import Job, run_job
from backend.server.limits import InputLimits, LimitExceeded, check_tools, engine_input_limits
from backend.server.metrics import ServerMetrics
from backend.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    message_texts,
    prompt_batch,
    refuse_unsupported,
    sampling_params,
)
from backend.server.request_body import body_schema, json_body
from backend.server.responses import ChatFormatter, ResponseFormatter
from backend.server.structured import structured_outputs_params
from backend.server.tool_parsers import ToolParser
from backend.server.tools import harmony_tool_constraint, resolve_tool_choice, tool_constraint, tool_parser

if TYPE_CHECKING:
    from backend.engine.async_llm import AsyncLLM


@dataclass(slots=True)
class ServingContext:
    engine_provider: EngineProvider
    served_model_name: str | None
    max_waiting_requests: int
    metrics: ServerMetrics
    max_tokens_limit: int | None = None  # a public app's cap on one request's output tokens
    tool_call_parser: str | None = None  # vLLM's --tool-call-parser: how "auto" tool calls are read
    enable_auto_tool_choice: bool = False
    max_input_tokens: int | None = None  # a public app's cap on one request's input tokens
    clients: ClientLine | None = None  # each client's share of the waiting queue (fairness.py)
    forwarded_hops: int = 0  # trusted proxies in front, whose X-Forwarded-For names the client

    async def input_limits(self, engine: AsyncLLM) -> InputLimits:
        return await engine_input_limits(engine, self.max_input_tokens)

    @contextmanager
    def waiting(self, request: Request, num_prompts: int = 1) -> Iterator[WaitingTicket | None]:
        """The request's places in its client's share (one per prompt) until they start (admit() hands
        them to the Job); given back here if the request is refused on the way."""
        ticket = None
        if self.clients is not None:
            share = self.clients.max_waiting_per_client
            if num_prompts > share:  # it could never be admitted
                raise LimitExceeded(
                    f"a batch of {num_prompts:,} prompts is more than one client may have waiting "
                    f"({share:,}); send at most {share:,} prompts per request",
                    "prompt",
                )
            peer = request.client.host if request.client else None
            ticket = self.clients.enter(client_id(peer, request.headers, self.forwarded_hops), num_prompts)
        try:
            yield ticket
        except BaseException:
            if ticket is not None:
                ticket.leave()
            raise

    def limit_max_tokens(self, requested: int | None, params, num_choices: int = 1):
        """Within max_tokens_limit, which caps the output tokens of all of a request's choices together
        (prompts times n): a larger explicit max_tokens is a 400; an unset one is capped."""
        limit = self.max_tokens_limit
        if limit is None or params.max_tokens * num_choices <= limit:
            return params
        if limit < num_choices:
            raise OpenAIError(
                400,
                f"a request may have at most {limit} choices (prompts times n) on this public server, "
                f"got {num_choices}",
                "invalid_value",
                "n",
            )
        if requested is not None:
            per_choice = f" for each of {num_choices} choices (prompts times n)" if num_choices > 1 else ""
            raise OpenAIError(
                400,
                f"max_tokens must be at most {limit // num_choices}{per_choice} on this public server, "
                f"got {requested}",
                "invalid_value",
                "max_tokens",
            )
        return replace(params, max_tokens=limit // num_choices)

    def model_name(self, engine: AsyncLLM) -> str:
        return self.served_model_name or engine.model_name

    def engine(self, requested_model: str | None = None):
        engine = self.engine_provider()
        if engine is None:
            raise OpenAIError(
                503,
                "No engine is running: launch a model first.",
                "engine_not_running",
                headers={"Retry-After": "5"},
            )
        if engine.errored:
            raise OpenAIError(
                503,
                "The engine has stopped after an internal error: relaunch it.",
                "engine_dead",
                headers={"Retry-After": "5"},
            )
        name = self.model_name(engine)
        if requested_model not in (None, name):
            raise OpenAIError(
                404,
                f"The model `{requested_model}` does not exist. This server serves `{name}`.",
                "model_not_found",
                "model",
            )
        return engine

    def admit(
        self,
        engine,
        prompts: list[tuple[list[int], object]],
        formatter: ResponseFormatter,
        usage: bool,
        ticket: WaitingTicket | None = None,
    ) -> Job:
        """Hand the request's prompts ((token ids, SamplingParams) each, grammars compiled) to the engine
        now, all or none, so that a refusal is an HTTP error before any stream."""
        ids = [formatter.id] if len(prompts) == 1 else [f"{formatter.id}-{i}" for i in range(len(prompts))]
        batch = [(rid, ids_, params, None) for rid, (ids_, params) in zip(ids, prompts, strict=True)]
        try:
            collectors = engine.add_requests(batch, max_waiting_requests=self.max_waiting_requests)
        except ValueError as exc:
            raise OpenAIError(400, str(exc)) from None
        except EngineOverloadedError as exc:
            raise OpenAIError(503, str(exc), "queue_full", headers={"Retry-After": "1"}) from None
        except EngineDeadError as exc:
            raise OpenAIError(503, str(exc), "engine_dead", headers={"Retry-After": "5"}) from None
        streams = list(zip(ids, collectors, strict=True))
        return Job(self.metrics, engine, streams, formatter, usage, ticket)


async def compile_grammar(engine, params, param: str) -> None:
    """Compile the request's grammar off the engine thread; a grammar that cannot be built is a 400."""
    try:
        await engine.compile_structured_output(params)
    except ValueError as exc:
        raise OpenAIError(400, f"Invalid {param}: {exc}", "invalid_grammar", param) from None


async def prepare_chat(
    ctx: ServingContext, engine, req: ChatCompletionRequest, top_logprobs: int | None, limits: InputLimits
):
    """(prompt ids, SamplingParams, tool parser) of a chat request: tools within their limits, tool choice
    and its constraint or the response format, the messages bounded before the chat template, the
    context, input-cap and max_tokens checks (over all n choices), the compiled grammar.
    /v1/chat/completions and /v1/responses both go through here."""
    check_tools(req.tools)
    tool_choice = resolve_tool_choice(req.tools, req.tool_choice)
    harmony = HarmonyTokens.of(engine.tokenizer) is not None
    parser = tool_parser(tool_choice, ctx.tool_call_parser, ctx.enable_auto_tool_choice, harmony)
    structured = structured_outputs_params(req.response_format, req.structured_outputs)
    param = "structured_outputs" if req.structured_outputs else "response_format"
    if tool_choice == "required" or not isinstance(tool_choice, str):
        if structured is not None:
            raise OpenAIError(400, "a forced tool_choice cannot be combined with " + param, param=param)
        if harmony:
            structured = harmony_tool_constraint(req.tools, tool_choice)
        else:
            structured = tool_constraint(req.tools, tool_choice, req.parallel_tool_calls)
        param = "tools"
    limits.check_count(len(req.messages), "messages", "messages")
    limits.check_text(message_texts(req.messages, req.tools), "messages")
    ids = await engine.run_in_tokenizer(chat_prompt_ids, engine.tokenizer, req, chat_options(req))
    limits.check_tokens(len(ids), "messages")
    params = sampling_params(req, len(ids), engine.max_model_len, top_logprobs, structured)
    params = ctx.limit_max_tokens(req.max_completion_tokens or req.max_tokens, params, req.n)
    harmony_stop(engine.tokenizer, parser, params)
    await compile_grammar(engine, params, param)
    return ids, params, parser


def harmony_stop(tokenizer, parser: ToolParser | None, params) -> None:
    """A harmony model (gpt-oss) stops at <|call|>, where it waits for a tool's result (vLLM's harmony stop
    tokens); the openai tool parser needs a tokenizer that speaks harmony."""
    harmony = HarmonyTokens.of(tokenizer)
    if harmony is None and parser is not None and parser.reads_harmony:
        raise OpenAIError(
            400,
            "--tool-call-parser openai reads gpt-oss's harmony format, and this model's tokenizer has no "
            "harmony control tokens (<|start|>, <|channel|>, <|message|>, <|call|>): serve it with hermes or "
            'llama3_json, or send tool_choice="required" or a named function',
            param="tool_choice",
        )
    if harmony is not None and harmony.call not in params.stop_token_ids:
        params.stop_token_ids.append(harmony.call)


def openai_router(ctx: ServingContext) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def list_models() -> dict:
        engine = ctx.engine()
        model = {
            "id": ctx.model_name(engine),
            "object": "model",
            "created": 0,
            "owned_by": "playground",
            "root": engine.model_name,
            "max_model_len": engine.max_model_len,
        }
        return {"object": "list", "data": [model]}

    @router.post("/v1/completions", openapi_extra=body_schema(CompletionRequest))
    async def create_completion(
        req: Annotated[CompletionRequest, Depends(json_body(CompletionRequest))], request: Request
    ) -> Response:
        engine = ctx.engine(req.model)
        refuse_unsupported(req)
        structured = structured_outputs_params(req.response_format, req.structured_outputs)
        param = "structured_outputs" if req.structured_outputs else "response_format"
        with ctx.waiting(request, len(prompt_batch(req.prompt))) as ticket:
            limits = await ctx.input_limits(engine)
            prompts = await completion_prompts(engine, req, structured, limits, ctx.limit_max_tokens)
            for prompt in prompts:  # one shared grammar: compiled once, then a no-op
                await compile_grammar(engine, prompt.params, param)
            formatter = CompletionFormatter(ctx.model_name(engine), engine.tokenizer, req.logprobs, req.n)
            batch = [(p.token_ids, p.params) for p in prompts]
            job = ctx.admit(engine, batch, formatter, _usage(req), ticket)
        if req.echo:  # token ids are decoded once the engine has accepted them as in its vocabulary
            try:
                formatter.echo_prompts = await echo_texts(engine, prompts)
            except BaseException:
                job.abort()
                raise
            formatter.echo_only = req.max_tokens == 0
        return await run_job(request, job, req.stream)

    @router.post("/v1/chat/completions", openapi_extra=body_schema(ChatCompletionRequest))
    async def create_chat_completion(
        req: Annotated[ChatCompletionRequest, Depends(json_body(ChatCompletionRequest))], request: Request
    ) -> Response:
        engine = ctx.engine(req.model)
        refuse_unsupported(req)
        with ctx.waiting(request) as ticket:
            limits = await ctx.input_limits(engine)
            top = (req.top_logprobs or 0) if req.logprobs else None
            ids, params, parser = await prepare_chat(ctx, engine, req, top, limits)
            harmony = HarmonyTokens.of(engine.tokenizer)  # gpt-oss: reasoning_content beside content
            formatter = ChatFormatter(ctx.model_name(engine), engine.tokenizer, top, parser, req.n, harmony)
            job = ctx.admit(engine, [(ids, params)], formatter, _usage(req), ticket)
        return await run_job(request, job, req.stream)

    return router


def _usage(req: CompletionRequest | ChatCompletionRequest) -> bool:
    return bool(req.stream and req.stream_options and req.stream_options.include_usage)
