"""The docs stay true to the tree: every relative link in README.md and docs/*.md reaches a file (and a
heading, for a #anchor into a Markdown page), and every `python -m backend...` / `python -m benchmarks...`
/ `python app.py ...` command in a ```bash block answers `--help` (its module imports and its parser
exits 0 with a usage)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.common_utils import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
COMMAND = re.compile(r"\bpython (?:-m ((?:backend|benchmarks)(?:\.\w+)+)|app\.py(?: ([a-z][\w-]*))?)")
# runs each command's --help in one process (the imports are shared: one torch import, not one a module)
HELP_ALL = """
import contextlib, io, json, runpy, sys
results = {}
for target in json.loads(sys.argv[1]):
    kind, name, *sub = target.split(" ")
    sys.argv = [name, *sub, "--help"]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            if kind == "module":
                runpy.run_module(name, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(name, run_name="__main__")
        code = "returned without exiting"
    except SystemExit as exc:
        code = exc.code or 0
    except Exception as exc:  # an import error or a crash: the page's command does not run
        code = f"{type(exc).__name__}: {exc}"
    results[target] = [code, out.getvalue()[:400]]
print(json.dumps(results))
"""


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {github_slug(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def relative_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]  # http:, https:, mailto:


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        missing_anchor = anchor and file.suffix == ".md" and file.exists() and anchor not in anchors(file)
        if not file.exists() or missing_anchor:
            broken.append(target)
    return broken


def test_every_relative_link_resolves():
    assert len(PAGES) >= 5
    assert sum(len(relative_links(p)) for p in PAGES) >= 20  # the check sees the links
    broken = {p.relative_to(ROOT).as_posix(): broken_links(p) for p in PAGES}
    assert not {page: targets for page, targets in broken.items() if targets}


def test_a_broken_link_and_anchor_are_found(tmp_path):
    (tmp_path / "b.md").write_text("# Real heading, with (punctuation)\n")
    page = tmp_path / "a.md"
    page.write_text(
        "[ok](b.md#real-heading-with-punctuation) [x](missing.md) [y](b.md#nope) [w](https://x.y)\n"
    )
    assert broken_links(page) == ["missing.md", "b.md#nope"]


def documented_commands() -> set[str]:
    """'module backend.x' and 'script app.py [subcommand]' for each command in a bash block of the docs."""
    found = set()
    for page in PAGES:
        for language, body in FENCE.findall(page.read_text()):
            if language not in ("bash", "sh", "shell"):
                continue
            for module, subcommand in COMMAND.findall(body):
                found.add(f"module {module}" if module else f"script app.py {subcommand}".strip())
    return found


def test_documented_commands_answer_help():
    commands = sorted(documented_commands())
    assert "script app.py estimate" in commands
    assert any(c.startswith("module backend.bench") for c in commands)
    assert any(c.startswith("module benchmarks.") for c in commands)
    result = subprocess.run(
        [sys.executable, "-c", HELP_ALL, json.dumps(commands)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    results = json.loads(result.stdout.splitlines()[-1])
    failed = {c: out for c, (code, out) in results.items() if code != 0 or "usage" not in out.lower()}
    assert not failed, failed
