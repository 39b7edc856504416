"""Record the JSON schemas SkyPilot validates a task YAML with, so the tests check exports without SkyPilot.

    python -m venv /tmp/sky && /tmp/sky/bin/pip install skypilot==0.14.1
    /tmp/sky/bin/python tools/skypilot_schema.py > tests/data/skypilot/schemas-0.14.1.json

`sky.Task.from_yaml` validates the task with `schemas.get_task_schema()` and its `resources` block with
`schemas.get_resources_schema()` (Draft 7 plus SkyPilot's `case_insensitive_enum` keyword);
tests/export/test_export_validity.py applies both to every exported skypilot.yaml. When the SkyPilot
version the export targets changes, record the file again.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version

from sky.utils import schemas  # type: ignore[import-not-found]

if __name__ == "__main__":
    json.dump(
        {
            "source": f"skypilot {version('skypilot')} (PyPI wheel), sky/utils/schemas.py",
            "task": schemas.get_task_schema(),
            "resources": schemas.get_resources_schema(),
        },
        sys.stdout,
        indent=1,
        sort_keys=True,
    )
    sys.stdout.write("\n")
