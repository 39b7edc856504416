"""The Chat tab shows a harmony model's reasoning apart from its answer: a collapsible "Thinking" message
(open while it is written) before the answer, from the engine's streamed outputs (a grammar over harmony's
special tokens makes the tiny random model answer in harmony's shape); the reasoning is not sent back."""

from __future__ import annotations

import asyncio
import re

import pytest

from backend.engine import SamplingParams
from backend.engine.sampling_params import StructuredOutputsParams
from backend.server.harmony import HarmonyParser
from tests.gpt_oss_utils import tiny_gpt_oss
from tests.harmony_utils import HARMONY_GRAMMAR
from tests.server_utils import start_engine
from ui import chat_tab


@pytest.fixture(scope="module")
def engine():
    engine = start_engine(tiny_gpt_oss(), max_num_seqs=2, num_kv_blocks=64, max_model_len=512)
    yield engine
    engine.shutdown()


def streamed_replies(engine, max_tokens: int = 120) -> list[list[dict]]:
    """The chatbot's reply messages after each streamed output of one harmony answer."""
    history = [{"role": "user", "content": "Say hello."}]
    ids = chat_tab.prompt_token_ids(engine, "Be brief.", history)
    grammar = StructuredOutputsParams(grammar=HARMONY_GRAMMAR)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, structured_outputs=grammar)
    harmony = HarmonyParser.for_tokenizer(engine.tokenizer)
    assert harmony is not None

    async def run() -> list[list[dict]]:
        return [chat_tab.reply_of(harmony, out) async for out in engine.generate(ids, params, request_id="h")]

    return asyncio.run(run())


def test_the_reasoning_is_a_thinking_message_before_the_answer(engine):
    replies = streamed_replies(engine)
    thinking, answer = replies[-1]
    assert thinking["metadata"] == {"title": "Thinking", "status": "done"}
    assert re.fullmatch("[a-z ]+", thinking["content"]) and re.fullmatch("[A-Z ]+", answer["content"])
    assert chat_tab.is_thinking(thinking) and not chat_tab.is_thinking(answer)
    while_thinking = [r for r in replies if len(r) == 1 and r[0].get("metadata")]
    assert while_thinking and all(r[0]["metadata"]["status"] == "pending" for r in while_thinking)
    assert thinking["content"].startswith(while_thinking[-1][0]["content"])  # it grew as it streamed
    assert all(len(r) <= 2 for r in replies)


def test_a_reply_cut_while_thinking_ends_with_an_empty_answer(engine):
    thinking, answer = streamed_replies(engine, max_tokens=5)[-1]
    assert thinking["metadata"]["status"] == "done" and answer == {"role": "assistant", "content": ""}


def test_a_model_without_harmony_shows_its_text():
    shown = chat_tab.reply_messages(None, "Hi.", is_finished=False)
    assert shown == [{"role": "assistant", "content": "Hi."}]
    assert chat_tab.reply_messages(None, "", is_finished=False) == [{"role": "assistant", "content": ""}]
