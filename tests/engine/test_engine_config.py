"""EngineConfig is the one definition of the engine's knobs: every field reaches the server CLI, `LLM(...)`
keyword arguments, the UI's Launch form and the embedded exporter, and each of them round-trips."""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from dataclasses import fields

import gradio as gr
import pytest

from backend.engine import LLM
from backend.engine.config import EngineConfig
from backend.export import ExportOptions, embedded, resolve
from backend.planner.request import PlanRequest
from backend.server.cli import add_arguments as server_arguments
from backend.server.engine_holder import EngineHolder
from tests.common_utils import ROOT
from ui import launch_tab
from ui.common import AppContext

NAMES = [f.name for f in fields(EngineConfig)]
EXPORTER = embedded.EmbeddedExporter()
# a value other than the default for every field
EVERYTHING_SET = EngineConfig(
    model="/models/m.gguf", dtype="float16", device="cuda:1", block_size=32, max_num_seqs=3,
    max_num_batched_tokens=128, max_model_len=1024, num_kv_blocks=77, kv_cache_memory_bytes=5 << 20,
    kv_cache_dtype="fp8_e5m2",
    enable_prefix_caching=False, seed=7, trust_remote_code=True, dequantize_weights=True, enforce_eager=True,
    speculative_config='{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4}',
)  # fmt: skip


def server_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    server_arguments(parser)
    return parser


def test_the_test_config_sets_every_field_away_from_its_default():
    defaults = EngineConfig(model="x")
    assert all(getattr(EVERYTHING_SET, name) != getattr(defaults, name) for name in NAMES)


def test_every_field_is_a_server_flag_and_round_trips():
    parser = server_parser()
    flags = set(parser._option_string_actions)
    assert {"--" + name.replace("_", "-") for name in NAMES} <= flags
    argv = EVERYTHING_SET.cli_args()
    assert EngineConfig.from_cli_args(parser.parse_args(argv)) == EVERYTHING_SET
    defaults = parser.parse_args([])
    assert EngineConfig.from_cli_args(parser.parse_args(["--model", "m"])) == EngineConfig(model="m")
    assert defaults.model is None  # the server fills in the packaged default model


def test_cli_refuses_what_the_config_refuses():
    args = server_parser().parse_args(["--model", "m", "--device", "mps"])
    with pytest.raises(ValueError, match="device must be one of auto, cpu, cuda"):
        EngineConfig.from_cli_args(args)
    with pytest.raises(argparse.ArgumentError, match="invalid choice: 'half'"):
        server_parser().parse_args(["--dtype", "half"])


def test_every_field_is_an_llm_keyword_and_unknown_ones_are_refused():
    kwargs = {name: getattr(EVERYTHING_SET, name) for name in NAMES[1:]}
    assert EngineConfig.from_kwargs(EVERYTHING_SET.model, **kwargs) == EVERYTHING_SET
    with pytest.raises(
        ValueError, match=r"unknown engine argument\(s\) gpu_memory_utilization; allowed: dtype,"
    ):
        LLM("/no/such/model", gpu_memory_utilization=0.9)  # refused before anything loads


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("block_size", 0, "block_size must be an integer >= 1, got 0"),
        ("max_model_len", True, "max_model_len must be None or an integer >= 1"),
        ("seed", -1, "seed must be an integer >= 0"),
        ("enable_prefix_caching", "yes", "enable_prefix_caching must be True or False"),
        ("dtype", "half", "dtype must be one of auto, bfloat16, float16, float32"),
    ],
)
def test_bad_values_say_what_is_allowed(field, value, words):
    with pytest.raises(ValueError, match=words):
        EngineConfig(model="m", **{field: value})


def test_every_field_is_on_the_launch_form_and_round_trips():
    holder = EngineHolder()
    with gr.Blocks() as demo:
        launch_tab.build(AppContext(holder, "/models/m.gguf", "http://127.0.0.1:1/v1"), demo, gr.State())
    labels = {getattr(block, "label", None) for block in demo.blocks.values()}
    assert {launch_tab.FORM_LABELS.get(name, name) for name in NAMES} <= labels
    form = {name: getattr(EVERYTHING_SET, name) for name in NAMES}
    form["kv_cache_memory_bytes"] = 5  # MiB in the form
    assert launch_tab.launch_config(form) == EVERYTHING_SET


def test_embedded_export_writes_every_field_it_sets_as_the_servers_flags():
    req = PlanRequest(model="/models/m.gguf", engine="embedded", quant="gguf", max_model_len=512,
                      max_num_seqs=4, max_num_batched_tokens=256, enable_prefix_caching=False)  # fmt: skip
    plan = resolve(req, ExportOptions(dtype="float32"))
    config = EXPORTER.engine_config(plan)
    assert (config.model, config.dtype, config.max_model_len, config.max_num_seqs) == (
        "/models/m.gguf", "float32", 512, 4,
    )  # fmt: skip
    argv = [str(token) for token in EXPORTER.command(plan, "127.0.0.1", 8000)]
    assert argv[:3] == ["python", "app.py", "serve"]
    assert EngineConfig.from_cli_args(server_parser().parse_args(argv[3:])) == config
    # every field that is set is written out, so launch.sh shows the whole configuration
    written = {a[2:].removeprefix("no-").replace("-", "_") for a in argv if a.startswith("--")}
    assert {name for name, _ in config.explicit_items()} <= written
    assert set(NAMES) <= {a[2:].removeprefix("no-").replace("-", "_") for a in EVERYTHING_SET.cli_args()}


def test_embedded_python_snippet_passes_the_same_config_to_llm():
    plan = resolve(PlanRequest(model="/models/m.gguf", engine="embedded", quant="gguf"), ExportOptions())
    tree = ast.parse(EXPORTER.python_snippet(plan))
    call = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "LLM"
    )
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    model = ast.literal_eval(call.args[0])
    assert EngineConfig.from_kwargs(model, **kwargs) == EXPORTER.engine_config(plan)


def test_reading_the_config_and_the_server_cli_does_not_import_torch():
    """`app.py --help` and the UI's forms read EngineConfig; torch loads only with the engine."""
    code = "import sys, backend.engine.config, backend.server.cli; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


@pytest.mark.parametrize(("method", "model"), [("ngram", None), ("draft_model", "/models/draft.gguf")])
def test_embedded_export_writes_vllms_speculative_config_and_the_server_reads_it(method, model):
    """The exporter's speculative settings for the embedded engine are vLLM's JSON, read back as is."""
    from backend.export.engine import speculative_config

    options = ExportOptions(speculative_method=method, speculative_model=model, num_speculative_tokens=5)
    plan = resolve(PlanRequest(model="/models/m.gguf", engine="embedded", quant="gguf"), options)
    argv = [str(token) for token in EXPORTER.command(plan, "127.0.0.1", 8000)]
    config = EngineConfig.from_cli_args(server_parser().parse_args(argv[3:]))
    assert json.loads(config.speculative_config) == speculative_config(plan)
    assert json.loads(config.speculative_config)["num_speculative_tokens"] == 5
