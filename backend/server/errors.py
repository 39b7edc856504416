"""Errors in OpenAI's JSON shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import json
from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from backend.engine.exceptions import EngineDeadError, EngineOverloadedError
from backend.server.limits import LimitExceeded
from backend.worker_pool import WorkerPoolFull

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    503: "server_error",
}


class OpenAIError(Exception):
    """Raised by handlers; rendered as OpenAI's error JSON with the given HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers


MAX_MESSAGE_CHARS = 2000  # any error message, whatever it quotes from the request


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> dict:
    """OpenAI's error shape; the message is cut to MAX_MESSAGE_CHARS (it may quote what the client sent)."""
    message = _shorten(message, MAX_MESSAGE_CHARS)
    param = None if param is None else _shorten(param)
    error_type = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    code: str | None = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(status, message, code, param), status_code=status, headers=headers)


def error_bytes(status: int, message: str, code: str | None = None) -> bytes:
    """The same body, encoded, for the raw ASGI middlewares."""
    return json.dumps(error_body(status, message, code)).encode()


MAX_ERRORS_SHOWN = 3  # a 400 reports the first few problems, then how many more there were
MAX_VALUE_CHARS_SHOWN = 60  # an offending value is quoted up to this many characters


def describe_validation_errors(errors: list[dict]) -> tuple[str, str | None]:
    """One short message for pydantic's errors (the first MAX_ERRORS_SHOWN, each value cut short, then
    a count of the rest), plus the first offending parameter's name. Its size does not grow with the
    body: a million bad items make a message of a few hundred characters."""
    parts, param = [], None
    for err in errors[:MAX_ERRORS_SHOWN]:
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        if err.get("type") == "json_invalid":
            reason = (err.get("ctx") or {}).get("error", "invalid JSON")
            parts.append(f"Malformed JSON body: {reason}")
            continue
        where = _shorten(".".join(loc) or "body")
        param = param or where
        text = f"{where}: {_shorten(str(err.get('msg', 'invalid value')).removeprefix('Value error, '), 300)}"
        value = err.get("input")
        if err.get("type") != "missing" and isinstance(value, str | int | float | bool):
            text += f" (got {_shorten(repr(value))})"
        parts.append(text)
    if len(errors) > MAX_ERRORS_SHOWN:
        parts.append(f"and {len(errors) - MAX_ERRORS_SHOWN} more errors")
    return "; ".join(parts) or "Invalid request", param


def _shorten(text: str, limit: int = MAX_VALUE_CHARS_SHOWN) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.code, exc.param, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = describe_validation_errors(list(exc.errors()))
        return error_response(400, message, "invalid_value", param)

    @app.exception_handler(LimitExceeded)
    async def _limit_exceeded(_: Request, exc: LimitExceeded) -> JSONResponse:
        return error_response(400, str(exc), exc.code, exc.param)

    @app.exception_handler(EngineOverloadedError)  # a full line: the tokenizer's, or a client's share
    async def _overloaded(_: Request, exc: EngineOverloadedError) -> JSONResponse:
        return error_response(503, str(exc), "queue_full", None, {"Retry-After": "1"})

    @app.exception_handler(EngineDeadError)  # stopped (a relaunch) while the request was on its way in
    async def _dead(_: Request, exc: EngineDeadError) -> JSONResponse:
        return error_response(503, str(exc), "engine_dead", None, {"Retry-After": "5"})

    @app.exception_handler(WorkerPoolFull)  # the body or grammar workers and their line are full
    async def _busy(_: Request, exc: WorkerPoolFull) -> JSONResponse:
        return error_response(503, str(exc), "server_busy", None, {"Retry-After": str(exc.retry_after_s)})

    @app.exception_handler(Exception)
    async def _server_error(_: Request, exc: Exception) -> JSONResponse:
        return error_response(500, f"Internal server error: {type(exc).__name__}: {exc}")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), None, None, exc.headers)
