"""A container's CPU quota (backend/engine/cpu_quota.py), read from real cgroup files laid out as the kernel
publishes them (v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us) in a temporary mount: the smallest
limit on the process's path counts, "max" and -1 mean none; a CPU engine computes on the quota's whole
CPUs unless OMP_NUM_THREADS chose, and the planner's local host counts the same threads."""

from __future__ import annotations

import pytest
import torch

from backend.engine import LLM, cpu_quota
from backend.planner import cpu_host
from tests.engine_utils import tiny_model


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def proc_file(tmp_path, text):
    write(tmp_path / "self_cgroup", text)
    return tmp_path / "self_cgroup"


def test_cgroup_v2_limit_at_the_namespace_root(tmp_path):
    write(tmp_path / "fs" / "cpu.max", "150000 100000")
    assert cpu_quota.quota_cpus(tmp_path / "fs", proc_file(tmp_path, "0::/")) == 1.5


def test_cgroup_v2_smallest_limit_on_the_path_counts(tmp_path):
    root = tmp_path / "fs"
    write(root / "kubepods" / "pod1" / "cpu.max", "max 100000")  # the process's own: none
    write(root / "kubepods" / "cpu.max", "300000 100000")
    write(root / "cpu.max", "400000 100000")
    assert cpu_quota.quota_cpus(root, proc_file(tmp_path, "0::/kubepods/pod1")) == 3.0
    write(root / "kubepods" / "pod1" / "cpu.max", "50000 100000")
    assert cpu_quota.quota_cpus(root, proc_file(tmp_path, "0::/kubepods/pod1")) == 0.5


def test_cgroup_v1_quota_and_its_none(tmp_path):
    root = tmp_path / "fs"
    proc = proc_file(tmp_path, "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/")
    write(root / "cpu" / "docker" / "abc" / "cpu.cfs_quota_us", "-1")
    write(root / "cpu" / "docker" / "abc" / "cpu.cfs_period_us", "100000")
    assert cpu_quota.quota_cpus(root, proc) is None  # -1: no quota, and no cpu.max anywhere
    write(root / "cpu" / "cpu.cfs_quota_us", "200000")
    write(root / "cpu" / "cpu.cfs_period_us", "100000")
    assert cpu_quota.quota_cpus(root, proc) == 2.0


def test_nothing_readable_is_no_quota(tmp_path):
    assert cpu_quota.quota_cpus(tmp_path / "absent", tmp_path / "no_proc_file") is None
    write(tmp_path / "fs" / "cpu.max", "garbage")
    assert cpu_quota.quota_cpus(tmp_path / "fs", proc_file(tmp_path, "0::/")) is None


@pytest.mark.parametrize(
    ("threads", "quota", "fitted"), [(8, None, 8), (8, 2.0, 2), (8, 1.5, 1), (8, 0.5, 1), (2, 4.0, 2)]
)
def test_threads_within_quota(threads, quota, fitted):
    assert cpu_quota.threads_within_quota(threads, quota) == fitted


@pytest.fixture
def one_cpu_quota(tmp_path, monkeypatch):
    """This process seen under a 1-CPU cgroup v2 quota; torch's threads restored after."""
    write(tmp_path / "fs" / "cpu.max", "100000 100000")
    monkeypatch.setattr(cpu_quota, "CGROUP_ROOT", tmp_path / "fs")
    monkeypatch.setattr(cpu_quota, "PROC_CGROUP", proc_file(tmp_path, "0::/"))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(previous)


@pytest.mark.usefixtures("one_cpu_quota")
def test_a_cpu_engine_computes_on_the_quotas_cpus(monkeypatch):
    folder, _ = tiny_model("llama")
    llm = LLM(folder, device="cpu", dtype="float32", max_model_len=64)
    assert torch.get_num_threads() == 1
    assert llm.stats().compute_threads == 1
    assert cpu_host._engine_threads() == 1  # the planner's local host: the same count
    torch.set_num_threads(2)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # chosen by the user: kept
    LLM(folder, device="cpu", dtype="float32", max_model_len=64)
    assert torch.get_num_threads() == 2
