"""The load control beside the chat: N concurrent requests, so batching and KV pressure become visible.

The prompts share a long system prompt, so prefix caching shows up in the hit-rate chart too.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import gradio as gr

from ui.common import AppContext, describe, error_message, message, ok_message, required_int
from ui.inputs import form_number

MAX_LOAD_REQUESTS = 256
SHARED_SYSTEM = (
    "You are a patient teacher who explains ideas from science, history and everyday life in plain words, "
    "with one short example for every idea, and who never uses jargon without explaining it first."
)
TOPICS = (
    "rainbows",
    "tides",
    "bread rising",
    "the printing press",
    "vaccines",
    "bicycles",
    "volcanoes",
    "money",
    "the seasons",
    "magnets",
    "compound interest",
    "photosynthesis",
    "sound",
    "bridges",
)


def load_prompts(engine: Any, n: int) -> list[list[int]]:
    tokenizer = engine.tokenizer
    prompts = []
    for i in range(n):
        messages = [
            {"role": "system", "content": SHARED_SYSTEM},
            {"role": "user", "content": f"Explain {TOPICS[i % len(TOPICS)]} (request {i + 1})."},
        ]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return prompts


async def fire_load(
    ctx: AppContext, num_requests: Any, max_tokens: Any, client: str = "local"
) -> AsyncIterator[str]:
    """Send N concurrent requests to the engine; yields a progress line, then a summary. Each request
    waits within ``client``'s share of the queue, as a /v1 request does."""
    try:
        policy = ctx.policy
        n = required_int(num_requests, "number of requests")
        tokens = required_int(max_tokens, "max tokens per request")
        if n > MAX_LOAD_REQUESTS:
            raise ValueError(f"number of requests must be at most {MAX_LOAD_REQUESTS}, got {n}")
        policy.limit(n, "max_load_requests", "number of requests")
        policy.limit(tokens, "max_tokens", "max tokens per request")
    except ValueError as exc:
        yield error_message(describe(exc))
        return
    engine = ctx.holder.get()
    if engine is None:
        yield error_message("no engine running: press Launch in the Launch tab first")
        return
    from backend.engine import SamplingParams

    params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=tokens, ignore_eos=True, seed=0)
    tag = uuid.uuid4().hex[:6]

    async def one(i: int, prompt: list[int]) -> int:
        count = 0
        ticket = ctx.clients.enter(client)
        try:
            async for out in engine.generate(prompt, params, request_id=f"load-{tag}-{i}"):
                ticket.leave()  # started
                count = len(out.outputs[0].token_ids)
        finally:
            ticket.leave()
        return count

    prompts = await engine.run_in_tokenizer(load_prompts, engine, n)
    # each request passes the engine's admission (waiting-queue limit) like an HTTP request does
    tasks = [asyncio.create_task(one(i, p)) for i, p in enumerate(prompts)]
    loop = asyncio.get_running_loop()
    started, finished, generated, failures = loop.time(), 0, 0, []
    yield message("info", f"{n} requests sent…", elem_id="load-status")
    try:
        for next_done in asyncio.as_completed(tasks):
            try:
                generated += await next_done
            except Exception as exc:  # e.g. the engine was stopped: report, keep the UI alive
                failures.append(describe(exc))
            finished += 1
            yield message("info", f"{finished}/{n} finished…", elem_id="load-status")
    finally:
        for task in tasks:
            task.cancel()  # no-op for finished ones; aborts the rest if this handler is cancelled
    seconds = loop.time() - started
    if failures:
        yield error_message(f"{len(failures)} of {n} requests failed: {failures[0]}")
        return
    yield ok_message(
        f"{n} requests, {generated} tokens in {seconds:.1f} s = {generated / seconds:,.1f} tok/s"
    )


def build(ctx: AppContext) -> None:
    with gr.Row():
        n = form_number(32, label="Concurrent requests", precision=0, minimum=1, elem_id="load-n", scale=1)
        tokens = form_number(
            128, label="Max tokens each", precision=0, minimum=1, elem_id="load-tokens", scale=1
        )
        fire = gr.Button("Fire load", elem_id="load-fire", scale=1)
    status = gr.HTML(elem_id="load-message")

    async def on_fire(num: Any, max_tokens: Any, request: gr.Request) -> AsyncIterator[str]:
        async for update in fire_load(ctx, num, max_tokens, ctx.client_of(request)):
            yield update

    fire.click(on_fire, [n, tokens], status, concurrency_limit=None, api_name="fire_load")
