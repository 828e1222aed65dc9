"""The CPU this process may use on its machine, for ``budget.cpu: auto`` on local and static.

The cores of its cpuset (``sched_getaffinity``), capped by the tightest CPU quota of its cgroup
and every ancestor (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``),
minus ``budget.reserved``.  The reading functions take the filesystem root (tests).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gateway.platforms.cgroupfs import CgroupUnavailable, detect_layout
from scaler.policy import BudgetConfig, BudgetCpu


@dataclass(frozen=True, slots=True)
class MachineCpu:
    """What bounds this process's CPU: its cpuset and its cgroup's quota (None: no quota)."""

    cpuset_cores: int
    quota_cores: float | None
    quota_at: str = ""
    """The cgroup directory whose quota binds (``/sys/fs/cgroup/...``)."""

    @property
    def cores(self) -> float:
        if self.quota_cores is None:
            return float(self.cpuset_cores)
        return min(float(self.cpuset_cores), self.quota_cores)

    def describe(self) -> str:
        text = f"{self.cpuset_cores} cores in the cpuset"
        if self.quota_cores is not None:
            text += f", cgroup quota {self.quota_cores:g} at {self.quota_at}"
        return text


def _v2_quota(text: str) -> float | None:
    quota, _, period = text.strip().partition(" ")
    if quota == "max" or not period:
        return None
    return int(quota) / int(period)


def _v2_file(directory: Path) -> float | None:
    return _v2_quota((directory / "cpu.max").read_text())


def _v1_quota(directory: Path) -> float | None:
    quota = int((directory / "cpu.cfs_quota_us").read_text().strip())
    period = int((directory / "cpu.cfs_period_us").read_text().strip())
    return None if quota < 0 or period <= 0 else quota / period


def cgroup_quota(
    root: Path = Path("/"), proc_cgroup: str | None = None
) -> tuple[float, str] | None:
    """The tightest CPU quota over the process's cgroup and its ancestors (cores, directory);
    None when nothing caps it.  ``proc_cgroup`` is ``/proc/self/cgroup``'s text."""
    if proc_cgroup is None:
        try:
            proc_cgroup = (root / "proc/self/cgroup").read_text()
        except OSError:
            return None
    best: tuple[float, str] | None = None
    for line in proc_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            base, read = root / "sys/fs/cgroup", _v2_file
        elif "cpu" in controllers.split(","):
            base, read = root / "sys/fs/cgroup" / controllers, _v1_quota
        else:
            continue
        directory = base / path.strip().lstrip("/")
        while True:
            try:
                quota = read(directory)
            except (OSError, ValueError):
                quota = None
            if quota is not None and (best is None or quota < best[0]):
                best = (quota, str(directory))
            if directory == base or base not in directory.parents:
                break
            directory = directory.parent
    return best


def machine_cpu(root: Path = Path("/"), cpuset: Callable[[], int] | None = None) -> MachineCpu:
    """This process's CPU bounds, read now."""
    count = cpuset() if cpuset is not None else len(os.sched_getaffinity(0))
    quota = cgroup_quota(root)
    if quota is None:
        return MachineCpu(count, None)
    return MachineCpu(count, quota[0], quota[1])


def auto_budget(budget: BudgetConfig, machine: MachineCpu) -> BudgetCpu:
    """``budget.cpu: auto`` on this machine: its cores minus ``reserved`` (at least 0.01)."""
    cores = machine.cores - budget.reserved
    source = f"auto: {machine.describe()}"
    if budget.reserved:
        source += f", minus reserved {budget.reserved:g}"
    if cores < 0.01:
        source += f" (leaves {cores:g}: using 0.01)"
        cores = 0.01
    return BudgetCpu(cores, source)


def budget_cpu(budget: BudgetConfig) -> BudgetCpu:
    """The budget in force on this machine: ``budget.cpu``, or measured for ``auto``."""
    return budget.fixed() or auto_budget(budget, machine_cpu())


def cpuset_usable(mountinfo_path: Path = Path("/proc/self/mountinfo")) -> bool:
    """Whether this process can confine the replicas to CPUs with a cpuset cgroup (local
    share enforcement below every CPU): the hierarchies the local platform uses
    (:func:`gateway.platforms.cgroupfs.detect_layout`) have a writable ``cpuset`` one."""
    try:
        layout = detect_layout(mountinfo_path.read_text())
    except (OSError, CgroupUnavailable):
        return False
    return layout.cpuset_root is not None and os.access(layout.cpuset_root, os.W_OK)
