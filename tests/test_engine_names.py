"""One list of engine names (backend/engines.py): the exporters, the launchers and the planner's choices
are all drawn from it, so an engine added there is known everywhere and a typo anywhere fails here."""

from __future__ import annotations

from backend.engines import CPU_ENGINES, ENGINE_TRAITS, ENGINES
from backend.export import ENGINES as EXPORT_ENGINES
from backend.export.files import EXPORTERS
from backend.export.supervisor import LAUNCHABLE, availability
from backend.planner import PlanRequest, estimate


def test_every_engine_has_an_exporter_and_every_launcher_is_an_engine():
    assert EXPORT_ENGINES == ENGINES
    assert set(EXPORTERS) == set(ENGINES)
    assert set(LAUNCHABLE) <= set(ENGINES)
    assert "embedded" in LAUNCHABLE and "embedded" not in availability()  # the app's own, not external


def test_the_planner_refuses_a_name_outside_the_table():
    request = PlanRequest(model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100-80GB", engine="vlm")
    try:
        estimate(request)
    except ValueError as exc:
        assert all(name in str(exc) for name in ENGINES)
    else:
        raise AssertionError("an unknown engine name was planned")


def test_cpu_hosts_warn_for_exactly_the_engines_that_need_a_gpu():
    for name, traits in ENGINE_TRAITS.items():
        est = estimate(PlanRequest(model="HuggingFaceTB/SmolLM2-135M-Instruct", gpu="CPU", engine=name))
        needs_gpu = any("needs a GPU" in w for w in est.warnings)
        assert needs_gpu == (name not in CPU_ENGINES) == (not traits.runs_on_cpu), name
