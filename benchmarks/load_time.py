"""Time to "engine ready" for a model, phase by phase: what the Launch tab's progress bar shows.

    python -m benchmarks.load_time                     # the default model, as the Launch tab loads it
    python -m benchmarks.load_time --model X.gguf --repeats 3 --cold

Each start runs in a fresh Python process (so importing torch counts, as it does for the app's first
launch) through EngineHolder.launch with the Launch tab's default settings. --cold empties the GGUF
conversion cache (backend/engine/gguf_cache.py) before every start; by default the first start fills it
and the rest use it. Prints the phases of every start and the median time to ready.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

CHILD = """
import json, sys
from backend.server.engine_holder import EngineHolder
from backend.engine.config import EngineConfig
holder = EngineHolder()
status = holder.launch(EngineConfig(model=sys.argv[1], kv_cache_memory_bytes=256 * 1024**2))
assert status.state == "ready", status.error
phases = getattr(status, "phases", ())  # none in trees older than load_phases.py (for before/after runs)
print(json.dumps({"ready_s": status.load_seconds, "phases": [[p.name, p.seconds] for p in phases]}))
holder.shutdown()
"""


def one_start(model: str, env: dict[str, str], root: str) -> dict:
    """One engine start in a fresh interpreter in the checkout at root: {"ready_s": seconds, "phases":
    [[name, seconds], ...]}."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, model], cwd=root, env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    from backend.default_model import default_model
    from backend.engine.gguf_cache import cache_dir

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default=None, help="a .gguf file, a folder or a Hub id (default: the app's)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--cold", action="store_true", help="empty the GGUF conversion cache before each start"
    )
    parser.add_argument("--tree", default=".", help="the checkout to start (another one: a before/after run)")
    args = parser.parse_args(argv)
    model = args.model or default_model(check_hub=False)
    root = os.path.abspath(args.tree)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": root}
    print(f"model: {model}\n")
    totals = []
    for repeat in range(args.repeats):
        if args.cold:
            shutil.rmtree(cache_dir(), ignore_errors=True)
        result = one_start(model, env, root)
        totals.append(result["ready_s"])
        print(f"start {repeat + 1}: engine ready in {result['ready_s']:.2f} s")
        for name, seconds in result["phases"]:
            print(f"  {name:<34} {seconds:6.2f} s")
    print(f"\nmedian time to engine ready over {len(totals)} starts: {statistics.median(totals):.2f} s")


if __name__ == "__main__":
    main()
