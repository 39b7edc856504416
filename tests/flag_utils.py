"""Check exported engine commands against the options each engine's own parser accepts.

tests/data/engine_flags/ENGINE-VERSION.json holds what tools/flagdata.py extracted from the engine's
released source; the version is the one the engine module targets (EngineInfo.version).
"""

from __future__ import annotations

import importlib.util
import json
import shlex
from dataclasses import dataclass, field

import yaml

from backend.export.files import EXPORTERS
from tests.common_utils import ROOT

FLAG_DATA = ROOT / "tests" / "data" / "engine_flags"
_spec = importlib.util.spec_from_file_location("flagdata", ROOT / "tools" / "flagdata.py")
flagdata = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(flagdata)  # tools/ is scripts, not a package: load the extractor by path
# where an engine's own arguments start in a command line
MARKERS = {
    "vllm": ("vllm", "serve"),
    "sglang": ("sglang.launch_server",),
    "trtllm": ("trtllm-serve",),
    "tgi": ("text-generation-launcher",),
    "llamacpp": ("llama-server",),
}
CHECKED_ENGINES = tuple(MARKERS)


def flag_data(engine: str) -> dict:
    version = EXPORTERS[engine].INFO.version
    return json.loads((FLAG_DATA / f"{engine}-{version}.json").read_text())


def after(tokens: list[str], marker: tuple[str, ...]) -> list[str] | None:
    for i in range(len(tokens) - len(marker) + 1):
        if tuple(tokens[i : i + len(marker)]) == marker:
            rest = tokens[i + len(marker) :]
            stop = next((j for j, t in enumerate(rest) if t in ("&", "&&", ";", "|", "||")), len(rest))
            return rest[:stop]
    return None


def shell_invocations(text: str, marker: tuple[str, ...]) -> list[list[str]]:
    """The engine's arguments in each line of a shell script that runs it."""
    found = []
    for line in text.replace("\\\n", " ").splitlines():
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:
            continue
        if (args := after(tokens, marker)) is not None:
            found.append(args)
    return found


def list_invocation(argv: list[str], engine: str) -> list[list[str]]:
    """A container's command/args list: after the marker, or all of it when the image's entrypoint runs it."""
    if len(argv) == 3 and argv[:2] == ["sh", "-c"]:
        return shell_invocations(argv[2].replace("$$(", "$("), MARKERS[engine])
    args = after(argv, MARKERS[engine])
    if args is not None:
        return [args]
    return [argv] if EXPORTERS[engine].INFO.entrypoint else []


def invocations(path: str, text: str, engine: str) -> list[list[str]]:
    """Every engine command line in one exported file, as argument lists."""
    info = EXPORTERS[engine].INFO
    name = path.rsplit("/", 1)[-1]
    if name == "docker.sh":  # what follows the image: the command, or its arguments after the ENTRYPOINT
        return [
            found
            for args in shell_invocations(text, (info.image,))
            for found in list_invocation(args, engine)
        ]
    if name.endswith(".sh"):
        return shell_invocations(text, MARKERS[engine])
    if name == "docker-compose.yml":
        return list_invocation(yaml.safe_load(text)["services"][engine]["command"], engine)
    if name == "k8s.yaml":
        found = []
        for doc in (d for d in yaml.safe_load_all(text) if d):
            for spec in pod_specs(doc):
                for c in spec["containers"]:
                    found += list_invocation(c.get("command", []) + c.get("args", []), engine)
        return found
    if name == "skypilot.yaml":
        return shell_invocations(yaml.safe_load(text)["run"], MARKERS[engine])
    if name == "endpoint.json":
        return list_invocation(json.loads(text)["model"]["args"], engine)
    return []


def pod_specs(doc: dict) -> list[dict]:
    spec = doc.get("spec", {})
    if doc.get("kind") == "Deployment":
        return [spec["template"]["spec"]]
    if doc.get("kind") == "LeaderWorkerSet":
        lws = spec["leaderWorkerTemplate"]
        return [lws["leaderTemplate"]["spec"], lws["workerTemplate"]["spec"]]
    return []


@dataclass
class FlagCheck:
    checked: int = 0
    files: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)

    def check(self, where: str, engine: str, args: list[str]) -> None:
        data = flag_data(engine)
        options, removed, choices = set(data["options"]), set(data["removed"]), data["choices"]
        for i, token in enumerate(args):
            if not token.startswith("-") or token == "-" or token.lstrip("-").replace(".", "").isdigit():
                continue
            name, _, inline = token.partition("=")
            self.checked += 1
            self.files.add(where)
            if name in removed or name not in options:
                why = "removed" if name in removed else "unknown"
                self.errors.append(f"{where}: {engine} {data['version']} rejects {name} ({why})")
            elif name in choices:
                value = inline or (args[i + 1] if i + 1 < len(args) else "")
                if value not in choices[name]:
                    self.errors.append(f"{where}: {engine} {name} {value!r} not in {choices[name]}")
