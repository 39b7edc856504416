"""build_app(): the FastAPI application that serves an engine over OpenAI's HTTP API.

Routes: GET /health, GET /metrics (Prometheus text), GET /v1/models, POST /v1/completions,
POST /v1/chat/completions, POST /v1/responses, and vLLM's POST /tokenize, POST /detokenize,
GET /tokenizer_info, GET /version. The engine comes from ``engine_provider()`` on every request, so a UI can
launch, stop and relaunch it under a running server; while it returns None the API answers 503.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel

from backend.server.engine_provider import EngineProvider
from backend.server.errors import install_error_handlers
from backend.server.fairness import ClientLine
from backend.server.metrics import ServerMetrics
from backend.server.middleware import ApiKeyMiddleware, BodySizeLimitMiddleware
from backend.server.protocol import ChatCompletionRequest, CompletionRequest
from backend.server.request_body import body_pool, install_body_schemas
from backend.server.responses_api import responses_router
from backend.server.responses_protocol import ResponsesRequest
from backend.server.serving import ServingContext, openai_router
from backend.server.tokenization import DetokenizeRequest, TokenizeRequest, tokenization_router
from backend.server.tool_parsers import TOOL_PARSERS

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
# The paths of the API (beside a mounted UI these are the ones an API key guards)
API_PATHS = ("/v1", "/metrics", "/tokenize", "/detokenize", "/tokenizer_info", "/version")
DEFAULT_MAX_WAITING_REQUESTS = 256  # as AsyncLLM's


def default_client_share(max_waiting_requests: int) -> int:
    """Each client's share of the waiting queue unless told: half of it (at least one), so that another
    client always finds room however hard one pushes (the soak's flood of 64 fits in 256 // 2)."""
    return max(1, max_waiting_requests // 2)


def build_app(
    engine_provider: EngineProvider,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_waiting_requests: int = DEFAULT_MAX_WAITING_REQUESTS,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    key_prefixes: tuple[str, ...] | None = None,
    expose_prefix_cache: bool = True,
    max_tokens_limit: int | None = None,
    tool_call_parser: str | None = None,
    enable_auto_tool_choice: bool = False,
    max_input_tokens: int | None = None,
    clients: ClientLine | None = None,
    forwarded_hops: int = 0,
) -> FastAPI:
    """The OpenAI-compatible app over ``engine_provider()`` (an AsyncLLM, or None while none runs).

    With ``api_key`` set, every path but /health (or, with ``key_prefixes``, only the paths under them,
    e.g. API_PATHS beside a mounted UI) needs ``Authorization: Bearer <api_key>``. Bodies
    over ``max_body_bytes`` get 413; requests arriving while ``max_waiting_requests`` wait in the engine
    get 503 with Retry-After. Without ``expose_prefix_cache`` (a public app) /metrics leaves out the
    prefix-cache hit counters. With ``max_tokens_limit`` (a public app) a request may ask for at most
    that many output tokens (400 above it; an unset max_tokens is capped to it), and with
    ``max_input_tokens`` at most that many input tokens. ``clients`` holds each client's share of the
    waiting queue (default: half of max_waiting_requests each; the UI passes the line its own
    handlers share); ``forwarded_hops`` trusted proxies in front name the client in X-Forwarded-For.
    """
    if max_waiting_requests < 0:
        raise ValueError(f"max_waiting_requests must be >= 0, got {max_waiting_requests}")
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
    if enable_auto_tool_choice and tool_call_parser not in TOOL_PARSERS:
        raise ValueError(
            f"--enable-auto-tool-choice needs --tool-call-parser, one of {', '.join(TOOL_PARSERS)}; "
            f"got {tool_call_parser!r}"
        )
    server_metrics = ServerMetrics(
        engine_provider, lambda engine: served_model_name or engine.model_name, expose_prefix_cache
    )
    ctx = ServingContext(
        engine_provider, served_model_name, max_waiting_requests, server_metrics, max_tokens_limit
    )
    ctx.tool_call_parser, ctx.enable_auto_tool_choice = tool_call_parser, enable_auto_tool_choice
    ctx.max_input_tokens, ctx.forwarded_hops = max_input_tokens, forwarded_hops
    ctx.clients = clients or ClientLine(default_client_share(max_waiting_requests))

    app = FastAPI(title="LLM serving playground: OpenAI-compatible API", docs_url=None, redoc_url=None)
    app.state.serving = ctx
    app.state.body_pool = body_pool()
    install_error_handlers(app)
    app.include_router(openai_router(ctx))
    app.include_router(responses_router(ctx))
    app.include_router(tokenization_router(ctx))
    body_models: list[type[BaseModel]] = [
        CompletionRequest,
        ChatCompletionRequest,
        ResponsesRequest,
        TokenizeRequest,
        DetokenizeRequest,
    ]
    install_body_schemas(app, body_models)

    @app.get("/health")
    async def health() -> Response:
        engine = engine_provider()
        if engine is None:
            return JSONResponse({"status": "no engine running"}, status_code=503)
        if engine.errored:
            return JSONResponse({"status": "the engine stopped after an internal error"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(ctx.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    # Starlette runs the last-added middleware first: the key is checked before the body is read.
    app.add_middleware(BodySizeLimitMiddleware, max_body_bytes=max_body_bytes)
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key, key_prefixes=key_prefixes)
    return app
