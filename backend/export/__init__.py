"""Export a plan as ready-to-run launch configs: one module per engine and per deployment format.

files = export_files(PlanRequest(model=...), ExportOptions(port=8000), engines=["vllm"], formats=["shell"])
data = zip_files(files)
"""

from backend.export.base import ExportOptions
from backend.export.files import (
    ENGINES,
    FORMATS,
    ExportResult,
    build_export,
    export_files,
    main_command,
    zip_files,
)
from backend.export.plan import ExportPlan, resolve

__all__ = [
    "ENGINES",
    "FORMATS",
    "ExportOptions",
    "ExportPlan",
    "ExportResult",
    "build_export",
    "export_files",
    "main_command",
    "resolve",
    "zip_files",
]
