"""Chat with an external engine (ui/chat_remote.py) against a real OpenAI-compatible server (the project's
own, serving a tiny random llama), through the real openai client: the page gets the reply paced (one
update per PAGE_INTERVAL_S at most) and always the whole reply last, equal to the server's own answer."""

from __future__ import annotations

import asyncio
import itertools
from types import SimpleNamespace

import pytest
from openai import OpenAI

from ui import chat_remote

HISTORY = [{"role": "user", "content": "Count to twenty."}]
PARAMS = SimpleNamespace(temperature=0.0, top_p=1.0, top_k=0, max_tokens=48, seed=0, stop=None)


def page_updates(url: str) -> tuple[list[str], dict]:
    target = SimpleNamespace(base_url=f"{url}/v1", served_name="tiny")
    info: dict = {}

    async def collect() -> list[str]:
        return [text async for _, text in chat_remote.stream_reply(target, "", HISTORY, PARAMS, info)]

    return asyncio.run(collect()), info


@pytest.mark.parametrize(("interval", "expected"), [(3600.0, "first and whole"), (0.0, "one a chunk")])
def test_the_page_gets_the_reply_paced_and_whole_last(served, monkeypatch, interval, expected):
    _, server = served
    monkeypatch.setattr(chat_remote, "PAGE_INTERVAL_S", interval)
    whole = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0).chat.completions.create(
        model="tiny",
        messages=HISTORY,
        temperature=0,
        max_tokens=48,
        seed=0,  # type: ignore[arg-type]
    )
    updates, info = page_updates(server.url)
    assert updates[-1] == whole.choices[0].message.content and info["tokens"] == 48
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(updates))
    if expected == "first and whole":  # an hour apart: the first chunk, then the whole reply at the end
        assert len(updates) == 2
    else:  # no pacing: every chunk that carries text (a token each, some decode to nothing)
        assert 2 < len(updates) <= 48 and len(set(updates)) == len(updates)
