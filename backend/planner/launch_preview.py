"""What a launch will run, before it runs: the model and its weights' format, where it computes (device,
threads), the weights' memory as the planner reads the checkpoint and the KV pool the settings ask for.
The Launch tab shows it in one line above its button; nothing here loads the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from backend.model_names import display_name
from backend.planner.advise import estimate
from backend.planner.cpu_host import local_cpu_host
from backend.planner.launch_here import running_engine_request


@dataclass(slots=True, frozen=True)
class LaunchPreview:
    model: str  # display name with the weights' format ("SmolLM2-135M-Instruct · GGUF Q4_1")
    device: str  # "cpu" or "cuda"
    threads: int | None  # threads the engine computes on (a CPU); None on a GPU
    weights_bytes: int | None  # the planner's figure for the checkpoint as stored; None: cannot read it
    kv_cache_bytes: int | None  # the pool the settings fix; None: sized from free memory at load
    kv_cache_blocks: int | None  # num_kv_blocks when set (it wins over kv_cache_bytes)

    @property
    def kv_text(self) -> str:
        if self.kv_cache_blocks:
            return f"KV cache {self.kv_cache_blocks:,} blocks"
        if self.kv_cache_bytes:
            return f"KV cache {self.kv_cache_bytes / 2**20:,.0f} MiB"
        if self.device == "cpu":
            # the engine's rule; device.py imports torch, which the app loads in the background
            from backend.engine.device import CPU_KV_CACHE_CAP_BYTES, CPU_KV_CACHE_SHARE

            cap = CPU_KV_CACHE_CAP_BYTES / 2**30
            return f"KV cache {CPU_KV_CACHE_SHARE:.0%} of free memory (at most {cap:.0f} GiB)"
        return "KV cache from free GPU memory"


@cache
def _weights_bytes(model: str) -> int | None:
    """The planner's weights for the checkpoint as stored (GGUF types and quantized checkpoints as they
    are, dense ones in their stored dtype); None when it cannot read the model (offline Hub, typo)."""
    try:
        return estimate(running_engine_request(model, "auto", quantized=True)).weights_bytes
    except (ValueError, OSError):  # a model the planner cannot read
        return None


def launch_preview(
    model: str,
    device: str = "auto",
    kv_cache_memory_bytes: int | None = None,
    num_kv_blocks: int | None = None,
) -> LaunchPreview:
    """The preview of launching model on device with these KV settings (EngineConfig's names)."""
    import torch  # the engine's device rule; lazy: the app imports torch in the background at start

    on_gpu = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    return LaunchPreview(
        model=display_name(model),
        device="cuda" if on_gpu else "cpu",
        threads=None if on_gpu else local_cpu_host().cores,
        weights_bytes=_weights_bytes(model),
        kv_cache_bytes=kv_cache_memory_bytes,
        kv_cache_blocks=num_kv_blocks,
    )
