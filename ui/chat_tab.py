"""Chat tab: a streaming chat with the embedded engine, beside live charts of that engine at work."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import gradio as gr

from backend.engine.sampling_params import SamplingParams
from backend.server.engine_holder import EngineHolder
from backend.server.harmony import HarmonyParser
from backend.server.limits import engine_input_limits
from ui import charts, load, structured_panel
from ui.common import (
    AppContext,
    describe,
    error_message,
    form_values,
    info_message,
    message,
    ms,
    optional_int,
    percent,
    required_float,
    required_int,
    tok_s,
)
from ui.engine_access import ensure_engine
from ui.inputs import form_number, form_slider

DEFAULT_SYSTEM = "You are a helpful assistant. Answer briefly."
THINKING = "Thinking"  # the title of a reply's reasoning message (collapsible in the chatbot)
STATS_MARK = (
    "\n\n<sub>reply stats: "  # starts the stats line under each reply; stripped before the next prompt
)


def sampling_params(form: dict[str, Any]) -> SamplingParams:
    """The sampling controls as SamplingParams; ValueError (from SamplingParams) for a value out of range.
    A seed of -1 means a random one."""
    from backend.server.tools_demo import schema_constraint

    stops = [s for s in (form["stop"] or "").split("\n") if s]
    return SamplingParams(
        temperature=required_float(form["temperature"], "temperature", note=" >= 0"),
        top_p=required_float(form["top_p"], "top_p", note=" in (0, 1]"),
        top_k=required_int(form["top_k"], "top_k", minimum=-1),
        max_tokens=required_int(form["max_tokens"], "max tokens"),
        seed=optional_int(form["seed"], "seed", minimum=0, auto=-1),
        stop=stops or None,
        structured_outputs=schema_constraint(form["schema"]) if form.get("use_schema") else None,
    )


def prompt_token_ids(engine: Any, system: str, history: list[dict[str, str]]) -> list[int]:
    """The conversation through the model's chat template, as token ids (no second BOS)."""
    messages = ([{"role": "system", "content": system}] if system.strip() else []) + history
    text = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return engine.tokenizer(text, add_special_tokens=False)["input_ids"]


def reply_stats(started: float, first_token: float | None, finished: float, tokens: int, reason: str) -> str:
    if first_token is None:
        return f"No tokens generated (finish: {reason})."
    decode = (tokens - 1) / (finished - first_token) if tokens > 1 and finished > first_token else None
    return f"TTFT {ms(first_token - started)} · {tok_s(decode)} · {tokens} tokens · finish: {reason}"


def reply_messages(reasoning: str | None, content: str, is_finished: bool) -> list[dict[str, Any]]:
    """A reply as chatbot messages: its reasoning (vLLM's reasoning_content) first as a collapsible
    "Thinking" message, open while it is being written, then the answer."""
    thinking = []
    if reasoning:
        status = "done" if content or is_finished else "pending"
        metadata = {"title": THINKING, "status": status}
        thinking = [{"role": "assistant", "content": reasoning, "metadata": metadata}]
    answer = [{"role": "assistant", "content": content}] if content or is_finished or not thinking else []
    return [*thinking, *answer]


def reply_of(harmony: HarmonyParser | None, output: Any) -> list[dict[str, Any]]:
    """The chatbot messages of an engine output so far: harmony's channels read from its token ids
    (backend.server.harmony, as the server's reasoning_content), else its text."""
    completion, is_finished = output.outputs[0], output.finished
    if harmony is None:
        return reply_messages(None, completion.text, is_finished)
    split = harmony.split(completion.token_ids, is_finished)
    return reply_messages(split.reasoning, split.content or "", is_finished)


def is_thinking(message: dict[str, Any]) -> bool:
    """A shown reasoning message: not sent back to the model (gpt-oss drops past reasoning too)."""
    return (message.get("metadata") or {}).get("title") == THINKING


def message_text(content: str | list[dict[str, Any]]) -> str:
    """A chatbot message's text without its stats line (Gradio passes content as a list of typed parts)."""
    if not isinstance(content, str):
        content = "".join(part.get("text", "") for part in content if part.get("type") == "text")
    return content.split(STATS_MARK)[0]


async def chat(ctx: AppContext, form: dict[str, Any], client: str = "local") -> AsyncIterator[tuple]:
    """Stream one reply to form["message"] after form["history"] (the chatbot). Yields (chatbot, textbox,
    reply stats, message). Cancelling the handler (the Stop button) aborts the request. The conversation
    is bounded before it is tokenized, and ``client`` waits within its share of the queue, as on /v1."""
    text, system = form["message"], form["system"] or ""
    if not (text or "").strip():
        yield gr.skip(), gr.skip(), gr.skip(), error_message("type a message first")
        return
    try:
        params = sampling_params(form)
        ctx.policy.limit(params.max_tokens, "max_tokens", "max tokens")
    except ValueError as exc:
        yield gr.skip(), gr.skip(), gr.skip(), error_message(describe(exc))
        return
    shown = [m for m in form["history"] or [] if not is_thinking(m)]
    history = [{"role": m["role"], "content": message_text(m["content"])} for m in shown]
    history.append({"role": "user", "content": text})
    if (server := ctx.external.ready()) is not None:  # an engine launched from the Launch tab answers
        async for update in chat_external(server, system, history, params):
            yield update
        return
    note = "⏳" if ctx.holder.get() else "⏳ starting the engine (the default model loads in about 20 s)…"
    yield [*history, {"role": "assistant", "content": note}], "", "", ""
    engine, why = await ensure_engine(ctx)
    if engine is None:
        yield history, gr.skip(), "", error_message(why)
        return
    started, first_token, out = time.time(), None, None
    harmony = HarmonyParser.for_tokenizer(engine.tokenizer)  # gpt-oss: reasoning shown apart
    try:
        cap = ctx.policy.max_input_tokens if ctx.policy.is_public else None
        limits = await engine_input_limits(engine, cap)
        limits.check_count(len(history), "messages", "history")
        limits.check_text([system, *(m["content"] for m in history)], "messages")
        ticket = ctx.clients.enter(client)
        try:
            ids = await engine.run_in_tokenizer(prompt_token_ids, engine, system, history)
            limits.check_tokens(len(ids), "messages")
            async for out in engine.generate(ids, params, request_id=f"chat-{uuid.uuid4().hex[:8]}"):
                ticket.leave()  # started
                if first_token is None and out.outputs[0].token_ids:
                    first_token = time.time()
                yield [*history, *reply_of(harmony, out)], gr.skip(), "", ""
        finally:
            ticket.leave()
    except Exception as exc:  # too long, queue or share full, engine stopped: show it, keep the UI alive
        yield history, gr.skip(), "", error_message(describe(exc))
        return
    completion = out.outputs[0]
    stats = reply_stats(
        started, first_token, time.time(), len(completion.token_ids), completion.finish_reason
    )
    *thinking, answer = reply_of(harmony, out)
    answer = {**answer, "content": f"{answer['content']}{STATS_MARK}{stats}</sub>"}
    yield [*history, *thinking, answer], gr.skip(), stats, ""


async def chat_external(server: Any, system: str, history: list, params: Any) -> AsyncIterator[tuple]:
    """The same updates as chat() for an external engine's /v1 (streamed with the openai client)."""
    from ui.chat_remote import stream_reply

    yield [*history, {"role": "assistant", "content": f"⏳ ({server.engine})"}], "", "", ""
    started, reasoning, text, info = time.time(), "", "", {}
    try:
        async for reasoning, text in stream_reply(server, system, history, params, info):
            yield [*history, *reply_messages(reasoning, text, False)], gr.skip(), "", ""
    except Exception as exc:  # the server stopped, refused the request: show it, keep the UI alive
        yield history, gr.skip(), "", error_message(f"{server.engine}: {describe(exc)}")
        return
    stats = reply_stats(started, info["first_token"], time.time(), info["tokens"], info["finish"])
    stats = f"{server.engine} · {stats}"
    *thinking, answer = reply_messages(reasoning, text, True)
    answer = {**answer, "content": f"{text}{STATS_MARK}{stats}</sub>"}
    yield [*history, *thinking, answer], gr.skip(), stats, ""


def live_now_html(sample: dict[str, Any] | None) -> str:
    if sample is None:
        return message("info", "No engine running: the charts start when one is.", elem_id="live-now")
    used, total = sample.get("num_kv_blocks_used"), sample.get("num_kv_blocks_total")
    data = {
        "running": sample["num_requests_running"],
        "waiting": sample["num_requests_waiting"],
        "kv": sample.get("kv_cache_usage") or 0,
    }
    body = (
        f"running <b>{sample['num_requests_running']}</b> · "
        f"waiting <b>{sample['num_requests_waiting']}</b> · "
        f"KV cache <b>{percent(sample.get('kv_cache_usage'))}</b> ({used}/{total} blocks) · "
        f"generation <b>{tok_s(sample.get('generation_tokens_per_s'))}</b> · "
        f"prefix hits <b>{percent(sample.get('prefix_cache_hit_rate'))}</b> · "
        f"preemptions <b>{sample.get('num_preemptions_total', 0)}</b>{speculation_html(sample)}"
        f"{threads_html(sample)}"
    )
    return message("info", body_html=body, elem_id="live-now", data=data)


def threads_html(sample: dict[str, Any]) -> str:
    """The CPU threads the embedded engine steps on now (fewer while other processes take its cores)."""
    threads = sample.get("compute_threads")
    return f" · CPU threads <b>{threads}</b>" if threads else ""


def speculation_html(sample: dict[str, Any]) -> str:
    """Draft acceptance since the last sample, when the engine verified drafts in that window."""
    rate, length = sample.get("spec_decode_acceptance_rate"), sample.get("spec_decode_mean_acceptance_length")
    if rate is None or length is None:
        return ""
    return f" · drafts accepted <b>{percent(rate)}</b> ({length:.2f} tokens per step)"


def refresh_live(holder: EngineHolder, is_public: bool = False, external: Any = None) -> tuple:
    """Timer handler: (numbers, live chart, KV block map, expert load) from the shared sample history; from
    the /metrics of an external engine launched from the Launch tab while one is ready (no expert load).

    In public mode prefix-cache hits are not shown and the block map neither tells requests apart nor
    marks shared blocks: either would let a visitor see whether someone else sent a prompt with the same
    beginning."""
    server = external.ready() if external is not None else None
    if server is not None:
        samples = server.samples()
        if not samples:
            return live_now_html(None), gr.skip(), gr.skip(), gr.update(visible=False)
        return (
            live_now_html(samples[-1]),
            charts.live_figure(samples, title=f"{server.engine} /metrics"),
            gr.skip(),
            gr.update(visible=False),  # /metrics has no per-expert counts
        )
    samples = holder.samples()
    if not samples:
        return live_now_html(None), gr.skip(), gr.skip(), gr.update(visible=False)
    stats = holder.last_stats()
    owners = stats.block_owners if stats is not None else {}
    shared = stats.shared_blocks if stats is not None else {}
    if is_public:  # a block shared with another request would show a prefix-cache hit too
        samples = [{**sample, "prefix_cache_hit_rate": None} for sample in samples]
        owners = {"in use": sorted({b for blocks in owners.values() for b in blocks})} if owners else {}
        shared = {}
    total = stats.num_kv_blocks_total if stats is not None else 0
    block_map = charts.kv_block_map_figure(owners, total, shared_blocks=shared) if total else gr.skip()
    return live_now_html(samples[-1]), charts.live_figure(samples), block_map, expert_load_update(holder)


def expert_load_update(holder: EngineHolder) -> Any:
    """The expert-load heatmap of a MoE model (tokens per expert per layer, last seconds); else hidden."""
    load = holder.expert_load()
    if load is None:
        return gr.update(visible=False)
    return gr.update(value=charts.expert_load_figure(load), visible=True)


def build(ctx: AppContext, demo: gr.Blocks) -> gr.Timer:
    """The Chat tab; returns its timer so the app can run it only while the tab is visible."""
    with gr.Row():
        with gr.Column(scale=5):
            chatbot = gr.Chatbot(  # no floating label: it covered the first lines of a scrolled reply
                label="Chat with the launched engine",
                show_label=False,
                placeholder="Chat with the engine launched in the Launch tab.",
                height=420,
                elem_id="chatbot",
                buttons=["copy"],
                feedback_options=None,
            )
            text = gr.Textbox(  # the label names the API parameter ("message"); the page hides it
                label="message",
                placeholder="Ask something and press Enter",
                show_label=False,
                elem_id="chat-input",
            )
            with gr.Row():
                send = gr.Button("Send", variant="primary", elem_id="chat-send")
                stop = gr.Button("Stop", variant="stop", elem_id="chat-stop")
                clear = gr.Button("Clear")
            stats = gr.Markdown(elem_id="chat-reply-stats")
            message_box = gr.HTML(elem_id="chat-message")
            form: dict[str, Any] = {"message": text, "history": chatbot}
            form["system"] = gr.Textbox(DEFAULT_SYSTEM, label="System prompt", lines=2)
            form["use_schema"], form["schema"] = structured_panel.build(ctx)
            with gr.Accordion("Sampling", open=False):
                with gr.Row():
                    form["temperature"] = form_slider(
                        0, 2, value=0, step=0.05, label="temperature (0 = greedy)"
                    )
                    form["top_p"] = form_slider(0.01, 1, value=1, step=0.01, label="top_p")
                    form["top_k"] = form_number(-1, label="top_k (-1 = off)", precision=0, minimum=-1)
                with gr.Row():
                    form["max_tokens"] = form_number(
                        256, label="max tokens", precision=0, minimum=1, elem_id="chat-max-tokens"
                    )
                    form["seed"] = form_number(-1, label="seed (-1 = random)", precision=0, minimum=-1)
                    form["stop"] = gr.Textbox("", label="stop strings (one per line)", lines=1)
        with gr.Column(scale=6):
            now = gr.HTML(live_now_html(None), elem_id="live-now-box")
            live = gr.Plot(label="Live engine metrics (1 s)", elem_id="live-chart")
            load.build(ctx)
            block_map = gr.Plot(label="KV blocks by request", elem_id="kv-block-map")
            expert_map = gr.Plot(  # shown for mixture-of-experts models only
                label="Expert load (tokens per expert, per MoE layer)", elem_id="expert-load", visible=False
            )

    async def on_chat(data: dict, request: gr.Request) -> AsyncIterator[tuple]:
        async for update in chat(ctx, form_values(form, data), ctx.client_of(request)):
            yield update

    events = [
        trigger(
            on_chat,
            set(form.values()),
            [chatbot, text, stats, message_box],
            concurrency_limit=None,
            show_progress="hidden",
            api_name=api_name,
        )
        for trigger, api_name in ((send.click, "chat"), (text.submit, "chat_submit"))
    ]
    # cancelling the reply's handler closes its stream, which aborts the request and frees its KV blocks
    stop.click(lambda: info_message("Stopped: the request was aborted."), None, message_box, cancels=events)
    clear.click(lambda: ([], "", ""), None, [chatbot, stats, message_box])
    timer = gr.Timer(1.0, active=False)
    timer.tick(
        lambda: refresh_live(ctx.holder, ctx.policy.is_public, ctx.external),
        None,
        [now, live, block_map, expert_map],
        show_progress="hidden",
    )
    return timer
