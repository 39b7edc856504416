"""The OpenAI routes: /v1/models, /v1/completions, /v1/chat/completions.

Each request is tokenized here, off the event loop (chat template included, so usage counts are exact),
checked against the context length, then admitted by the engine (input checks and the waiting-queue
limit) before any response starts, so a refused request gets its 4xx/503 even when it asked to stream.
It then runs as a ``Job``; a job whose client goes away is aborted at once, which frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from backend.engine.exceptions import EngineDeadError, EngineGenerateError, EngineOverloadedError
from backend.server.chat_prompt import chat_prompt_ids
from backend.server.engine_provider import EngineProvider
from backend.server.errors import OpenAIError, error_body
from backend.server.metrics import ServerMetrics
from backend.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    refuse_unsupported,
    sampling_params,
    single_prompt,
)
from backend.server.responses import ChatFormatter, CompletionFormatter, ResponseFormatter
from backend.server.structured import structured_outputs_params
from backend.server.tool_parsers import ToolParser
from backend.server.tools import resolve_tool_choice, tool_constraint, tool_parser

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

    def admit(self, engine, prompt_ids: list[int], params, formatter: ResponseFormatter, include_usage):
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
        return Job(self, engine, collector, formatter, include_usage)


class Job:
    """One admitted request on the engine, with its metrics; aborted if not finished when dropped."""

    def __init__(self, ctx: ServingContext, engine, collector, formatter, include_usage: bool):
        self.engine = engine
        self.collector = collector
        self.formatter: ResponseFormatter = formatter
        self.include_usage = include_usage
        self.request_id = formatter.id
        self.recorder = ctx.metrics.recorder(formatter.model)

    async def outputs(self) -> AsyncIterator:
        last, reason = None, "abort"
        stream = self.engine.outputs(self.request_id, self.collector)
        try:
            async for out in stream:
                self.recorder.on_output(out)
                last = out
                yield out
            if last is not None and last.finished:
                reason = last.outputs[0].finish_reason
        except EngineGenerateError:
            reason = "error"
            raise
        finally:
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


async def prepare_chat(ctx: ServingContext, engine, req: ChatCompletionRequest, top_logprobs: int | None):
    """(prompt ids, SamplingParams, tool parser) of a chat request: tool choice and its constraint or
    the response format, the chat template, the context and max_tokens checks, the compiled grammar.
    /v1/chat/completions and /v1/responses both go through here."""
    tool_choice = resolve_tool_choice(req.tools, req.tool_choice)
    parser: ToolParser | None = tool_parser(tool_choice, ctx.tool_call_parser, ctx.enable_auto_tool_choice)
    structured = structured_outputs_params(req.response_format, req.structured_outputs)
    param = "structured_outputs" if req.structured_outputs else "response_format"
    if tool_choice == "required" or not isinstance(tool_choice, str):
        if structured is not None:
            raise OpenAIError(400, "a forced tool_choice cannot be combined with " + param, param=param)
        structured, param = tool_constraint(req.tools, tool_choice, req.parallel_tool_calls), "tools"
    ids = await engine.run_in_tokenizer(chat_prompt_ids, engine.tokenizer, req)
    params = sampling_params(req, len(ids), engine.max_model_len, top_logprobs, structured)
    params = ctx.limit_max_tokens(req.max_completion_tokens or req.max_tokens, params)
    await compile_grammar(engine, params, param)
    return ids, params, parser


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

    @router.post("/v1/completions")
    async def create_completion(req: CompletionRequest, request: Request) -> Response:
        engine = ctx.engine(req.model)
        refuse_unsupported(req)
        prompt = single_prompt(req.prompt)
        if isinstance(prompt, list):
            ids = list(prompt)
        else:  # a long prompt takes a while: tokenize off the event loop
            ids = await engine.run_in_tokenizer(encode, engine.tokenizer, prompt)
        structured = structured_outputs_params(req.response_format, req.structured_outputs)
        params = sampling_params(req, len(ids), engine.max_model_len, req.logprobs, structured)
        params = ctx.limit_max_tokens(req.max_tokens, params)
        param = "structured_outputs" if req.structured_outputs else "response_format"
        await compile_grammar(engine, params, param)
        formatter = CompletionFormatter(ctx.model_name(engine), engine.tokenizer, req.logprobs)
        return await run_job(request, ctx.admit(engine, ids, params, formatter, _usage(req)), req.stream)

    @router.post("/v1/chat/completions")
    async def create_chat_completion(req: ChatCompletionRequest, request: Request) -> Response:
        engine = ctx.engine(req.model)
        refuse_unsupported(req)
        top = (req.top_logprobs or 0) if req.logprobs else None
        ids, params, parser = await prepare_chat(ctx, engine, req, top)
        formatter = ChatFormatter(ctx.model_name(engine), engine.tokenizer, top, parser)
        return await run_job(request, ctx.admit(engine, ids, params, formatter, _usage(req)), req.stream)

    return router


def _usage(req: CompletionRequest | ChatCompletionRequest) -> bool:
    return bool(req.stream and req.stream_options and req.stream_options.include_usage)
