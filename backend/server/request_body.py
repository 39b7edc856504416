"""Request bodies parsed and validated off the event loop once they are large, with short errors.

FastAPI parses and validates a declared body on the event loop: a 4 MB body of a million items took
seconds there, while /health, the page and every stream waited. Routes take their body through
``json_body(Model)`` instead: a small body (most requests) is parsed inline, where it costs a
millisecond or so; a larger one on the server's body pool (a WorkerPool: a few threads, a short line, 503 +
Retry-After when full). Parsing, the strict JSON walk, validation and the error message all happen
there, and the message reports the first few errors only (errors.describe_validation_errors).

New routes (``/tokenize``, ``/v1/responses``) take their bodies the same way:
``req: Annotated[TokenizeRequest, Depends(json_body(TokenizeRequest))]`` and
``openapi_extra=body_schema(TokenizeRequest)``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ValidationError

from backend.server.errors import OpenAIError, describe_validation_errors
from backend.worker_pool import WorkerPool, WorkerPoolFull

M = TypeVar("M", bound=BaseModel)
# Pydantic validates a chat message in ~10 us holding the GIL (measured here): 16 KiB of the smallest
# messages (~1,000) take ~10 ms inline; a 4 MB body ~0.5-2 s in all (docs/security.md), so larger bodies go
# to a thread, whose hop (~0.1 ms) costs nothing beside that.
INLINE_BODY_BYTES = 16 * 1024
BODY_WORKERS = 2  # the work holds the GIL: more threads would not parse faster, only queue inside
BODY_MAX_WAITING = 8  # 10 large bodies in flight hold ~40 MB of text at most (4 MiB each)


def body_pool() -> WorkerPool:
    return WorkerPool("request body", BODY_WORKERS, BODY_MAX_WAITING)


def parse_body(model: type[M], raw: bytes) -> M:
    """The validated body; OpenAIError 400 with a short message for malformed JSON or invalid fields."""
    try:
        data = json.loads(raw)
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8/16/32
        raise OpenAIError(400, f"Malformed JSON body: {exc}", "invalid_json") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message, param = describe_validation_errors([dict(e) for e in exc.errors(include_url=False)])
        raise OpenAIError(400, message, "invalid_value", param) from None


def json_body(model: type[M]) -> Callable[[Request], Awaitable[M]]:
    """A FastAPI dependency that gives the route its body as ``model``, parsed off the loop when large."""

    async def dependency(request: Request) -> M:
        raw = await request.body()
        if len(raw) <= INLINE_BODY_BYTES:
            return parse_body(model, raw)
        pool: WorkerPool = request.app.state.body_pool
        try:
            return await pool.run(parse_body, model, raw)
        except WorkerPoolFull as exc:
            raise OpenAIError(503, str(exc), "server_busy", headers={"Retry-After": "1"}) from None

    return dependency


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` for a route whose body comes from json_body (FastAPI cannot see it)."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def install_body_schemas(app: FastAPI, models: list[type[BaseModel]]) -> None:
    """List the body models in /openapi.json's components, where body_schema's references point."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in models:
                body = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(body.pop("$defs", {}))
                components[model.__name__] = body
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
