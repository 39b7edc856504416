"""One exception family for what a user got wrong: the loader, planner, export and engine config raise
UserError subclasses (ValueErrors), so every front end catches one thing and shows its message alone."""

from __future__ import annotations

import pytest

from backend.default_model import split_gguf_path
from backend.engine.config import EngineConfig
from backend.engine.loader import resolve_model
from backend.errors import ModelNotFound, Unsupported, UserError
from backend.export import ExportOptions, resolve
from backend.export.embedded import EmbeddedExporter
from backend.planner import PlanRequest, load_model_spec
from ui.common import describe


def test_a_missing_model_file_is_the_same_error_in_loader_and_planner(tmp_path):
    missing = str(tmp_path / "nothing.gguf")
    for load in (resolve_model, load_model_spec, split_gguf_path):
        with pytest.raises(ModelNotFound, match=r"nothing\.gguf") as info:
            load(missing)
        assert isinstance(info.value, UserError) and isinstance(info.value, FileNotFoundError)
        assert describe(info.value) == str(info.value)  # the UI shows the message alone


def test_config_and_export_refusals_are_user_errors():
    with pytest.raises(UserError, match="block_size"):
        EngineConfig(model="m", block_size=0)
    plan = resolve(PlanRequest(model="meta-llama/Llama-3.1-8B-Instruct", engine="embedded", tp=2, num_gpus=2),
                   ExportOptions())  # fmt: skip
    with pytest.raises(Unsupported, match="one device") as info:
        EmbeddedExporter().engine_config(plan)
    assert isinstance(info.value, UserError) and describe(info.value) == str(info.value)
