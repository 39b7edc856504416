"""Chat-tab panels: constrain replies to a JSON schema, and a tools demo (call, local result, answer)."""

from __future__ import annotations

import json
from typing import Any

import gradio as gr

from backend.server.limits import engine_input_limits
from backend.server.tools_demo import DEMO_TOOLS, SAMPLE_SCHEMAS, run_tools_demo
from ui.common import AppContext, describe, error_message
from ui.engine_access import ensure_engine

DEMO_QUESTION = "What is the weather in Paris in celsius?"


def demo_markdown(messages: list[dict[str, Any]]) -> str:
    """The demo's conversation, one block per step."""
    parts = []
    for m in messages:
        if m["role"] == "user":
            parts.append(f"**user**: {m['content']}")
        elif m["role"] == "tool":
            parts.append(f"**tool result** (local function) → `{m['content']}`")
        elif m.get("tool_calls"):
            for call in m["tool_calls"]:
                fn = call["function"]
                parts.append(f"**assistant calls** `{fn['name']}({fn['arguments']})`")
        else:
            parts.append(f"**assistant (final answer)**: {m.get('content') or ''}")
    return "\n\n".join(parts)


def build(ctx: AppContext) -> tuple[gr.Checkbox, gr.Code]:
    """Both accordions; returns the schema controls the chat passes to its sampling parameters."""

    with gr.Accordion("Structured output (JSON schema)", open=False, elem_id="schema-panel"):
        with gr.Row():
            use_schema = gr.Checkbox(False, label="constrain replies to this schema", elem_id="schema-on")
            sample = gr.Dropdown(
                list(SAMPLE_SCHEMAS), value="person", label="sample", elem_id="schema-sample"
            )
        schema = gr.Code(
            json.dumps(SAMPLE_SCHEMAS["person"], indent=2),
            language="json",
            label="JSON schema",
            elem_id="schema",
        )
        sample.change(lambda name: json.dumps(SAMPLE_SCHEMAS[name], indent=2), sample, schema)
    with gr.Accordion("Tools demo (function calling)", open=False, elem_id="tools-panel"):
        names = ", ".join(f"`{t.function.name}`" for t in DEMO_TOOLS)
        gr.Markdown(
            f"Two functions run here, in this process: {names}. The model must call one "
            '(`tool_choice="required"`), the result goes back as a `tool` message, then it answers.'
        )
        question = gr.Textbox(DEMO_QUESTION, label="question", elem_id="tools-question")
        run = gr.Button("Run the tools demo", elem_id="tools-run")
        steps = gr.Markdown(elem_id="tools-steps")
        message = gr.HTML(elem_id="tools-message")

    async def on_run(text: str, request: gr.Request) -> tuple:
        engine, why = await ensure_engine(ctx)
        if engine is None:
            return gr.skip(), error_message(why)
        try:  # bounded before the chat template sees it; within the client's share of the queue
            cap = ctx.policy.max_input_tokens if ctx.policy.is_public else None
            (await engine_input_limits(engine, cap)).check_text(text or "", "question")
            ticket = ctx.clients.enter(ctx.client_of(request))
            try:
                turn = await run_tools_demo(engine, text or DEMO_QUESTION)
            finally:
                ticket.leave()
        except Exception as exc:  # engine stopped, prompt too long, share full: show it, keep the UI alive
            return gr.skip(), error_message(describe(exc))
        return demo_markdown(turn.messages), ""

    run.click(on_run, question, [steps, message], concurrency_limit=None)
    return use_schema, schema
