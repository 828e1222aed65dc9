"""CPU cgroups for local replicas: one cgroup per replica, limits, usage.

Which hierarchies to use (v2 or v1) is detected by :mod:`gateway.platforms.cgroupfs`.  One
cgroup per replica (:class:`ReplicaCgroup`; the same class handles a service's cgroup
and the parent); the Sluice-owned parent that holds them, and the sweep of parents left by
a dead Sluice, are in :mod:`gateway.platforms.local.cgroup_parent`.

* cgroup v2: ``cpu.max`` ("<quota_us> <period_us>" or "max <period_us>"), ``cpu.weight``
  (1..10000, default 100), ``cpu.stat`` (``usage_usec``, ``throttled_usec``); the ``cpu``
  controller is enabled with ``+cpu`` in ``cgroup.subtree_control`` of every ancestor.
* cgroup v1: ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1 = unlimited), ``cpu.shares``
  (2..262144, default 1024), ``cpu.stat`` ``throttled_time`` (ns) and ``cpuacct.usage`` (ns)
  from the ``cpuacct`` hierarchy (the same directory when both are mounted together).

Two ways to enforce CPU (``budget.enforcement``):

* limit (:meth:`ReplicaCgroup.set_cpu`): ``c`` cores is a quota of ``c × period`` per period
  (period 100 ms) and a weight proportional to ``c``: a hard cap, idle CPU stays idle;
* share (:meth:`ReplicaCgroup.set_share`): a weight proportional to ``c`` cores (a service's
  entitlement on its own cgroup, the default weight on each of its replicas) under a quota
  (the service's ``cpu.max`` on each replica, none on the service's cgroup).

All file access is synchronous and tiny (cgroupfs is in memory).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from gateway.platforms.cgroupfs import CgroupLayout, CgroupUnavailable, detect_layout

log = logging.getLogger(__name__)

PERIOD_US = 100_000
"""CFS period used for every replica (the kernel default)."""
MIN_QUOTA_US = 1_000
"""The kernel rejects quotas below 1 ms."""
DEFAULT_WEIGHT_CORES = 1.0
"""The weight a new cgroup gets from the kernel (v1 ``cpu.shares`` 1024, v2 ``cpu.weight``
100), in the cores :func:`weight_for` converts."""


@dataclass(frozen=True, slots=True)
class CpuLimit:
    """The CPU limit in force in one cgroup, as read back from its files."""

    quota_us: int | None
    """None = unlimited."""
    period_us: int
    weight: int
    """cpu.weight (v2) or cpu.shares (v1), as written."""

    @property
    def cores(self) -> float | None:
        """The hard cap (quota / period); None = unlimited."""
        return None if self.quota_us is None else self.quota_us / self.period_us


@dataclass(frozen=True, slots=True)
class CpuUsage:
    """Cumulative CPU use of one cgroup since it was created."""

    usage_s: float | None
    """CPU time consumed (None when no accounting controller is available)."""
    throttled_s: float
    """Time the cgroup's tasks were held back by the quota."""
    periods: int
    throttled_periods: int


def _read_int(path: Path) -> int:
    return int(path.read_text().split()[0])


def write_control(path: Path, value: str) -> None:
    """Write one value to a cgroup control file."""
    with open(path, "w", encoding="ascii") as f:
        f.write(value)


def _read_stat(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                out[key] = int(value)
    return out


_BYTE_UNITS = {
    "": 1,
    "k": 1000,
    "m": 1000**2,
    "g": 1000**3,
    "t": 1000**4,
    "ki": 1024,
    "mi": 1024**2,
    "gi": 1024**3,
    "ti": 1024**4,
}


def parse_bytes(value: str | int) -> int:
    """``256Mi`` -> 268435456: an integer with an optional unit (``K M G T`` powers of 1000,
    ``Ki Mi Gi Ti`` powers of 1024, case-insensitive, optional trailing ``B``)."""
    if isinstance(value, bool):
        raise ValueError(f"must be a byte count such as 256Mi, got {value!r}")
    if isinstance(value, int):
        n = value
    else:
        text = value.strip().lower().removesuffix("b").strip()
        digits = text.rstrip("kmgti")
        unit = text[len(digits) :]
        if unit not in _BYTE_UNITS or not digits.strip().isdigit():
            raise ValueError(f"must be a byte count such as 256Mi or 1G, got {value!r}")
        n = int(digits) * _BYTE_UNITS[unit]
    if n <= 0:
        raise ValueError(f"must be > 0 bytes, got {value!r}")
    return n


def quota_us_for(cores: float, period_us: int = PERIOD_US) -> int:
    """The CFS quota giving ``cores`` CPUs per period (at least the kernel's 1 ms minimum)."""
    if cores <= 0:
        raise ValueError(f"cores must be > 0, got {cores!r}")
    return max(MIN_QUOTA_US, round(cores * period_us))


def weight_for(cores: float, version: int) -> int:
    """cpu.weight (v2, default 100 = 1 core) or cpu.shares (v1, default 1024 = 1 core)."""
    if version == 2:
        return min(10_000, max(1, round(100 * cores)))
    return min(262_144, max(2, round(1024 * cores)))


def cores_for_weight(weight: int, version: int) -> float:
    """The guaranteed cores a weight stands for (the inverse of :func:`weight_for`)."""
    return weight / (100 if version == 2 else 1024)


class ReplicaCgroup:
    """One replica's cgroup (a directory per hierarchy it lives in)."""

    def __init__(
        self,
        layout: CgroupLayout,
        cpu_dir: Path,
        acct_dir: Path | None,
        mem_dir: Path | None = None,
        cpuset_dir: Path | None = None,
    ) -> None:
        self.layout = layout
        self.cpu_dir = cpu_dir
        self.acct_dir = acct_dir
        """v1 with a separate cpuacct hierarchy only."""
        self.mem_dir = mem_dir
        """Where the memory controller's files are (v2: ``cpu_dir``); None = no memory cgroup."""
        self.cpuset_dir = cpuset_dir
        """v1, when the parent pins its replicas to CPUs: the parent's cpuset cgroup, which
        every replica joins (shared: not this replica's to read, signal or remove)."""

    def __repr__(self) -> str:
        return f"ReplicaCgroup(v{self.layout.version}, {self.cpu_dir})"

    @property
    def dirs(self) -> tuple[Path, ...]:
        out = [self.cpu_dir]
        for d in (self.acct_dir, self.mem_dir):
            if d is not None and d not in out:
                out.append(d)
        return tuple(out)

    def set_memory(self, max_bytes: int | None, high_bytes: int | None = None) -> None:
        """Bound the replica's memory: ``max_bytes`` is the hard limit (the kernel OOM-kills
        past it), ``high_bytes`` the throttling threshold (v2 ``memory.high``; v1 has none,
        ``memory.soft_limit_in_bytes`` is written instead).  None = unlimited.  Raise
        :class:`CgroupUnavailable` when there is no memory cgroup."""
        d = self.mem_dir
        if d is None:
            raise CgroupUnavailable("no memory cgroup controller")
        if self.layout.version == 2:
            write_control(d / "memory.max", "max" if max_bytes is None else str(max_bytes))
            write_control(d / "memory.high", "max" if high_bytes is None else str(high_bytes))
            swap = d / "memory.swap.max"
            if swap.exists():  # the bound is on memory, not on memory plus swap
                write_control(swap, "0" if max_bytes is not None else "max")
            return
        write_control(d / "memory.limit_in_bytes", "-1" if max_bytes is None else str(max_bytes))
        memsw = d / "memory.memsw.limit_in_bytes"
        if memsw.exists():
            with contextlib.suppress(OSError):  # must stay >= limit_in_bytes
                write_control(memsw, "-1" if max_bytes is None else str(max_bytes))
        write_control(
            d / "memory.soft_limit_in_bytes", "-1" if high_bytes is None else str(high_bytes)
        )

    def read_oom_kills(self) -> int:
        """Processes the kernel killed in this cgroup for exceeding its memory limit (since the
        cgroup was created): ``oom_kill`` of ``memory.events`` (v2) or ``memory.oom_control`` (v1)."""
        if self.mem_dir is None:
            return 0
        name = "memory.events" if self.layout.version == 2 else "memory.oom_control"
        return _read_stat(self.mem_dir / name).get("oom_kill", 0)

    @property
    def procs_files(self) -> tuple[Path, ...]:
        """This cgroup's own ``cgroup.procs`` files (the processes in it, one per hierarchy)."""
        return tuple(d / "cgroup.procs" for d in self.dirs)

    @property
    def join_files(self) -> tuple[Path, ...]:
        """Write a pid into each of these to move that process into this cgroup (and, pinned
        on v1, into the parent's cpuset cgroup)."""
        if self.cpuset_dir is None:
            return self.procs_files
        return (*self.procs_files, self.cpuset_dir / "cgroup.procs")

    def set_cpu(self, cores: float | None) -> None:
        """Limit to ``cores`` CPUs (None = unlimited), in place: running tasks are not disturbed.

        ``budget.enforcement: limit``: the quota and the weight both follow ``cores``."""
        self._write(cores, weight_for(cores if cores is not None else 1.0, self.layout.version))

    def set_share(self, weight_cores: float, cap_cores: float | None) -> None:
        """A weight proportional to ``weight_cores`` (:func:`weight_for`) under a quota of
        ``cap_cores`` (None = no quota of its own, only its ancestors'), in place.

        ``budget.enforcement: share``: a service's cgroup gets its entitlement as weight and
        no quota; each of its replicas the default weight and the service's ``cpu.max``."""
        if weight_cores <= 0:
            raise ValueError(f"weight cores must be > 0, got {weight_cores!r}")
        self._write(cap_cores, weight_for(weight_cores, self.layout.version))

    def _write(self, quota_cores: float | None, weight: int) -> None:
        if self.layout.version == 2:
            quota = "max" if quota_cores is None else str(quota_us_for(quota_cores))
            write_control(self.cpu_dir / "cpu.max", f"{quota} {PERIOD_US}")
            write_control(self.cpu_dir / "cpu.weight", str(weight))
            return
        period_file = self.cpu_dir / "cpu.cfs_period_us"
        try:
            current_period = _read_int(period_file)
        except (FileNotFoundError, ValueError):
            current_period = None
        if current_period != PERIOD_US:
            write_control(period_file, str(PERIOD_US))
        quota_v1 = -1 if quota_cores is None else quota_us_for(quota_cores)
        write_control(self.cpu_dir / "cpu.cfs_quota_us", str(quota_v1))
        write_control(self.cpu_dir / "cpu.shares", str(weight))

    def read_limit(self) -> CpuLimit:
        """The limit the kernel has in force (read back from the files)."""
        if self.layout.version == 2:
            quota, _, period = (self.cpu_dir / "cpu.max").read_text().partition(" ")
            return CpuLimit(
                quota_us=None if quota.strip() == "max" else int(quota),
                period_us=int(period),
                weight=_read_int(self.cpu_dir / "cpu.weight"),
            )
        quota_v1 = _read_int(self.cpu_dir / "cpu.cfs_quota_us")
        return CpuLimit(
            quota_us=None if quota_v1 < 0 else quota_v1,
            period_us=_read_int(self.cpu_dir / "cpu.cfs_period_us"),
            weight=_read_int(self.cpu_dir / "cpu.shares"),
        )

    def read_usage(self) -> CpuUsage:
        stat = _read_stat(self.cpu_dir / "cpu.stat")
        if self.layout.version == 2:
            usage_us = stat.get("usage_usec")
            return CpuUsage(
                usage_s=None if usage_us is None else usage_us / 1e6,
                throttled_s=stat.get("throttled_usec", 0) / 1e6,
                periods=stat.get("nr_periods", 0),
                throttled_periods=stat.get("nr_throttled", 0),
            )
        acct = self.acct_dir if self.acct_dir is not None else self.cpu_dir
        try:
            usage_s: float | None = _read_int(acct / "cpuacct.usage") / 1e9
        except (FileNotFoundError, ValueError):
            usage_s = None
        return CpuUsage(
            usage_s=usage_s,
            throttled_s=stat.get("throttled_time", 0) / 1e9,
            periods=stat.get("nr_periods", 0),
            throttled_periods=stat.get("nr_throttled", 0),
        )

    def pids(self) -> list[int]:
        pids: set[int] = set()
        for f in self.procs_files:
            with contextlib.suppress(FileNotFoundError):
                pids.update(int(p) for p in f.read_text().split())
        return sorted(pids)

    def kill_all(self, sig: int = signal.SIGKILL) -> int:
        """Signal every process in this cgroup; return how many were signalled."""
        n = 0
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
                n += 1
        return n

    def remove(self, rmdir: Callable[[Path], None] = os.rmdir) -> bool:
        """Remove the directories (they must hold no process); True when all are gone."""
        return remove_dirs(self.dirs, rmdir)


__all__ = [
    "DEFAULT_WEIGHT_CORES",
    "MIN_QUOTA_US",
    "PERIOD_US",
    "CgroupLayout",
    "CgroupUnavailable",
    "CpuLimit",
    "CpuUsage",
    "ReplicaCgroup",
    "cores_for_weight",
    "detect_layout",
    "parse_bytes",
    "quota_us_for",
    "weight_for",
    "write_control",
]


def remove_dirs(dirs: Iterable[Path], rmdir: Callable[[Path], None] = os.rmdir) -> bool:
    """Remove cgroup directories (already gone is fine); False when one could not be removed."""
    ok = True
    for d in dirs:
        try:
            rmdir(d)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("cannot remove cgroup %s: %s", d, e.strerror)
            ok = False
    return ok
