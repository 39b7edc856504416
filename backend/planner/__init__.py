"""The planner: model specs, GPU / quantization catalogs, and the memory / speed / cost estimate."""

from backend.planner.advise import Fix, compare_gpus, estimate, suggest_fixes
from backend.planner.catalog import (
    get_gpu,
    get_kv_cache_dtype,
    get_quantization,
    list_gpus,
    list_kv_cache_dtypes,
    list_presets,
    list_quantizations,
)
from backend.planner.estimate import Estimate
from backend.planner.hardware import detect_local_hardware
from backend.planner.recommend import Recommendation, Targets, recommend, recommendation
from backend.planner.request import PlanRequest, validate_request
from backend.planner.sources import load_model_spec
from backend.planner.specs import ModelSpec, count_params

__all__ = [
    "Estimate",
    "Fix",
    "ModelSpec",
    "PlanRequest",
    "Recommendation",
    "Targets",
    "compare_gpus",
    "count_params",
    "detect_local_hardware",
    "estimate",
    "get_gpu",
    "get_kv_cache_dtype",
    "get_quantization",
    "list_gpus",
    "list_kv_cache_dtypes",
    "list_presets",
    "list_quantizations",
    "load_model_spec",
    "recommend",
    "recommendation",
    "suggest_fixes",
    "validate_request",
]
