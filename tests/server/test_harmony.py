"""gpt-oss's harmony output read into reasoning_content and content (vLLM's parse_chat_output), from the
token ids a tokenizer with harmony's control tokens gives for real harmony text, whole and token by token."""

from __future__ import annotations

import pytest

from backend.engine.outputs import CompletionOutput, RequestOutput
from backend.server.chat_prompt import chat_options, chat_prompt_ids
from backend.server.harmony import HarmonyParser, HarmonyTokens, ReasoningSplit, ReasoningStream
from backend.server.protocol import ChatCompletionRequest
from backend.server.responses_output import ResponsesFormatter
from backend.server.responses_protocol import ResponsesRequest
from backend.server.responses_stream import ResponsesEvents
from tests.engine_utils import tokenizer_dir
from tests.harmony_utils import harmony_tokenizer

ANSWER = (
    "<|channel|>analysis<|message|>The user greets. Reply briefly.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?<|return|>"
)


@pytest.fixture(scope="module")
def tokenizer():
    return harmony_tokenizer()


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def split(tokenizer, text: str, is_finished: bool = True) -> ReasoningSplit:
    parser = HarmonyParser.for_tokenizer(tokenizer)
    assert parser is not None
    return parser.split(ids_of(tokenizer, text), is_finished)


def test_analysis_is_the_reasoning_and_final_the_content(tokenizer):
    thought = "The user greets. Reply briefly."
    expected = ReasoningSplit(thought, "Hello! How can I help?", [], len(ids_of(tokenizer, thought)))
    assert split(tokenizer, ANSWER) == expected


@pytest.mark.parametrize(
    ("text", "reasoning", "content"),
    [
        # several analysis messages, then the final one: joined by newlines
        (
            "<|channel|>analysis<|message|>one<|end|><|start|>assistant<|channel|>analysis<|message|>two<|end|>"
            "<|start|>assistant<|channel|>final<|message|>done<|return|>",
            "one\ntwo",
            "done",
        ),
        # a tool call (a recipient, in the role or after the channel) is neither reasoning nor content
        (
            "<|channel|>analysis<|message|>Need the weather.<|end|>"
            "<|start|>assistant to=functions.get_weather"
            '<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>',
            "Need the weather.",
            None,
        ),
        ('<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": 1}<|call|>', None, None),
        # a preamble (commentary without a recipient) is shown: content
        (
            "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>final"
            "<|message|>It is sunny.<|return|>",
            None,
            "Let me check.\nIt is sunny.",
        ),
        # cut by max_tokens inside the reasoning, and inside the answer
        ("<|channel|>analysis<|message|>Thinking about", "Thinking about", None),
        (
            "<|channel|>analysis<|message|>ok<|end|><|start|>assistant<|channel|>final<|message|>Hel",
            "ok",
            "Hel",
        ),
        # a header that never reached its text shows nothing yet
        ("<|channel|>analysis<|message|>ok<|end|><|start|>assistant<|channel|>fin", "ok", None),
    ],
)
def test_channels_recipients_and_cut_outputs(tokenizer, text, reasoning, content):
    got = split(tokenizer, text)  # a call's arguments are test_harmony_tools'
    assert (got.reasoning, got.content) == (reasoning, content)


def test_an_output_without_harmony_is_content_once_it_ends(tokenizer):
    assert split(tokenizer, "Just text.", is_finished=False) == ReasoningSplit(None, None)
    assert split(tokenizer, "Just text.") == ReasoningSplit(None, "Just text.")


def test_streamed_deltas_add_up_to_the_whole_output_token_by_token(tokenizer):
    text = ANSWER.replace("briefly.", "briefly 🙂 — ünïcode.")  # multi-byte characters split over tokens
    ids = ids_of(tokenizer, text)
    whole = split(tokenizer, text)
    stream = ReasoningStream(HarmonyParser.for_tokenizer(tokenizer))
    deltas = [stream.delta(ids[:n], is_finished=n == len(ids)) for n in range(1, len(ids) + 1)]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content", "") for d in deltas)
    assert (reasoning, content) == (whole.reasoning, whole.content)
    assert "🙂" in reasoning and not any("\ufffd" in d.get("reasoning_content", "") for d in deltas)
    first_answer = next(i for i, d in enumerate(deltas) if "content" in d)
    assert all("content" not in d for d in deltas[:first_answer])  # the reasoning streams first
    assert all("reasoning_content" not in d for d in deltas[first_answer:])


def test_only_a_tokenizer_with_the_control_tokens_speaks_harmony(tokenizer):
    from transformers import AutoTokenizer

    assert HarmonyTokens.of(AutoTokenizer.from_pretrained(tokenizer_dir())) is None  # SmolLM2's own
    tokens = HarmonyTokens.of(tokenizer)
    assert tokens is not None and tokenizer.convert_ids_to_tokens(tokens.message) == "<|message|>"
    assert {tokenizer.convert_ids_to_tokens(i) for i in tokens.ends} == {"<|end|>", "<|return|>", "<|call|>"}


def test_the_chat_template_ends_the_prompt_where_the_parser_begins(tokenizer):
    """gpt-oss's template: the prompt ends with <|start|>assistant, earlier answers keep only their final
    channel (the reasoning of past turns is dropped), as the parser's first header expects."""
    history = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Again"},
    ]
    prompt = tokenizer.apply_chat_template(history, add_generation_prompt=True, tokenize=False)
    assert prompt.endswith("<|start|>assistant")
    assert "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?<|end|>" in prompt


@pytest.mark.parametrize("effort", ["low", "high"])
def test_reasoning_effort_reaches_gpt_oss_system_message(tokenizer, effort):
    messages = [{"role": "user", "content": "Hi"}]
    request = ChatCompletionRequest(messages=messages, reasoning_effort=effort)
    prompt = tokenizer.decode(chat_prompt_ids(tokenizer, request, chat_options(request)))
    assert f"Reasoning: {effort}\n" in prompt
    plain = ChatCompletionRequest(messages=messages)
    default = tokenizer.decode(chat_prompt_ids(tokenizer, plain, chat_options(plain)))
    assert "Reasoning: medium\n" in default  # the template's own default
    with pytest.raises(ValueError, match="reasoning_effort"):
        ChatCompletionRequest(messages=messages, reasoning_effort="extreme")


def test_a_responses_message_is_the_final_channel_whole_and_streamed(tokenizer):
    """/v1/responses (n=1): the output message holds harmony's final channel, not the analysis (a reasoning
    item before it); the streamed text deltas add up to it."""
    ids = ids_of(tokenizer, ANSWER)
    req = ResponsesRequest(model="m", input="Hi")

    def output(upto: int, finish_reason: str | None) -> RequestOutput:
        text = tokenizer.decode(ids[:upto], skip_special_tokens=True)
        comp = CompletionOutput(0, text, ids[:upto], finish_reason=finish_reason)
        return RequestOutput("r", None, [1, 2], [comp], finished=finish_reason is not None)

    whole = ResponsesFormatter("m", tokenizer, None, req, HarmonyTokens.of(tokenizer))
    reasoning, item = whole.response([output(len(ids), "stop")])["output"]
    assert reasoning["type"] == "reasoning"  # the analysis: test_harmony_tools
    assert item["type"] == "message" and item["content"][0]["text"] == "Hello! How can I help?"
    events = ResponsesEvents(ResponsesFormatter("m", tokenizer, None, req, HarmonyTokens.of(tokenizer)))
    sent = [
        e
        for upto in range(1, len(ids) + 1)
        for e in events.update(output(upto, "stop" if upto == len(ids) else None))
    ]
    deltas = "".join(e["delta"] for e in sent if e["type"] == "response.output_text.delta")
    assert deltas == "Hello! How can I help?"
