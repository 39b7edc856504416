"""Launch refuses an architecture the engine has no class for before anything is downloaded, reading only
the model's config: a Hub id's config.json (the Hub replaced by a function that records what was asked,
named mock_hub), a local folder's config.json, a GGUF file's metadata. The Plan tab's "Launch this plan
here" asks the same function and offers only what runs."""

from __future__ import annotations

import html
import json
from dataclasses import replace

import numpy as np
import pytest
from gguf import GGUFWriter

from backend import model_support
from backend.default_model import packaged_gguf
from backend.engine.loader import resolve_model
from backend.engine.models.registry import MODELS, supported_architectures
from backend.model_support import UnsupportedArchitecture, check_architecture
from backend.planner import PlanRequest, detect_local_hardware
from backend.planner.launch_here import GIB, decide
from backend.server.engine_holder import EngineHolder
from ui import launch_here, launch_tab

GGUF = str(packaged_gguf())


def gpt_oss_config() -> dict:
    from transformers import GptOssConfig

    config = GptOssConfig(num_hidden_layers=2, hidden_size=64, num_local_experts=4)
    return config.to_dict() | {"architectures": ["GptOssForCausalLM"]}


def llama_config() -> dict:
    from transformers import LlamaConfig

    return LlamaConfig(num_hidden_layers=2, hidden_size=64).to_dict() | {
        "architectures": ["LlamaForCausalLM"]
    }


class MockHub:
    """The Hub as model_support sees it: config.json per repo id; every other download fails the test."""

    def __init__(self, configs: dict[str, dict]) -> None:
        self.configs = configs
        self.asked: list[str] = []

    def config(self, repo_id: str) -> dict:
        self.asked.append(repo_id)
        if repo_id not in self.configs:
            raise OSError(f"could not read {repo_id}'s config.json from the Hugging Face Hub (mock: no repo)")
        return self.configs[repo_id]


@pytest.fixture(autouse=True)
def unregistered(monkeypatch):
    """gpt-oss and Mixtral as architectures the engine lacks, whatever the registry holds by now."""
    for name in ("GptOssForCausalLM", "MixtralForCausalLM"):
        monkeypatch.delitem(MODELS, name, raising=False)


@pytest.fixture
def hub(monkeypatch):
    hub = MockHub({"someone/tiny-gpt-oss": gpt_oss_config(), "someone/tiny-llama": llama_config()})
    monkeypatch.setattr(model_support, "hub_config", hub.config)

    def no_download(*args, **kwargs):
        raise AssertionError(f"a download started: {args} {kwargs}")

    monkeypatch.setattr("huggingface_hub.snapshot_download", no_download)
    monkeypatch.setattr("huggingface_hub.hf_hub_download", no_download)
    return hub


def assert_names_the_registry(text: str, architecture: str) -> None:
    assert architecture in text and "not supported" in text
    assert all(name in text for name in supported_architectures()), text


def test_launch_refuses_an_unsupported_hub_model_from_its_config_json_alone_mock_hub(hub):
    holder = EngineHolder()
    form = {**launch_tab.form_defaults(), "model": "someone/tiny-gpt-oss"}
    message, status = launch_tab.launch_engine(holder, form)
    assert "msg-error" in message and "Launch failed" not in message  # refused before the load began
    assert_names_the_registry(html.unescape(message), "GptOssForCausalLM")
    assert hub.asked == ["someone/tiny-gpt-oss"]  # one config.json, nothing else (downloads would raise)
    assert holder.get() is None and holder.status().state == "stopped" and "data-state" in status


def test_the_loader_reads_config_json_before_a_hub_download_mock_hub(hub):
    with pytest.raises(UnsupportedArchitecture) as info:
        resolve_model("someone/tiny-gpt-oss")
    assert_names_the_registry(str(info.value), "GptOssForCausalLM")
    assert "someone/tiny-gpt-oss's config.json on the Hub" in str(info.value)
    assert check_architecture("someone/tiny-llama") == "LlamaForCausalLM"
    with pytest.raises(OSError, match="a download started"):  # a supported model goes on to download
        resolve_model("someone/tiny-llama")
    assert hub.asked == ["someone/tiny-gpt-oss", "someone/tiny-llama", "someone/tiny-llama"]


def test_a_draft_model_of_an_unsupported_architecture_is_refused_too_mock_hub(hub, tmp_path):
    form = {
        **launch_tab.form_defaults(),
        "model": GGUF,
        "speculative_config": json.dumps(
            {"method": "draft_model", "model": "someone/tiny-gpt-oss", "num_speculative_tokens": 2}
        ),
    }
    message, _ = launch_tab.launch_engine(EngineHolder(), form)
    assert_names_the_registry(html.unescape(message), "GptOssForCausalLM")


def test_a_hub_id_that_cannot_be_read_is_left_to_the_load_mock_hub(hub):
    model_support.refuse_unsupported("someone/offline")  # no config: the load says why (Hub unreachable)
    assert hub.asked == ["someone/offline"]


def test_a_local_folder_is_read_from_its_config_json(tmp_path):
    from transformers import GptOssConfig

    config = GptOssConfig(num_hidden_layers=2, hidden_size=64, num_local_experts=4)
    config.architectures = ["GptOssForCausalLM"]  # what model.save_pretrained writes
    config.save_pretrained(tmp_path)
    with pytest.raises(UnsupportedArchitecture) as info:
        check_architecture(str(tmp_path))
    assert_names_the_registry(str(info.value), "GptOssForCausalLM")
    assert f"{tmp_path}/config.json" in str(info.value)
    message, _ = launch_tab.launch_engine(
        EngineHolder(), {**launch_tab.form_defaults(), "model": str(tmp_path)}
    )
    assert_names_the_registry(html.unescape(message), "GptOssForCausalLM")


def write_gguf(path, architecture: str, experts: int = 0) -> str:
    """A GGUF file with its architecture's keys (gguf's own writer) and one tensor."""
    writer = GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    if experts:
        writer.add_expert_count(experts)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


@pytest.mark.parametrize(
    ("architecture", "experts", "named"),
    [("gpt-oss", 4, "GptOssForCausalLM"), ("llama", 8, "MixtralForCausalLM"), ("bert", 0, "bert")],
)
def test_a_gguf_file_is_read_from_its_metadata(tmp_path, architecture, experts, named):
    path = write_gguf(tmp_path / "model.gguf", architecture, experts)
    with pytest.raises(UnsupportedArchitecture) as info:
        check_architecture(path)
    assert_names_the_registry(str(info.value), named)
    assert f"general.architecture {architecture}" in str(info.value)


def test_the_packaged_gguf_and_a_missing_path():
    assert check_architecture(GGUF) == "LlamaForCausalLM"
    with pytest.raises(FileNotFoundError, match="no such GGUF file"):
        check_architecture("/no/such/model.gguf")


@pytest.fixture(scope="module")
def machine():
    return detect_local_hardware()


def test_launch_this_plan_here_names_the_architecture_and_offers_one_that_runs(machine):
    plan = PlanRequest(model="deepseek-ai/DeepSeek-V3", quant="bf16")  # a bundled preset: no Hub read
    decision = decide(plan, machine, hub_online=True, default_gguf=GGUF)
    assert not decision.can_launch
    (reason,) = [r for r in decision.reasons if "not supported" in r]
    assert_names_the_registry(reason, "DeepseekV3ForCausalLM")
    assert decision.alternative is not None and check_architecture(decision.alternative.model)
    verdict, _, form, _ = launch_here.check_plan(plan.to_dict())
    assert "DeepseekV3ForCausalLM" in html.unescape(verdict) and form is None


def test_the_nearest_preset_offered_is_one_the_engine_runs_stand_in_hardware(machine):
    """On a host with memory for every preset, only the architecture stops Gemma 2; the nearest preset of
    its family (Gemma again) would run nowhere here, so one the engine runs is offered."""
    host = replace(machine, gpus=[], ram_available_bytes=4096 * GIB)
    plan = PlanRequest(model="google/gemma-2-27b-it", quant="bf16", gpu="CPU")
    decision = decide(plan, host, hub_online=True, default_gguf=GGUF)
    (reason,) = decision.reasons
    assert_names_the_registry(reason, "Gemma2ForCausalLM")
    assert check_architecture(decision.alternative.model) in supported_architectures()
    assert "largest preset" in decision.alternative_why
