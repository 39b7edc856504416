"""The validation's records: a published vLLM run, the planner's result on it, and a split's summary, with the
tolerances they are judged by (validation.py computes them, validation_report.py prints them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from backend.planner.request import PlanRequest

LOGS_PATH = Path(__file__).resolve().parents[2] / "tests" / "data" / "vllm_logs.yaml"
KV_TOLERANCE, KV_TOLERANCE_ALL, WEIGHTS_TOLERANCE = 0.05, 0.10, 0.02
SMALL_POOL_GIB, SMALL_POOL_ALLOWANCE_GIB = 20.0, 1.0
KV_SHARE_TARGET = 0.90
SPLITS = ("fit", "held_out")
LONG_CONTEXT, SMALL_GPU_GIB = 65536, 48.0
# The "very large vocabularies with many sequences": the profile's sampler holds max_num_seqs x
# vocabulary logits; 50M is gpt-oss's 201k at 256 sequences, Qwen's 152k at 1024 (not at 256)
LARGE_VOCAB, MANY_LOGITS = 150_000, 50_000_000


@dataclass(slots=True, frozen=True)
class LoggedRun:
    """One published vLLM startup, as tests/data/vllm_logs.yaml records it."""

    id: str
    source: str
    vllm_version: str
    gpu: str
    model: str
    settings: dict
    logged: dict
    excluded: str | None = None
    split: str = "fit"
    round: int | None = None  # the issue whose round added it (None: before the splits existed)

    def request(self) -> PlanRequest:
        return PlanRequest(
            model=self.model, gpu=self.gpu, engine="vllm", vllm_version=self.vllm_version, **self.settings
        )


@dataclass(slots=True)
class RunResult:
    run: LoggedRun
    kv_gib: float
    kv_tokens: int
    weights_gib: float
    starts: bool
    activation_gib: float
    non_torch_gib: float
    family: str
    categories: tuple[str, ...] = ()
    kv_error: float | None = None  # relative, signed; None where the log has no positive KV figure
    kv_error_gib: float | None = None
    weights_error: float | None = None
    notes: list[str] = field(default_factory=list)

    def kv_within(self, tolerance: float, allowance: bool = True) -> bool | None:
        """|KV error| within tolerance; with allowance, a pool under 20 GiB may also miss by up to 1 GiB."""
        if self.kv_error is None or self.kv_error_gib is None:
            return None
        small = self.run.logged["kv_cache_gib"] < SMALL_POOL_GIB
        if allowance and small and abs(self.kv_error_gib) <= SMALL_POOL_ALLOWANCE_GIB:
            return True
        return abs(self.kv_error) <= tolerance

    @property
    def verdict_right(self) -> bool:
        return self.starts == self.run.logged["starts"]


@dataclass(slots=True, frozen=True)
class Summary:
    split: str
    counted: int  # runs not excluded
    kv_compared: int
    kv_within_5: int  # plain relative error
    kv_within_10: int
    kv_within_5_allowed: int  # or within 1 GiB for pools under 20 GiB
    kv_within_10_allowed: int
    verdicts: int
    verdicts_right: int
    weights_compared: int
    weights_within_2: int
    median_kv_error: float
    category_median_errors: dict[str, float]
    category_within_10: dict[str, tuple[int, int]]  # (runs within 10%, runs compared) per category

    @property
    def worst_category(self) -> tuple[str, float] | None:
        if not self.category_median_errors:
            return None
        name = max(self.category_median_errors, key=lambda k: self.category_median_errors[k])
        return name, self.category_median_errors[name]

    @property
    def meets_targets(self) -> bool:
        verdicts_ok = self.verdicts_right == self.verdicts
        worst = self.worst_category
        categories_ok = worst is None or worst[1] <= KV_TOLERANCE_ALL
        if self.split == "held_out":
            return verdicts_ok and categories_ok and self.kv_within_10 >= KV_SHARE_TARGET * self.kv_compared
        kv_ok = (
            self.kv_within_5_allowed >= KV_SHARE_TARGET * self.kv_compared
            and self.kv_within_10_allowed == self.kv_compared
        )
        weights_ok = self.weights_within_2 == self.weights_compared
        return kv_ok and verdicts_ok and weights_ok and categories_ok
