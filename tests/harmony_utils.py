"""A tiny tokenizer that speaks gpt-oss's harmony format, and a tiny random Llama that uses it (no tests
here). The tokenizer is the default model's byte-level BPE plus harmony's control tokens as special tokens,
with gpt-oss's real chat template (llama.cpp keeps it as models/templates/openai-gpt-oss-120b.jinja) and
<|return|> as its end of sequence, as transformers' GptOss tokenizer config has them."""

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


@cache
def tiny_harmony_llama() -> str:
    """A tiny random Llama whose tokenizer and chat template are gpt-oss's (harmony), eos <|return|>:
    a stand-in until the engine runs gpt-oss itself, for the server and the Chat tab."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    tokenizer = harmony_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|return|>"),
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    path = _ROOT / "llama"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)
