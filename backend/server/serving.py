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
from backend.server.completion_batch import completion_prompts, echo_texts
from backend.server.completion_response import CompletionFormatter
from backend.server.engine_provider import EngineProvider
from backend.server.errors import OpenAIError, error_body
from backend.server.metrics import ServerMetrics
from backend.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    message_dicts,
    refuse_unsupported,
    sampling_params,
)
from backend.server.responses import ChatFormatter, ResponseFormatter
from backend.server.streams import merge_streams
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

    def admit(self, engine, prompts: list[tuple[list[int], object]], formatter: ResponseFormatter, usage):
        """Hand the request's prompts ((token ids, SamplingParams) each) to the engine now, all or none,
        so that a refusal is an HTTP error before any stream."""
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
        return Job(self, engine, list(zip(ids, collectors, strict=True)), formatter, usage)


class Job:
    """One HTTP request's engine requests (one per prompt), with their metrics; those not finished when
    it is dropped are aborted."""

    def __init__(self, ctx: ServingContext, engine, streams: list, formatter, include_usage: bool):
        self.engine = engine
        self.streams = streams  # (request_id, collector) per prompt
        self.formatter: ResponseFormatter = formatter
        self.include_usage = include_usage
        self.recorders = [ctx.metrics.recorder(formatter.model) for _ in streams]
        self.finals: list = [None] * len(streams)  # each prompt's last output

    async def prompt_outputs(self, index: int) -> AsyncIterator:
        request_id, collector = self.streams[index]
        recorder, last, reason = self.recorders[index], None, "abort"
        stream = self.engine.outputs(request_id, collector)
        try:
            async for out in stream:
                recorder.on_output(out)
                last = self.finals[index] = out
                yield out
            if last is not None and last.finished:
                reason = last.outputs[0].finish_reason
        except EngineGenerateError:
            reason = "error"
            raise
        finally:
            await stream.aclose()  # closing the engine's stream early aborts the request, freeing its blocks
            recorder.on_finish(last, reason)

    async def outputs(self) -> AsyncIterator[tuple[int, object]]:
        """(prompt index, cumulative output) of every prompt, as they come."""
        merged = merge_streams([self.prompt_outputs(i) for i in range(len(self.streams))])
        try:
            async for item in merged:
                yield item
        finally:
            await merged.aclose()
            for (request_id, _), last in zip(self.streams, self.finals, strict=True):
                if last is None or not last.finished:
                    self.engine.abort(request_id)  # a no-op once its stream has aborted it

    async def collect(self) -> dict:
        async for _ in self.outputs():
            pass
        return self.formatter.response(self.finals)

    async def sse(self) -> AsyncIterator[str]:
        for first in self.formatter.first_chunks(self.include_usage):
            yield _sse(first)
        try:
            async for index, out in self.outputs():
                for chunk in self.formatter.chunks(index, out, self.include_usage):
                    yield _sse(chunk)
            if self.include_usage:
                yield _sse(self.formatter.usage_chunk(self.finals))
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
    try:
        text = tokenizer.apply_chat_template(
            messages, tools=tools if native else None, tokenize=False, add_generation_prompt=True
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

    @router.post("/v1/completions")
    async def create_completion(req: CompletionRequest, request: Request) -> Response:
        engine = ctx.engine(req.model)
        refuse_unsupported(req)
        structured = structured_outputs_params(req.response_format, req.structured_outputs)
        prompts = await completion_prompts(engine, req, structured, ctx.limit_max_tokens)
        param = "structured_outputs" if req.structured_outputs else "response_format"
        await compile_grammar(engine, prompts[0].params, param)
        echo_only = req.echo and req.max_tokens == 0
        formatter = CompletionFormatter(ctx.model_name(engine), engine.tokenizer, req.logprobs, req.n)
        job = ctx.admit(engine, [(p.token_ids, p.params) for p in prompts], formatter, _usage(req))
        if req.echo:
            formatter.echo_prompts, formatter.echo_only = await echo_texts(engine, prompts), echo_only
        return await run_job(request, job, req.stream)

    @router.post("/v1/chat/completions")
    async def create_chat_completion(req: ChatCompletionRequest, request: Request) -> Response:
        engine = ctx.engine(req.model)
        refuse_unsupported(req)
        tool_choice = resolve_tool_choice(req.tools, req.tool_choice)
        parser = tool_parser(tool_choice, ctx.tool_call_parser, ctx.enable_auto_tool_choice)
        structured = structured_outputs_params(req.response_format, req.structured_outputs)
        param = "structured_outputs" if req.structured_outputs else "response_format"
        if tool_choice == "required" or not isinstance(tool_choice, str):
            if structured is not None:
                raise OpenAIError(400, "a forced tool_choice cannot be combined with " + param, param=param)
            structured, param = tool_constraint(req.tools, tool_choice, req.parallel_tool_calls), "tools"
        ids = await engine.run_in_tokenizer(chat_prompt_ids, engine.tokenizer, req)
        top = (req.top_logprobs or 0) if req.logprobs else None
        params = sampling_params(req, len(ids), engine.max_model_len, top, structured)
        params = ctx.limit_max_tokens(req.max_completion_tokens or req.max_tokens, params, req.n)
        await compile_grammar(engine, params, param)
        formatter = ChatFormatter(ctx.model_name(engine), engine.tokenizer, top, parser, req.n)
        return await run_job(request, ctx.admit(engine, [(ids, params)], formatter, _usage(req)), req.stream)

    return router


def _usage(req: CompletionRequest | ChatCompletionRequest) -> bool:
    return bool(req.stream and req.stream_options and req.stream_options.include_usage)
