"""The web app: seven tabs on one page, mounted with the OpenAI-compatible API on one FastAPI server.

/        the Gradio UI (Plan, Launch, Chat, Benchmark, Compare, Monitor, Export)
/v1/...  the OpenAI-compatible API served by the engine the UI launched (backend.server)
/metrics Prometheus metrics of that engine

In public mode the handlers a visitor must never reach are not registered at all (a hidden tab is still
a public API): Compare, external engines, Plan's checkpoint path and its "Launch this plan here" chain.
"""

from __future__ import annotations

import os
import secrets
import threading

import gradio as gr
from fastapi import FastAPI

from backend.public_policy import PublicPolicy
from backend.server.app import DEFAULT_MAX_WAITING_REQUESTS, default_client_share
from backend.server.engine_holder import EngineHolder
from backend.server.fairness import ClientLine
from ui import bench_tab, chat_tab, compare_tab, export_tab, launch_here, launch_tab, monitor_tab, plan_tab
from ui.common import AppContext

THEME = gr.themes.Soft(
    primary_hue="indigo",
    secondary_hue="sky",
    neutral_hue="slate",
    font=["ui-sans-serif", "system-ui", "Segoe UI", "Roboto", "sans-serif"],  # no web fonts: works offline
    font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "monospace"],
)
CSS = """
.msg { padding: 6px 10px; border-radius: 6px; margin: 2px 0; font-size: 0.95em; }
.msg-error { background: #fef2f2; color: #991b1b; border: 1px solid #fecaca; }
.msg-ok { background: #f0fdf4; color: #166534; border: 1px solid #bbf7d0; }
.msg-info { background: #f8fafc; color: #334155; border: 1px solid #e2e8f0; }
.badge { display: inline-block; padding: 4px 12px; border-radius: 999px; font-weight: 600; }
.badge-fits { background: #dcfce7; color: #166534; }
.badge-nofit { background: #fee2e2; color: #991b1b; }
.badge-offline { background: #fef9c3; color: #854d0e; }
.badge-online { background: #e0f2fe; color: #075985; }
.kpis { display: grid; grid-template-columns: repeat(auto-fit, minmax(150px, 1fr)); gap: 8px; }
.kpi { background: #f8fafc; border: 1px solid #e2e8f0; border-radius: 8px; padding: 8px 10px; }
.kpi b { display: block; font-size: 1.25em; }
.kpi span { color: #64748b; font-size: 0.85em; }
.phases { color: #64748b; font-size: 0.85em; margin-top: 6px; }
/* Launch form: a label too long for its column wraps instead of being cut (vLLM's names have no spaces) */
#launch-form [data-testid="block-info"], #launch-form .checkbox-container span {
  max-width: 100%; white-space: normal; overflow-wrap: anywhere; }
/* A narrow screen stacks the Plan tab's columns: the result first, the form below it */
@media (max-width: 640px) { #plan-result { order: -1; } }
/* Compare: its fifteen columns (speed, memory, plan, quality) fit the page; long cells wrap */
#compare-table { table-layout: fixed; width: 100%; font-size: 0.85em; }
#compare-table th, #compare-table td { white-space: normal; overflow-wrap: anywhere; padding: 4px; }
"""


def default_model_for_launch() -> str:
    from backend.default_model import default_model

    return default_model(check_hub=False)  # the packaged GGUF, else the Hub id (a Space downloads it)


def header(ctx: AppContext) -> str:
    """The title, what the app does, and where the OpenAI-compatible API is (not Gradio's own API)."""
    from backend.default_model import DEFAULT_MODEL_NAME

    root = ctx.api_base.removesuffix("/v1")
    return (
        "# LLM serving playground\n"
        "Plan a deployment, launch the embedded engine and chat with it while the charts show batching and "
        "KV cache at work, benchmark any OpenAI-compatible server, export configs. "
        f"Default model: **{DEFAULT_MODEL_NAME}**.\n\n"
        f"**OpenAI-compatible API** of the launched engine: `{ctx.api_base}` "
        f"([reference]({root}/openapi.json): `/v1/chat/completions`, `/v1/completions`, `/v1/models`; "
        f"Prometheus [`/metrics`]({root}/metrics)). Use it with any OpenAI client: "
        f'`OpenAI(base_url="{ctx.api_base}", api_key=...)`.'
    )


# Public mode: Gradio deletes what visitors uploaded (and files it made for them) after an hour, checking
# every ten minutes
PUBLIC_DELETE_CACHE = (600, 3600)


def build_demo(ctx: AppContext) -> gr.Blocks:
    """The tabs; handlers reach the engine through ctx.holder, shared by every browser tab."""
    public = ctx.policy.is_public
    with gr.Blocks(
        title="LLM serving playground", delete_cache=PUBLIC_DELETE_CACHE if public else None
    ) as demo:
        gr.Markdown(header(ctx), elem_id="app-header")
        with gr.Tabs() as tabs:
            with gr.Tab("Plan", id="plan"):
                plan = plan_tab.build(ctx, demo)
            with gr.Tab("Launch", id="launch"):
                launch = launch_tab.build(ctx, demo, plan.plan_state)
            with gr.Tab("Chat", id="chat"):
                chat_timer = chat_tab.build(ctx, demo)
            with gr.Tab("Benchmark", id="bench"):
                bench_tab.build(ctx, plan.plan_state)
            if not public:  # runs the owner's engines: not even registered on a public app
                with gr.Tab("Compare", id="compare"):
                    compare_tab.build(ctx)
            with gr.Tab("Monitor", id="monitor"):
                monitor_tab.build(ctx)
            with gr.Tab("Export", id="export"):
                export_tab.build(ctx, plan.plan_state)
        if not public:  # Plan → Launch reads the plan's paths and starts engines
            launch_here.wire(ctx, tabs, plan, launch)

        def on_tab(event: gr.SelectData) -> gr.Timer:  # live charts refresh only while the Chat tab shows
            return gr.Timer(active=event.value == "Chat")

        tabs.select(on_tab, None, chat_timer)
    return demo


def build_server(ctx: AppContext) -> FastAPI:
    """One FastAPI app: the OpenAI-compatible API of the shared engine, with the UI mounted at /.

    With an API key, the API (/v1, /metrics, /tokenize, /detokenize, /tokenizer_info, /version) needs it;
    the UI and /health do not."""
    from backend.server import build_app
    from backend.server.app import API_PATHS
    from backend.server.upload_limits import UploadLimitMiddleware

    policy = ctx.policy
    app = build_app(
        engine_provider=ctx.holder.get,
        api_key=ctx.api_key,
        key_prefixes=API_PATHS,
        expose_prefix_cache=not policy.is_public,
        max_tokens_limit=policy.max_tokens if policy.is_public else None,
        max_input_tokens=policy.max_input_tokens if policy.is_public else None,
        clients=ctx.clients,
        forwarded_hops=policy.forwarded_hops,
    )
    demo = build_demo(ctx)
    # no "Use via API" footer: it shows Gradio's endpoints, easily taken for the OpenAI API the header names;
    # no MCP server (GRADIO_MCP_SERVER would otherwise publish every handler as a tool)
    mounted = gr.mount_gradio_app(
        app,
        demo,
        path="/",
        theme=THEME,
        css=CSS,
        footer_links=[],
        mcp_server=False,
        max_file_size=policy.max_upload_bytes if policy.is_public else None,
    )
    if policy.is_public:
        mounted.add_middleware(
            UploadLimitMiddleware,
            max_file_bytes=policy.max_upload_bytes,
            max_files=policy.max_uploads,
            forwarded_hops=policy.forwarded_hops,
        )
    quiet_queue(demo)
    return mounted


QUEUE_IDLE_POLL_S = 0.01  # Gradio's own: 0.001


def quiet_queue(demo: gr.Blocks) -> None:
    """Gradio's queue looks for new events every 1 ms when it has none (queueing.Queue.sleep_when_free on
    Linux): an idle app used 9.5% of a core, 2.8% with 10 ms, on a 2-core machine whose other core serves
    the engine. An event waits at most 10 ms more before it starts (a Chat reply's first token: 100-300
    ms)."""
    queue = demo._queue
    queue.sleep_when_free = max(queue.sleep_when_free, QUEUE_IDLE_POLL_S)


def client_line(policy: PublicPolicy) -> ClientLine:
    """Each client's share of the engine's waiting queue, for /v1 and the UI's handlers together."""
    if policy.is_public:
        return ClientLine(policy.max_client_waiting)
    return ClientLine(default_client_share(DEFAULT_MAX_WAITING_REQUESTS))


def preload_engine_modules() -> None:
    """Import torch, the engine and transformers' loaders while the page loads, so that the first Launch
    does not wait for them (seconds on a small CPU; the Launch card's phases show what is left)."""
    import transformers.models.auto.configuration_auto
    import transformers.models.auto.tokenization_auto  # noqa: F401 (the imports are the point)

    import backend.engine.llm  # noqa: F401


def _open_share_tunnel(host: str, port: int) -> None:
    from gradio import networking

    try:
        url = networking.setup_tunnel(
            "127.0.0.1" if host == "0.0.0.0" else host, port, secrets.token_urlsafe(32), None, None
        )
        print(f"* Public share link (anyone with it can use this app and its /v1 API): {url}", flush=True)
    except Exception as exc:  # no tunnel server reachable: keep serving locally
        print(f"* Could not create a share link ({exc}); serving locally only.", flush=True)


def banner(host: str, port: int, ctx: AppContext) -> str:
    """Where the app really listens, in which mode, and what is locked."""
    scopes = {"0.0.0.0": "all network interfaces", "::": "all network interfaces"}
    scopes |= dict.fromkeys(("127.0.0.1", "localhost", "::1"), "this machine only")
    where = scopes.get(host, "that interface only")
    key = "needs the API key" if ctx.api_key else "open (no API key)"
    return (
        f"* Listening on {host}:{port} ({where}); UI at {ctx.api_base.removesuffix('/v1')}/\n"
        f"* OpenAI API {ctx.api_base} and /metrics: {key}\n"
        f"* {ctx.policy.describe()}"
    )


def launch(
    host: str = "127.0.0.1",
    port: int = 7860,
    model: str | None = None,
    share: bool = False,
    public: bool = False,
    api_key: str | None = None,
    unsafe_local: bool = False,
) -> None:
    """Serve the UI and the OpenAI-compatible API on host:port until interrupted. ``public``, a Space's
    environment, ``share`` or a host other than loopback lock what visitors may do
    (backend.public_policy), unless ``unsafe_local`` keeps an exposed app in local mode."""
    import uvicorn

    from backend.public_policy import PublicPolicy, exposure, exposure_notice

    if host == "127.0.0.1" and os.environ.get("GRADIO_SERVER_NAME"):  # a Hugging Face Space asks for 0.0.0.0
        host = os.environ["GRADIO_SERVER_NAME"]
    display_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    exposed_by = exposure(host, share)
    policy = PublicPolicy.from_env(public, exposed_by=exposed_by, unsafe_local=unsafe_local)
    ctx = AppContext(
        EngineHolder(),
        model or default_model_for_launch(),
        f"http://{display_host}:{port}/v1",
        policy=policy,
        api_key=api_key,
        clients=client_line(policy),
    )
    app = build_server(ctx)
    threading.Thread(target=preload_engine_modules, daemon=True).start()
    if policy.is_public:  # visitors cannot launch: the owner's model starts with the app
        threading.Thread(target=launch_tab.launch_default, args=(ctx,), daemon=True).start()
    print(banner(host, port, ctx), flush=True)
    if (notice := exposure_notice(exposed_by, policy)) is not None:
        print(notice, flush=True)
    if share:
        threading.Timer(2.0, _open_share_tunnel, args=(host, port)).start()
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        ctx.holder.shutdown()
