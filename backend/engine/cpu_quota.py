"""The CPUs a cgroup's quota lets this process use: a container's CPU limit (Docker's --cpus, a Kubernetes
limit, a Hugging Face Space's vCPUs). Affinity shows the host's cores while the quota caps the time they
may run, and torch starts a thread for each core it sees: on 16 visible cores under a 2-CPU quota every
OpenMP barrier of a step waits for threads the kernel has throttled. So a CPU engine whose thread count
the user left to it computes on no more threads than the quota's whole CPUs (limit_torch_threads), and
the serving engine's thread fitting (compute_threads.py) and the planner's local host count those.

Read as the kernel publishes it: cgroup v2's cpu.max ("QUOTA PERIOD", or "max PERIOD": none) and v1's
cpu.cfs_quota_us / cpu.cfs_period_us (-1: none), in this process's cgroup (/proc/self/cgroup) and each
parent up to the mount, where a container sees its own limit; the smallest counts."""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")  # v2's mount; v1's cpu controller is under it as cpu/
PROC_CGROUP = Path("/proc/self/cgroup")


def quota_cpus(root: Path | None = None, proc_cgroup: Path | None = None) -> float | None:
    """CPUs' worth of time the quota allows (1.5: one and a half), None where none is set or readable
    (root, proc_cgroup: CGROUP_ROOT, PROC_CGROUP)."""
    root = root or CGROUP_ROOT
    v2, v1 = _cgroup_paths(proc_cgroup or PROC_CGROUP)
    limits = [_v2_limit(folder) for folder in _along(root, v2)]
    limits += [_v1_limit(folder) for folder in _along(root / "cpu", v1)]
    return min((limit for limit in limits if limit is not None), default=None)


def threads_within_quota(threads: int, quota: float | None) -> int:
    """threads, or the quota's whole CPUs where fewer (at least one)."""
    return threads if quota is None else max(1, min(threads, int(quota)))


def limit_torch_threads() -> None:
    """Cap torch's CPU threads at the quota's whole CPUs, unless OMP_NUM_THREADS chose them; says so."""
    import torch  # here: the planner reads quota_cpus without torch

    if os.environ.get("OMP_NUM_THREADS"):
        return
    quota, threads = quota_cpus(), torch.get_num_threads()
    fitted = threads_within_quota(threads, quota)
    if fitted < threads:
        log.info("CPU threads %d -> %d: this process's cgroup allows %.2f CPUs", threads, fitted, quota)
        torch.set_num_threads(fitted)


def _cgroup_paths(proc_cgroup: Path) -> tuple[str, str]:
    """This process's cgroup in the v2 hierarchy and in v1's cpu controller ("/" where not listed)."""
    v2 = v1 = "/"
    try:
        text = proc_cgroup.read_text()
    except OSError:
        return v2, v1
    for line in text.splitlines():
        number, controllers, path = [*line.split(":", 2), "", ""][:3]
        if number == "0" and not controllers:
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _along(base: Path, path: str) -> list[Path]:
    """base/path and each of its parents up to base itself (a container's namespace root)."""
    parts = [part for part in path.split("/") if part and part != ".."]
    return [base.joinpath(*parts[:end]) for end in range(len(parts), -1, -1)]


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _v2_limit(folder: Path) -> float | None:
    words = _read(folder / "cpu.max").split()
    if len(words) != 2 or words[0] == "max" or not all(w.isdigit() for w in words) or int(words[1]) == 0:
        return None
    return int(words[0]) / int(words[1])


def _v1_limit(folder: Path) -> float | None:
    quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
    if not quota.isdigit() or not period.isdigit() or int(period) == 0:  # -1: no quota
        return None
    return int(quota) / int(period)
