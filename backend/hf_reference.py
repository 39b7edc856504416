"""transformers as the reference implementation: load any supported model the way the engine does.

Used for the reference side of correctness tests and benchmarks, and as the simplest generate path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backend.default_model import split_gguf_path

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def load_hf_model(
    model: str, dtype: torch.dtype | None = None, trust_remote_code: bool = False
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load (model, tokenizer) with transformers from a local folder, a GGUF file or a Hub id."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, gguf_file = split_gguf_path(model)
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code, **kwargs)
    hf_model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=dtype or torch.float32, trust_remote_code=trust_remote_code, **kwargs
    )
    return hf_model.eval(), tokenizer


def hf_chat_greedy(
    hf_model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, str]],
    max_new_tokens: int = 16,
) -> str:
    """Greedy answer to one conversation, through the model's chat template."""
    import torch

    inputs = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.inference_mode():
        out = hf_model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
