"""The Responses API routes: POST /v1/responses (stateless), GET and DELETE /v1/responses/{id} (404:
nothing is stored).

A request becomes a chat completion request (``responses_chat.to_chat_request``) and runs through
the chat path (``serving.prepare_chat``: template, tool constraint, structured output, limits) with a
place in its client's waiting share, then as a ``Job`` like any other request: admitted before any byte
is sent, aborted when its client leaves.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse

from backend.engine.exceptions import EngineDeadError
from backend.server.errors import OpenAIError
from backend.server.harmony import HarmonyTokens
from backend.server.job import Job, run_job
from backend.server.request_body import body_schema, json_body
from backend.server.responses_chat import to_chat_request
from backend.server.responses_output import ResponsesFormatter
from backend.server.responses_protocol import ResponsesRequest, refuse_unsupported_responses
from backend.server.responses_stream import ResponsesEvents
from backend.server.serving import ServingContext, prepare_chat


def _sse(event: dict) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


async def response_events(job: Job, events: ResponsesEvents) -> AsyncIterator[str]:
    for event in events.start():
        yield _sse(event)
    try:
        async for _, out in job.outputs():
            for event in events.update(out):
                yield _sse(event)
    except EngineDeadError as exc:  # the status line is sent: tell the client in-band, as OpenAI does
        for event in events.failed("engine_dead", str(exc)):
            yield _sse(event)
    except Exception as exc:  # boundary: the engine failed this request mid-stream
        for event in events.failed("server_error", f"{type(exc).__name__}: {exc}"):
            yield _sse(event)


def in_responses_terms(exc: OpenAIError) -> OpenAIError:
    """The chat path's error about max_tokens, said about the Responses API's max_output_tokens."""
    if exc.param == "max_tokens":
        exc.param = "max_output_tokens"
        exc.message = exc.message.replace("max_tokens", "max_output_tokens")
    return exc


def _not_stored(response_id: str) -> OpenAIError:
    return OpenAIError(
        404,
        f"Response {response_id!r} not found: this server is stateless and stores no responses",
        "not_found",
        "response_id",
    )


def responses_router(ctx: ServingContext) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/responses", openapi_extra=body_schema(ResponsesRequest))
    async def create_response(
        req: Annotated[ResponsesRequest, Depends(json_body(ResponsesRequest))], request: Request
    ) -> Response:
        engine = ctx.engine(req.model)
        refuse_unsupported_responses(req)
        chat = to_chat_request(req)
        with ctx.waiting(request) as ticket:
            limits = await ctx.input_limits(engine)
            try:
                ids, params, parser = await prepare_chat(ctx, engine, chat, None, limits)
            except OpenAIError as exc:
                raise in_responses_terms(exc) from None
            harmony = HarmonyTokens.of(engine.tokenizer)
            formatter = ResponsesFormatter(ctx.model_name(engine), engine.tokenizer, parser, req, harmony)
            job = ctx.admit(engine, [(ids, params)], formatter, False, ticket)
        if not req.stream:
            return await run_job(request, job, False)
        return StreamingResponse(
            response_events(job, ResponsesEvents(formatter)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )

    @router.get("/v1/responses/{response_id}")
    async def get_response(response_id: str) -> Response:
        raise _not_stored(response_id)

    @router.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str) -> Response:
        raise _not_stored(response_id)

    return router
