"""How many cores this process may use: the default number of data-plane workers
(``workers: auto``).  The CPUs it may run on (``sched_getaffinity``: taskset, cpusets), capped
by the CPU quota of its cgroup and every parent (cgroup v2 ``cpu.max``, v1
``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``: what a container's CPU limit sets), rounded up;
at least 1."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _quota_v2(directory: Path) -> float:
    quota, period = (directory / "cpu.max").read_text().split()[:2]
    return math.inf if quota == "max" else int(quota) / int(period)


def _quota_v1(directory: Path) -> float:
    quota = int((directory / "cpu.cfs_quota_us").read_text())
    period = int((directory / "cpu.cfs_period_us").read_text())
    return math.inf if quota <= 0 or period <= 0 else quota / period


def _tightest(root: Path, path: str, read: Callable[[Path], float]) -> float:
    """The smallest quota on ``path`` and its parents up to ``root``."""
    cores = math.inf
    here = root / path.lstrip("/")
    while True:
        with contextlib.suppress(OSError, ValueError):
            cores = min(cores, read(here))
        if here == root or root not in here.parents:
            return cores
        here = here.parent


def quota_cores(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path | None = None) -> float:
    """The tightest CPU quota on this process's cgroup path, in cores (inf: none)."""
    try:
        lines = (proc_cgroup or Path("/proc/self/cgroup")).read_text().splitlines()
    except OSError:
        return math.inf
    cores = math.inf
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            cores = min(cores, _tightest(cgroup_root, path, _quota_v2))
        elif "cpu" in controllers.split(","):
            for mount in (controllers, "cpu", "cpu,cpuacct"):
                root = cgroup_root / mount
                if root.is_dir():
                    cores = min(cores, _tightest(root, path, _quota_v1))
                    break
    return cores


def usable_cores() -> int:
    """CPUs in this process's affinity mask, capped by its cgroup CPU quota (rounded up)."""
    cpus = len(os.sched_getaffinity(0))
    quota = quota_cores()
    if quota != math.inf:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)
