"""The model registry (vLLM's ModelRegistry): a checkpoint's `architectures` name -> the class that runs
it, with the traits the planner and the engine read before building a model.

One line per architecture. An architecture whose transformers model computes exactly what another's class
computes is an alias: it names that class (Mistral and Qwen2 run as Llama: their biases come from the
checkpoint's weight names, their sliding windows from the config: ModelArgs.sliding_windows; Phi-3
checkpoints name the fused qkv_proj and gate_up_proj as the model does). Model files are
imported when a class is asked for, so this table (and the planner, which reads its traits) needs no
torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from backend.engine.models.base import CausalLM


@dataclass(slots=True, frozen=True)
class ModelTraits:
    """What is known of an architecture before its model is built (the planner's mirror reads these)."""

    captured_decode: bool = True  # False: layers the captured decode step has no calls for (decode_graph)
    rope_on_every_layer: bool = True  # False: some layers skip RoPE (SmolLM3)


@dataclass(slots=True, frozen=True)
class ModelEntry:
    module: str  # the file under backend/engine/models/
    class_name: str
    model_types: tuple[str, ...]  # config.json model_type values meaning it (a config without architectures)
    traits: ModelTraits = field(default_factory=ModelTraits)


MODELS: dict[str, ModelEntry] = {
    "LlamaForCausalLM": ModelEntry("llama", "LlamaForCausalLM", ("llama",)),
    "MistralForCausalLM": ModelEntry("llama", "LlamaForCausalLM", ("mistral",)),  # alias of Llama
    "Qwen2ForCausalLM": ModelEntry("llama", "LlamaForCausalLM", ("qwen2",)),  # alias of Llama
    "Qwen3ForCausalLM": ModelEntry("qwen3", "Qwen3ForCausalLM", ("qwen3",)),
    "GraniteForCausalLM": ModelEntry("granite", "GraniteForCausalLM", ("granite",)),
    "MixtralForCausalLM": ModelEntry("mixtral", "MixtralForCausalLM", ("mixtral",)),
    "Qwen3MoeForCausalLM": ModelEntry("qwen3_moe", "Qwen3MoeForCausalLM", ("qwen3_moe",)),
    "GraniteMoeForCausalLM": ModelEntry("granitemoe", "GraniteMoeForCausalLM", ("granitemoe",)),
    "OlmoeForCausalLM": ModelEntry("olmoe", "OlmoeForCausalLM", ("olmoe",)),
    "GptOssForCausalLM": ModelEntry("gpt_oss", "GptOssForCausalLM", ("gpt_oss",)),
    "Gemma3ForCausalLM": ModelEntry(  # sandwich norms (SandwichDecoderLayer)
        "gemma3", "Gemma3ForCausalLM", ("gemma3_text",), ModelTraits(captured_decode=False)
    ),
    "Olmo2ForCausalLM": ModelEntry(  # post-norms (SandwichDecoderLayer)
        "olmo2", "Olmo2ForCausalLM", ("olmo2",), ModelTraits(captured_decode=False)
    ),
    "Phi3ForCausalLM": ModelEntry("llama", "LlamaForCausalLM", ("phi3",)),  # alias: fused names are ours
    "SmolLM3ForCausalLM": ModelEntry(
        "smollm3", "SmolLM3ForCausalLM", ("smollm3",), ModelTraits(rope_on_every_layer=False)
    ),
}


def supported_architectures() -> tuple[str, ...]:
    return tuple(MODELS)


def resolve_architecture(hf_config: Any) -> str:
    """The first of the config's `architectures` that is registered, else the one its model_type names;
    ValueError naming the supported ones otherwise."""
    names = list(getattr(hf_config, "architectures", None) or [])
    model_type = getattr(hf_config, "model_type", None) or ""
    found = next((name for name in names if name in MODELS), None)
    if found is None and not names:
        found = next((name for name, entry in MODELS.items() if model_type in entry.model_types), None)
    if found is None:
        asked = ", ".join(names) or f"model_type {model_type or 'unknown'}"
        raise ValueError(f"Unsupported architecture {asked!r}; supported: {', '.join(MODELS)}")
    return found


def model_class(architecture: str) -> type[CausalLM]:
    """The class registered for architecture (a name resolve_architecture returned), its file imported."""
    entry = MODELS[architecture]
    return getattr(importlib.import_module(f"backend.engine.models.{entry.module}"), entry.class_name)


def traits_of(architecture: str, model_type: str) -> ModelTraits | None:
    """The traits of a config's architecture, else of the one its model_type names (None: the engine runs
    neither); what the planner asks, from config.json alone."""
    if architecture in MODELS:
        return MODELS[architecture].traits
    return next((e.traits for e in MODELS.values() if model_type in e.model_types), None)
