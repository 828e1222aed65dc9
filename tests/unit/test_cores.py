"""``workers: auto`` (the default): the cores this process may use, from its CPU affinity
capped by the cgroup CPU quota (v2 ``cpu.max``, v1 CFS quota) of its cgroup and parents."""

from __future__ import annotations

import math
import os
from pathlib import Path

from gateway.cores import quota_cores, usable_cores
from gateway.settings import Settings


def tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_cgroup_v2_quota_is_the_tightest_on_the_path(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    tree(
        root,
        {
            "cpu.max": "max 100000\n",
            "kubepods/cpu.max": "250000 100000\n",  # 2.5 cores for the pod
            "kubepods/pod1/cpu.max": "max 100000\n",
            "kubepods/pod1/ctr/cpu.max": "max 100000\n",
            "self": "0::/kubepods/pod1/ctr\n",
        },
    )
    assert quota_cores(root, root / "self") == 2.5


def test_cgroup_v1_cfs_quota(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    tree(
        root,
        {
            "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "150000\n",
            "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
            "cpu,cpuacct/docker/cpu.cfs_quota_us": "-1\n",
            "cpu,cpuacct/docker/cpu.cfs_period_us": "100000\n",
            "self": "5:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n",
        },
    )
    assert quota_cores(root, root / "self") == 1.5


def test_no_quota_or_no_cgroup_is_unlimited(tmp_path: Path) -> None:
    assert quota_cores(tmp_path, tmp_path / "missing") == math.inf
    tree(tmp_path, {"cpu.max": "max 100000\n", "self": "0::/\n"})
    assert quota_cores(tmp_path, tmp_path / "self") == math.inf


def test_the_default_is_one_worker_per_usable_core() -> None:
    settings = Settings()
    assert settings.workers == "auto"
    assert settings.worker_count == usable_cores()
    assert 1 <= usable_cores() <= len(os.sched_getaffinity(0))
    assert Settings(workers=1).worker_count == 1
