"""Exported launch commands carry each engine's tool-calling parser for the model's family and pick
llguidance as the grammar backend; our own `serve` parser accepts the flags the embedded export writes."""

from __future__ import annotations

import argparse
import json

import pytest

from backend.export import ExportOptions, export_files
from backend.export.tool_calling import FAMILIES, PARSER_NAMES, tool_call_parser, tool_calling_flags
from backend.planner.request import PlanRequest
from backend.server.cli import add_arguments
from backend.server.tool_parsers import TOOL_PARSERS
from tests.export_utils import flag_value, make_stubs, run_with_stubs, write_files

CASES = [
    ("Qwen/Qwen2.5-7B-Instruct", "hermes", "qwen25"),
    ("Qwen/Qwen3-8B", "hermes", "qwen25"),
    ("meta-llama/Llama-3.1-8B-Instruct", "llama3_json", "llama3"),
    ("openai/gpt-oss-20b", "openai", "gpt-oss"),
    ("mistralai/Mistral-7B-Instruct-v0.3", None, None),
]


def launched(model: str, engine: str, tmp_path) -> list[str]:
    req = PlanRequest(model=model, gpu="H100-80GB", num_gpus=1, max_model_len=4096)
    files = export_files(req, ExportOptions(), engines=[engine], formats=["shell"])
    out = write_files(files, tmp_path / "files")
    proc, calls = run_with_stubs(out / engine / "launch.sh", make_stubs(tmp_path / "stubs"), tmp_path / "log")
    assert proc.returncode == 0, proc.stderr
    return calls[0]


@pytest.mark.parametrize(("model", "vllm_parser", "sglang_parser"), CASES)
def test_vllm_and_sglang_get_the_family_parser_and_llguidance(model, vllm_parser, sglang_parser, tmp_path):
    assert tool_call_parser(model) == vllm_parser
    vllm = launched(model, "vllm", tmp_path / "vllm")
    assert json.loads(flag_value(vllm, "--structured-outputs-config")) == {"backend": "guidance"}
    sglang = launched(model, "sglang", tmp_path / "sglang")
    assert flag_value(sglang, "--grammar-backend") == "llguidance"
    if vllm_parser is None:  # unknown family: no auto tool choice, which would need a parser
        assert "--enable-auto-tool-choice" not in vllm and "--tool-call-parser" not in sglang
        return
    assert "--enable-auto-tool-choice" in vllm and flag_value(vllm, "--tool-call-parser") == vllm_parser
    assert flag_value(sglang, "--tool-call-parser") == sglang_parser


def test_tgi_needs_no_flag_and_keeps_grammar_support(tmp_path):
    tgi = launched("Qwen/Qwen2.5-7B-Instruct", "tgi", tmp_path)
    assert "--disable-grammar-support" not in tgi and "--tool-call-parser" not in tgi


def test_every_family_parser_is_one_our_server_has():
    assert {parser for _, parser in FAMILIES} <= set(TOOL_PARSERS) == set(PARSER_NAMES["embedded"])


def test_our_serve_accepts_the_embedded_flags():
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    args = parser.parse_args(tool_calling_flags("embedded", "Qwen/Qwen2.5-0.5B-Instruct"))
    assert args.enable_auto_tool_choice and args.tool_call_parser == "hermes"
    assert tool_calling_flags("embedded", "HuggingFaceTB/SmolLM2-135M-Instruct") == []
