"""A chat rendered through the model's chat template into prompt token ids: one path for
/v1/chat/completions, /v1/responses and /tokenize (messages), so the three count the same tokens.

Tools reach the template natively when it renders them, else as Hermes-style text (``tools.py``).
``ChatTemplateOptions`` carries vLLM's template switches (``add_generation_prompt``,
``continue_final_message``, ``chat_template_kwargs``) and whether to add special tokens on top.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from backend.server.errors import OpenAIError
from backend.server.harmony import HarmonyTokens
from backend.server.harmony_chat import one_call_per_turn
from backend.server.protocol import ChatCompletionRequest, ChatMessage, message_dicts
from backend.server.tools import Tool, render_messages, template_renders_tools

# The template's own switches: a request's chat_template_kwargs may not override them.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {"messages", "tools", "add_generation_prompt", "continue_final_message", "tokenize"}
)


class ChatInput(Protocol):
    """What a chat request carries to the template (chat completions, responses, tokenize)."""

    @property
    def messages(self) -> list[ChatMessage]: ...

    @property
    def tools(self) -> list[Tool] | None: ...


@dataclass(slots=True)
class ChatTemplateOptions:
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False  # on top of what the template writes (vLLM's default: none)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.add_generation_prompt and self.continue_final_message:
            raise OpenAIError(
                400,
                "Cannot set both continue_final_message and add_generation_prompt to true: "
                "set add_generation_prompt to false to continue the last message",
                param="continue_final_message",
            )
        reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(self.chat_template_kwargs))
        if reserved:
            raise OpenAIError(
                400,
                f"chat_template_kwargs may not set {', '.join(reserved)}: use the request's own fields",
                param="chat_template_kwargs",
            )


def chat_options(req: ChatCompletionRequest) -> ChatTemplateOptions:
    """A chat completion's template switches: its reasoning_effort, which gpt-oss's template writes into
    the system message (other templates ignore it)."""
    effort = {"reasoning_effort": req.reasoning_effort} if req.reasoning_effort else {}
    return ChatTemplateOptions(chat_template_kwargs=effort)


def render_chat(tokenizer, req: ChatInput, options: ChatTemplateOptions) -> str:
    """The prompt text of the chat, as the model's template writes it."""
    if not getattr(tokenizer, "chat_template", None):
        raise OpenAIError(
            400, "This model has no chat template; use /v1/completions instead.", "no_chat_template"
        )
    tools = [t.model_dump() for t in req.tools] if req.tools else None
    native = template_renders_tools(tokenizer)
    messages = render_messages(message_dicts(req.messages), req.tools, native)
    if HarmonyTokens.of(tokenizer) is not None:  # gpt-oss's template renders one call per turn
        messages = one_call_per_turn(messages)
    try:
        return tokenizer.apply_chat_template(
            messages,
            tools=tools if native else None,
            tokenize=False,
            add_generation_prompt=options.add_generation_prompt,
            continue_final_message=options.continue_final_message,
            **options.chat_template_kwargs,
        )
    except Exception as exc:  # the template's own checks, e.g. roles that must alternate
        raise OpenAIError(
            400, f"The chat template rejected the messages: {exc}", "invalid_messages"
        ) from None


def chat_prompt_ids(tokenizer, req: ChatInput, options: ChatTemplateOptions | None = None) -> list[int]:
    options = options or ChatTemplateOptions()
    text = render_chat(tokenizer, req, options)
    return list(tokenizer(text, add_special_tokens=options.add_special_tokens)["input_ids"])
