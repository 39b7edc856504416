"""The OpenAI routes: /v1/models, /v1/completions, /v1/chat/completions.

Each request is tokenized here, off the event loop (chat template included, so usage counts are exact),
checked against the context length, then admitted by the engine (input checks and the waiting-queue
limit) before any response starts, so a refused request gets its 4xx/503 even when it asked to stream.
It then runs as a ``Job``; a job whose client goes away is aborted at once, which frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from backend.engine.exceptions import EngineDeadError, EngineGenerateError, EngineOverloadedError
from backend.server.engine_provider import EngineProvider
from backend.server.errors import OpenAIError, error_body
from backend.server.fairness import ClientLine, WaitingTicket, client_id
from backend.server.harmony import HarmonyParser
from backend.server.limits import InputLimits, check_tools, engine_input_limits
from backend.server.metrics import ServerMetrics
from backend.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    message_dicts,
    message_texts,
    refuse_unsupported,
    sampling_params,
    single_prompt,
)
from backend.server.request_body import body_schema, json_body
from backend.server.responses import ChatFormatter, CompletionFormatter, ResponseFormatter
from backend.server.structured import structured_outputs_params
from backend.server.tools import (
    render_messages,
    resolve_tool_choice,
    template_renders_tools,
    tool_constraint,
    tool_parser,
)

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
    def waiting(self, request: Request) -> Iterator[WaitingTicket | None]:
        """The request's place in its client's share until it starts (admit() hands it to the Job);
        given back here if the request is refused on the way."""
        ticket = None
        if self.clients is not None:
            peer = request.client.host if request.client else None
            ticket = self.clients.enter(client_id(peer, request.headers, self.forwarded_hops))
        try:
            yield ticket
        except BaseException:
            if ticket is not None:
                ticket.leave()
            raise

    def limit_max_tokens(self, requested: int | None, params):
        """Within max_tokens_limit: a larger explicit max_tokens is a 400; an unset one is capped."""
        limit = self.max_tokens_limit
        if limit is None or params.max_tokens <= limit:
            return params
        if requested is not None:
            raise OpenAIError(
                400,
                f"max_tokens must be at most {limit} on this public server, got {requested}",
                "invalid_value",
                "max_tokens",
            )
        return replace(params, max_tokens=limit)

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
        prompt_ids: list[int],
        params,
        formatter: ResponseFormatter,
        include_usage,
        ticket: WaitingTicket | None = None,
    ):
        """Hand the request to the engine now, so that a refusal is an HTTP error before any stream."""
        try:
            collector = engine.add_request(
                formatter.id, prompt_ids, params, max_waiting_requests=self.max_waiting_requests
            )
        except ValueError as exc:
            raise OpenAIError(400, str(exc)) from None
        except EngineOverloadedError as exc:
            raise OpenAIError(503, str(exc), "queue_full", headers={"Retry-After": "1"}) from None
        except EngineDeadError as exc:
            raise OpenAIError(503, str(exc), "engine_dead", headers={"Retry-After": "5"}) from None
        return Job(self, engine, collector, formatter, include_usage, ticket)


class Job:
    """One admitted request on the engine, with its metrics; aborted if not finished when dropped."""

    def __init__(self, ctx: ServingContext, engine, collector, formatter, include_usage: bool, ticket=None):
        self.engine = engine
        self.collector = collector
        self.formatter: ResponseFormatter = formatter
        self.include_usage = include_usage
        self.request_id = formatter.id
        self.recorder = ctx.metrics.recorder(formatter.model)
        self.ticket: WaitingTicket | None = ticket
        if ticket is not None:  # a stream that never starts gives its place back when it is dropped
            ticket.hold_until_collected(self)

    def started(self) -> None:
        if self.ticket is not None:
            self.ticket.leave()

    async def outputs(self) -> AsyncIterator:
        last, reason = None, "abort"
        stream = self.engine.outputs(self.request_id, self.collector)
        try:
            async for out in stream:
                self.started()  # its first output: no longer waiting
                self.recorder.on_output(out)
                last = out
                yield out
            if last is not None and last.finished:
                reason = last.outputs[0].finish_reason
        except EngineGenerateError:
            reason = "error"
            raise
        finally:
            self.started()
            await stream.aclose()  # closing the engine's stream early aborts the request, freeing its blocks
            self.recorder.on_finish(last, reason)

    async def collect(self) -> dict:
        last = None
        async for out in self.outputs():
            last = out
        return self.formatter.response(last)

    async def sse(self) -> AsyncIterator[str]:
        first = self.formatter.first_chunk(self.include_usage)
        if first is not None:
            yield _sse(first)
        last = None
        try:
            async for out in self.outputs():
                last = out
                chunk = self.formatter.chunk(out, self.include_usage)
                if chunk is not None:
                    yield _sse(chunk)
            if self.include_usage:
                yield _sse(self.formatter.usage_chunk(last))
        except EngineDeadError as exc:  # the status line is sent: tell the client in-band, as vLLM does
            yield _sse(error_body(503, str(exc), "engine_dead"))
        except Exception as exc:  # boundary: the engine failed this request mid-stream
            yield _sse(error_body(500, f"{type(exc).__name__}: {exc}"))
        yield "data: [DONE]\n\n"


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def run_job(request: Request, job: Job, stream: bool) -> Response:
    if stream:
        return StreamingResponse(
            job.sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
    work = asyncio.ensure_future(job.collect())
    watcher = asyncio.ensure_future(_until_disconnected(request))
    await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if not work.done():  # the client left: cancelling the work aborts the request
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        return Response(status_code=499)
    watcher.cancel()
    try:
        return JSONResponse(work.result())
    except EngineGenerateError as exc:
        raise OpenAIError(500, f"The engine failed this request: {exc}", "engine_error") from None
    except EngineDeadError as exc:
        raise OpenAIError(503, str(exc), "engine_dead", headers={"Retry-After": "5"}) from None


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text)["input_ids"])


async def compile_grammar(engine, params, param: str) -> None:
    """Compile the request's grammar off the engine thread; a grammar that cannot be built is a 400."""
    try:
        await engine.compile_structured_output(params)
    except ValueError as exc:
        raise OpenAIError(400, f"Invalid {param}: {exc}", "invalid_grammar", param) from None


def chat_prompt_ids(tokenizer, req: ChatCompletionRequest) -> list[int]:
    if not getattr(tokenizer, "chat_template", None):
        raise OpenAIError(
            400, "This model has no chat template; use /v1/completions instead.", "no_chat_template"
        )
    tools = [t.model_dump() for t in req.tools] if req.tools else None
    native = template_renders_tools(tokenizer)
    messages = render_messages(message_dicts(req.messages), req.tools, native)
    effort = {"reasoning_effort": req.reasoning_effort} if req.reasoning_effort else {}  # others ignore it
    try:
        text = tokenizer.apply_chat_template(
            messages, tools=tools if native else None, tokenize=False, add_generation_prompt=True, **effort
        )
    except Exception as exc:  # the template's own checks, e.g. roles that must alternate
        raise OpenAIError(
            400, f"The chat template rejected the messages: {exc}", "invalid_messages"
        ) from None
    return tokenizer(text, add_special_tokens=False)["input_ids"]


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
        prompt = single_prompt(req.prompt)
        with ctx.waiting(request) as ticket:
            limits = await ctx.input_limits(engine)
            if isinstance(prompt, list):
                ids = list(prompt)
            else:  # bounded first, then tokenized off the event loop
                limits.check_text(prompt)
                ids = await engine.run_in_tokenizer(encode, engine.tokenizer, prompt)
            limits.check_tokens(len(ids))
            structured = structured_outputs_params(req.response_format, req.structured_outputs)
            params = sampling_params(req, len(ids), engine.max_model_len, req.logprobs, structured)
            params = ctx.limit_max_tokens(req.max_tokens, params)
            param = "structured_outputs" if req.structured_outputs else "response_format"
            await compile_grammar(engine, params, param)
            formatter = CompletionFormatter(ctx.model_name(engine), engine.tokenizer, req.logprobs)
            job = ctx.admit(engine, ids, params, formatter, _usage(req), ticket)
        return await run_job(request, job, req.stream)

    @router.post("/v1/chat/completions", openapi_extra=body_schema(ChatCompletionRequest))
    async def create_chat_completion(
        req: Annotated[ChatCompletionRequest, Depends(json_body(ChatCompletionRequest))], request: Request
    ) -> Response:
        engine = ctx.engine(req.model)
        refuse_unsupported(req)
        check_tools(req.tools)
        tool_choice = resolve_tool_choice(req.tools, req.tool_choice)
        parser = tool_parser(tool_choice, ctx.tool_call_parser, ctx.enable_auto_tool_choice)
        structured = structured_outputs_params(req.response_format, req.structured_outputs)
        param = "structured_outputs" if req.structured_outputs else "response_format"
        if tool_choice == "required" or not isinstance(tool_choice, str):
            if structured is not None:
                raise OpenAIError(400, "a forced tool_choice cannot be combined with " + param, param=param)
            structured, param = tool_constraint(req.tools, tool_choice, req.parallel_tool_calls), "tools"
        with ctx.waiting(request) as ticket:
            limits = await ctx.input_limits(engine)
            limits.check_count(len(req.messages), "messages", "messages")
            limits.check_text(message_texts(req.messages, req.tools), "messages")
            ids = await engine.run_in_tokenizer(chat_prompt_ids, engine.tokenizer, req)
            limits.check_tokens(len(ids), "messages")
            top = (req.top_logprobs or 0) if req.logprobs else None
            params = sampling_params(req, len(ids), engine.max_model_len, top, structured)
            params = ctx.limit_max_tokens(req.max_completion_tokens or req.max_tokens, params)
            await compile_grammar(engine, params, param)
            harmony = HarmonyParser.for_tokenizer(engine.tokenizer) if parser is None else None
            formatter = ChatFormatter(ctx.model_name(engine), engine.tokenizer, top, parser, harmony)
            job = ctx.admit(engine, ids, params, formatter, _usage(req), ticket)
        return await run_job(request, job, req.stream)

    return router


def _usage(req: CompletionRequest | ChatCompletionRequest) -> bool:
    return bool(req.stream and req.stream_options and req.stream_options.include_usage)
