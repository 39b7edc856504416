"""A tiny tokenizer that speaks gpt-oss's harmony format (no tests here; tests/gpt_oss_utils.py's tiny gpt-oss
uses it). The tokenizer is the default model's byte-level BPE plus harmony's control tokens as special
tokens, with gpt-oss's real chat template (llama.cpp keeps it as models/templates/openai-gpt-
oss-120b.jinja) and <|return|> as its end of sequence, as transformers' GptOss tokenizer config has them."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache
from pathlib import Path

from tests.engine_utils import tokenizer_dir
from tests.gguf_utils import llama_cpp_dir

HARMONY_SPECIAL_TOKENS = (
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|return|>",
    "<|call|>",
    "<|constrain|>",
)
# A Lark grammar (llguidance: <|token|> is a special token) that makes any model answer in harmony's shape:
# the reasoning in lower case, the answer in upper case, so each field's text says which channel it came from
HARMONY_GRAMMAR = r"""
start: analysis final
analysis: <|channel|> "analysis" <|message|> THINK <|end|>
final: <|start|> "assistant" <|channel|> "final" <|message|> ANSWER <|return|>
THINK: /[a-z ]{1,40}/
ANSWER: /[A-Z ]{1,24}/
"""
# the one function the harmony tool-call tests offer (an OpenAI chat `tools` entry)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
_ROOT = Path(tempfile.mkdtemp(prefix="harmony-tests-"))
atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)


@cache
def harmony_tokenizer_dir() -> str:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir())
    tokenizer.add_special_tokens({"additional_special_tokens": list(HARMONY_SPECIAL_TOKENS)})
    template = llama_cpp_dir() / "models" / "templates" / "openai-gpt-oss-120b.jinja"
    tokenizer.chat_template = template.read_text()
    tokenizer.eos_token = "<|return|>"
    path = _ROOT / "tokenizer"
    tokenizer.save_pretrained(path)
    return str(path)


def harmony_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(harmony_tokenizer_dir())
