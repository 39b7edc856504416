"""Errors in OpenAI's JSON shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import json
from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

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


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> dict:
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


def describe_validation_errors(errors: list[dict]) -> tuple[str, str | None]:
    """One readable message for pydantic's errors, plus the first offending parameter's name."""
    parts, param = [], None
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        if err.get("type") == "json_invalid":
            reason = (err.get("ctx") or {}).get("error", "invalid JSON")
            parts.append(f"Malformed JSON body: {reason}")
            continue
        where = ".".join(loc) or "body"
        param = param or where
        text = f"{where}: {err.get('msg', 'invalid value').removeprefix('Value error, ')}"
        value = err.get("input")
        if err.get("type") != "missing" and isinstance(value, str | int | float | bool):
            text += f" (got {value!r})"
        parts.append(text)
    return "; ".join(parts) or "Invalid request", param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.code, exc.param, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = describe_validation_errors(list(exc.errors()))
        return error_response(400, message, "invalid_value", param)

    @app.exception_handler(Exception)
    async def _server_error(_: Request, exc: Exception) -> JSONResponse:
        return error_response(500, f"Internal server error: {type(exc).__name__}: {exc}")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), None, None, exc.headers)
