"""What this machine has: NVIDIA GPUs through NVML (nvidia-ml-py), CPU and RAM through psutil.

No GPU (or no driver) is an answer, not an error.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from backend.cpu_features import cpu_features


@dataclass(slots=True)
class LocalGPU:
    index: int
    name: str
    memory_total_bytes: int
    memory_free_bytes: int
    catalog_name: str | None  # the matching presets/gpus.yaml entry, when there is one


@dataclass(slots=True)
class LocalHardware:
    cpu_model: str
    cpu_cores_logical: int
    cpu_cores_physical: int | None
    ram_total_bytes: int
    ram_available_bytes: int
    gpus: list[LocalGPU] = field(default_factory=list)
    gpu_note: str = ""  # why no GPU is listed, when none is

    def to_dict(self) -> dict:
        return asdict(self)


# NVML names -> catalog names (first match wins; order from most to least specific).
_CATALOG_MATCH = (
    ("H100 PCIe", "H100-PCIe"),
    ("H100", "H100-80GB"),
    ("H200", "H200"),
    ("B200", "B200"),
    ("A100-SXM4-40GB", "A100-40GB"),
    ("A100-PCIE-40GB", "A100-40GB"),
    ("A100", "A100-80GB"),
    ("L40S", "L40S"),
    ("L4", "L4"),
    ("A10G", "A10G"),
    ("T4", "T4"),
    ("V100", "V100-32GB"),
    ("RTX 4090", "RTX-4090"),
    ("RTX 4080", "RTX-4080"),
    ("RTX 3090", "RTX-3090"),
    ("RTX PRO 6000", "RTX-PRO-6000"),
    ("RTX 6000 Ada", "RTX-6000-Ada"),
)


def catalog_name_for(nvml_name: str) -> str | None:
    for needle, name in _CATALOG_MATCH:
        if needle.lower() in nvml_name.lower():
            return name
    return None


def _nvidia_gpus() -> tuple[list[LocalGPU], str]:
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return [], f"no NVIDIA driver or GPU ({exc})"
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            info = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(LocalGPU(i, name, int(info.total), int(info.free), catalog_name_for(name)))
        return gpus, "" if gpus else "NVML found no GPU"
    finally:
        pynvml.nvmlShutdown()


def detect_local_hardware() -> LocalHardware:
    import psutil

    memory = psutil.virtual_memory()
    gpus, note = _nvidia_gpus()
    return LocalHardware(
        cpu_model=cpu_features().model_name,
        cpu_cores_logical=os.cpu_count() or 1,
        cpu_cores_physical=psutil.cpu_count(logical=False),
        ram_total_bytes=int(memory.total),
        ram_available_bytes=int(memory.available),
        gpus=gpus,
        gpu_note=note,
    )
