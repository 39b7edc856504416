"""backend/ is a layer below ui/ and app.py: its import graph (read from the source, lazy imports included)
has no cycles, and no backend module imports ui, app or gradio. ui/ has no cycles either, among its own
modules or through backend. Outside backend/bench, backend/ imports nothing of it (monitoring is
backend/monitor) and ui/ only the user-facing benchmark modules; nothing in the product imports the
developer tools under benchmarks/."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

from tests.common_utils import ROOT

FORBIDDEN = ("ui", "app", "gradio")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path, package: str) -> set[str]:
    """Every module that path imports, at the top or inside a function; `from a import b` counts as
    importing the submodule a.b when there is one."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], base]).strip(".")
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def backend_graph(*packages: str) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module -> the modules of these packages it imports, module -> the ui/app/gradio modules it imports),
    over backend/ and any other top-level packages named (e.g. "ui")."""
    files = {module_name(p): p for package in ("backend", *packages) for p in (ROOT / package).rglob("*.py")}
    graph, external = {}, {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imported = imported_names(path, package)
        # `from backend.engine import cpu_kernels` reaches the submodule, not only the package
        graph[name] = {t for t in imported if t in files and t != name}
        external[name] = {t for t in imported if t.split(".")[0] in FORBIDDEN}
    return graph, external


def test_graph_sees_the_backend():
    graph, _ = backend_graph()
    assert len(graph) > 50
    assert "backend.engine.config" in graph["backend.engine.llm"]
    assert "backend.engine.config" in graph["backend.server.cli"]


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, or None. A module importing its own package (a parent's __init__, which
    re-exports it) is not counted: Python resolves that to the submodule already loading."""
    graph = {name: {t for t in targets if not name.startswith(t + ".")} for name, targets in graph.items()}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return exc.args[1]
    return None


def test_a_cycle_is_found_and_a_package_import_is_not_one():
    assert find_cycle({"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}}) == ["p.a", "p.c", "p.b", "p.a"]
    assert find_cycle({"p": {"p.a"}, "p.a": {"p"}}) is None


def test_backend_has_no_import_cycles():
    graph, _ = backend_graph()
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle under backend/: {' -> '.join(cycle or [])}"


def test_ui_has_no_import_cycles():
    graph, _ = backend_graph("ui")
    assert "ui.engine_access" in graph["ui.structured_panel"]  # ui modules are in the graph ...
    assert "ui.launch_tab" in graph["ui.engine_access"]
    assert "backend.engine.config" in graph["ui.launch_tab"]  # ... with their backend imports
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle under ui/: {' -> '.join(cycle or [])}"


def test_backend_imports_no_ui_app_or_gradio():
    _, external = backend_graph()
    upward = {name: sorted(targets) for name, targets in external.items() if targets}
    assert not upward, f"backend modules importing ui/, app.py or gradio: {upward}"


# What users run (the serving benchmark, Compare and their figures) and the UI's Bench and Compare tabs
# show; the rest of backend/bench (offline benchmark, llama.cpp runs) is reached by its own commands.
USER_FACING_BENCH = {
    "backend.bench.compare",
    "backend.bench.compare_quality",
    "backend.bench.compare_report",
    "backend.bench.compare_targets",
    "backend.bench.datasets",
    "backend.bench.plots",
    "backend.bench.serve",
}


def bench_imports(prefix: str) -> dict[str, set[str]]:
    """module -> the backend.bench modules it imports, for every module whose name starts with prefix."""
    graph, _ = backend_graph("ui")
    return {
        name: {t for t in targets if t.startswith("backend.bench.")}
        for name, targets in graph.items()
        if name.startswith(prefix)
    }


def test_backend_outside_bench_does_not_import_bench():
    """Monitoring lives in backend/monitor so that the server and export reach it without bench."""
    imports = {
        name: targets
        for name, targets in bench_imports("backend.").items()
        if not name.startswith("backend.bench")
    }
    assert "backend.monitor.samples" in backend_graph()[0]["backend.export.process"]  # the graph sees it
    assert not {name: sorted(t) for name, t in imports.items() if t}


def test_ui_imports_only_user_facing_bench_modules():
    imports = bench_imports("ui.")
    assert imports["ui.bench_tab"] >= {"backend.bench.serve"}  # the check sees the tabs' imports
    assert not {name: sorted(t - USER_FACING_BENCH) for name, t in imports.items() if t - USER_FACING_BENCH}


def test_backend_and_ui_never_import_benchmarks():
    """benchmarks/ holds developer tools: they import backend/, nothing in the product imports them."""
    files = [*(ROOT / "backend").rglob("*.py"), *(ROOT / "ui").rglob("*.py"), ROOT / "app.py"]
    assert len(files) > 100
    bad = {
        path.relative_to(ROOT).as_posix(): sorted(
            name
            for name in imported_names(path, module_name(path).rpartition(".")[0])
            if name.split(".")[0] == "benchmarks"
        )
        for path in files
    }
    assert not {name: targets for name, targets in bad.items() if targets}


def test_tests_import_helpers_only_from_utils_modules():
    """Helpers live in tests/*_utils.py and fixtures in conftest.py; a test module imports neither
    conftest nor another test module (pytest would collect and run the imported tests twice)."""
    paths = [p for p in (ROOT / "tests").rglob("*.py") if "data" not in p.relative_to(ROOT / "tests").parts]
    assert any(p.parent.name == "engine" for p in paths)  # the area folders are read too
    bad = {
        path.relative_to(ROOT).as_posix(): sorted(
            name
            for name in imported_names(path, module_name(path).rpartition(".")[0])
            if name.split(".")[-1].startswith(("test_", "conftest"))
        )
        for path in paths
    }
    assert not {name: targets for name, targets in bad.items() if targets}
