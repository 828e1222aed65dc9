"""CPU cgroups for local replicas: detection (v2 or v1), one cgroup per replica, limits, usage.

Layout: ``<hierarchy root>/<parent>/<replica>`` where ``<parent>`` is owned by one Sluice
process (``sluice-<pid namespace>-<pid>`` by default) and removed when it stops.  A parent whose process
is gone (Sluice was killed) is swept at the next start: its processes are killed and its
directories removed, so nothing started by a dead Sluice survives it for long.

* cgroup v2: ``cpu.max`` ("<quota_us> <period_us>" or "max <period_us>"), ``cpu.weight``
  (1..10000, default 100), ``cpu.stat`` (``usage_usec``, ``throttled_usec``); the ``cpu``
  controller is enabled with ``+cpu`` in ``cgroup.subtree_control`` of the root and parent.
* cgroup v1: ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1 = unlimited), ``cpu.shares``
  (2..262144, default 1024), ``cpu.stat`` ``throttled_time`` (ns) and ``cpuacct.usage`` (ns)
  from the ``cpuacct`` hierarchy (the same directory when both are mounted together).

A limit of ``c`` cores is a quota of ``c × period`` per period (period 100 ms) and a weight
proportional to ``c``, so replicas share contended CPU in the ratio of their allocations.
All file access is synchronous and tiny (cgroupfs is in memory).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PERIOD_US = 100_000
"""CFS period used for every replica (the kernel default)."""
MIN_QUOTA_US = 1_000
"""The kernel rejects quotas below 1 ms."""
_PARENT_PREFIX = "sluice-"
_STALE_PARENT = re.compile(r"^sluice-(\d+)-(\d+)$")
"""``sluice-<pid namespace inode>-<pid>``: the namespace keeps one container's Sluice from
taking another's live parent (whose pid it cannot see) for a dead one."""
_EMPTY_WAIT_S = 3.0
"""Longest blocking wait for killed processes to leave a cgroup before removing it."""


class CgroupUnavailable(Exception):
    """CPU cgroups cannot be used here; ``str(e)`` says why in one sentence."""


@dataclass(frozen=True, slots=True)
class CgroupLayout:
    """Where the kernel's CPU controller is mounted and which interface it speaks."""

    version: int
    """2 (unified hierarchy) or 1 (legacy per-controller hierarchies)."""
    cpu_root: Path
    """Root of the hierarchy that has the ``cpu`` controller."""
    cpuacct_root: Path | None = None
    """v1 only: root of a separately mounted ``cpuacct`` hierarchy (usage), if any."""


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


@dataclass(frozen=True, slots=True)
class _Mount:
    mount_point: Path
    fstype: str
    super_options: frozenset[str]


def _parse_mountinfo(text: str) -> list[_Mount]:
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        rest = right.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        point = Path(fields[4].replace("\\040", " "))
        mounts.append(_Mount(point, rest[0], frozenset(rest[2].split(","))))
    return mounts


def detect_layout(mountinfo_text: str) -> CgroupLayout:
    """Pick the CPU cgroup interface from ``/proc/self/mountinfo`` text (v2 preferred).

    v2 is used only when its hierarchy offers the ``cpu`` controller (``cgroup.controllers``);
    otherwise a v1 hierarchy with ``cpu`` is used.  Raise :class:`CgroupUnavailable` if neither.
    """
    mounts = _parse_mountinfo(mountinfo_text)
    reasons = []
    for m in mounts:
        if m.fstype != "cgroup2":
            continue
        try:
            controllers = (m.mount_point / "cgroup.controllers").read_text().split()
        except OSError as e:
            reasons.append(f"cgroup2 at {m.mount_point}: unreadable ({e.strerror})")
            continue
        if "cpu" in controllers:
            return CgroupLayout(version=2, cpu_root=m.mount_point)
        reasons.append(f"cgroup2 at {m.mount_point} has no cpu controller")
    v1 = [m for m in mounts if m.fstype == "cgroup"]
    cpu = next((m for m in v1 if "cpu" in m.super_options), None)
    if cpu is not None:
        if "cpuacct" in cpu.super_options:
            return CgroupLayout(version=1, cpu_root=cpu.mount_point, cpuacct_root=None)
        acct = next((m for m in v1 if "cpuacct" in m.super_options), None)
        return CgroupLayout(
            version=1,
            cpu_root=cpu.mount_point,
            cpuacct_root=acct.mount_point if acct else None,
        )
    reasons.append("no cgroup v1 hierarchy with the cpu controller")
    raise CgroupUnavailable("; ".join(reasons))


def _read_int(path: Path) -> int:
    return int(path.read_text().split()[0])


def _write(path: Path, value: str) -> None:
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


class ReplicaCgroup:
    """One replica's cgroup (a directory per hierarchy it lives in)."""

    def __init__(self, layout: CgroupLayout, cpu_dir: Path, acct_dir: Path | None) -> None:
        self.layout = layout
        self.cpu_dir = cpu_dir
        self.acct_dir = acct_dir
        """v1 with a separate cpuacct hierarchy only."""

    def __repr__(self) -> str:
        return f"ReplicaCgroup(v{self.layout.version}, {self.cpu_dir})"

    @property
    def dirs(self) -> tuple[Path, ...]:
        return (self.cpu_dir,) if self.acct_dir is None else (self.cpu_dir, self.acct_dir)

    @property
    def procs_files(self) -> tuple[Path, ...]:
        """Write a pid into each of these to move that process into this cgroup."""
        return tuple(d / "cgroup.procs" for d in self.dirs)

    def set_cpu(self, cores: float | None) -> None:
        """Limit to ``cores`` CPUs (None = unlimited), in place: running tasks are not disturbed."""
        v = self.layout.version
        weight = weight_for(cores if cores is not None else 1.0, v)
        if v == 2:
            quota = "max" if cores is None else str(quota_us_for(cores))
            _write(self.cpu_dir / "cpu.max", f"{quota} {PERIOD_US}")
            _write(self.cpu_dir / "cpu.weight", str(weight))
            return
        period_file = self.cpu_dir / "cpu.cfs_period_us"
        try:
            current_period = _read_int(period_file)
        except (FileNotFoundError, ValueError):
            current_period = None
        if current_period != PERIOD_US:
            _write(period_file, str(PERIOD_US))
        quota_v1 = -1 if cores is None else quota_us_for(cores)
        _write(self.cpu_dir / "cpu.cfs_quota_us", str(quota_v1))
        _write(self.cpu_dir / "cpu.shares", str(weight))

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
        ok = True
        for d in self.dirs:
            try:
                rmdir(d)
            except FileNotFoundError:
                pass
            except OSError as e:
                log.warning("cannot remove cgroup %s: %s", d, e.strerror)
                ok = False
        return ok


class CgroupParent:
    """The Sluice-owned parent cgroup that holds every replica cgroup of one gateway process."""

    def __init__(
        self, layout: CgroupLayout, name: str, rmdir: Callable[[Path], None] = os.rmdir
    ) -> None:
        if not name or "/" in name or name in {".", ".."}:
            raise ValueError(f"a cgroup name must be one path element, got {name!r}")
        self.layout = layout
        self.name = name
        self.cpu_dir = layout.cpu_root / name
        self.acct_dir = layout.cpuacct_root / name if layout.cpuacct_root is not None else None
        self._rmdir = rmdir
        self._children: dict[str, ReplicaCgroup] = {}

    def __repr__(self) -> str:
        return (
            f"CgroupParent(v{self.layout.version}, {self.cpu_dir}, {len(self._children)} children)"
        )

    @property
    def group(self) -> ReplicaCgroup:
        """The parent itself, to cap (``set_cpu``) or measure every replica at once."""
        return ReplicaCgroup(self.layout, self.cpu_dir, self.acct_dir)

    def create(self) -> None:
        """Make the parent directories; raise :class:`CgroupUnavailable` when that is not allowed."""
        try:
            if self.layout.version == 2:
                _enable_cpu(self.layout.cpu_root)
            for d in (self.cpu_dir, self.acct_dir):
                if d is not None:
                    d.mkdir(exist_ok=True)
            if self.layout.version == 2:
                _enable_cpu(self.cpu_dir)
        except OSError as e:
            raise CgroupUnavailable(
                f"cannot create cgroup {self.cpu_dir}: {e.strerror or e}"
            ) from None

    def child(self, name: str) -> ReplicaCgroup:
        """Create (or reuse) the replica cgroup ``name`` below this parent."""
        if not name or "/" in name or name in {".", ".."}:
            raise ValueError(f"a cgroup name must be one path element, got {name!r}")
        cg = self._children.get(name)
        if cg is None:
            cpu_dir = self.cpu_dir / name
            acct_dir = self.acct_dir / name if self.acct_dir is not None else None
            cpu_dir.mkdir(exist_ok=True)
            if acct_dir is not None:
                acct_dir.mkdir(exist_ok=True)
            cg = ReplicaCgroup(self.layout, cpu_dir, acct_dir)
            self._children[name] = cg
        return cg

    def discard(self, cg: ReplicaCgroup) -> bool:
        """Remove one (empty) replica cgroup."""
        for name, known in list(self._children.items()):
            if known is cg:
                del self._children[name]
        return cg.remove(self._rmdir)

    def children(self) -> list[ReplicaCgroup]:
        return list(self._children.values())

    def destroy(self) -> bool:
        """Kill whatever still runs below the parent, then remove every directory."""
        return _destroy_tree(self.layout, self.cpu_dir, self.acct_dir, self._rmdir)


def _enable_cpu(directory: Path) -> None:
    control = directory / "cgroup.subtree_control"
    try:
        enabled = control.read_text().split()
    except FileNotFoundError:
        enabled = []
    if "cpu" not in enabled:
        _write(control, "+cpu")


def _subdirs(directory: Path | None) -> list[Path]:
    if directory is None:
        return []
    try:
        return [p for p in directory.iterdir() if p.is_dir()]
    except FileNotFoundError:
        return []


def kill_and_wait(cg: ReplicaCgroup, timeout_s: float = _EMPTY_WAIT_S) -> bool:
    """SIGKILL everything in ``cg`` and wait (bounded, blocking) until it is empty."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if cg.kill_all() == 0 and not cg.pids():
                return True
        except OSError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def _destroy_tree(
    layout: CgroupLayout,
    cpu_dir: Path,
    acct_dir: Path | None,
    rmdir: Callable[[Path], None],
) -> bool:
    acct_children = {p.name: p for p in _subdirs(acct_dir)}
    ok = True
    for child in _subdirs(cpu_dir):
        cg = ReplicaCgroup(layout, child, acct_children.pop(child.name, None))
        kill_and_wait(cg)
        ok = cg.remove(rmdir) and ok
    for orphan in acct_children.values():
        kill_and_wait(ReplicaCgroup(layout, orphan, None))
        ok = ReplicaCgroup(layout, orphan, None).remove(rmdir) and ok
    for d in (cpu_dir, acct_dir):
        if d is None:
            continue
        with contextlib.suppress(FileNotFoundError):
            kill_and_wait(ReplicaCgroup(layout, d, None))
        try:
            rmdir(d)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("cannot remove cgroup %s: %s", d, e.strerror)
            ok = False
    return ok


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(
    layout: CgroupLayout,
    pid_alive: Callable[[int], bool] = _pid_alive,
    rmdir: Callable[[Path], None] = os.rmdir,
    pid_namespace: int | None = None,
) -> list[str]:
    """Kill and remove the parents left by Sluice processes of this pid namespace that no
    longer run (``sluice-<namespace>-<pid>``); return their names."""
    if pid_namespace is None:
        pid_namespace = current_pid_namespace()
    swept = []
    for d in _subdirs(layout.cpu_root):
        m = _STALE_PARENT.match(d.name)
        if m is None or int(m.group(1)) != pid_namespace or pid_alive(int(m.group(2))):
            continue
        acct = layout.cpuacct_root / d.name if layout.cpuacct_root is not None else None
        _destroy_tree(layout, d, acct, rmdir)
        swept.append(d.name)
        log.warning("removed cgroup %s left by a Sluice process that is gone", d)
    return swept


def current_pid_namespace() -> int:
    """The inode of this process's pid namespace (0 if it cannot be read)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def parent_name_for(pid: int, pid_namespace: int | None = None) -> str:
    """The parent cgroup name of the Sluice process ``pid``: ``sluice-<pid namespace>-<pid>``."""
    ns = current_pid_namespace() if pid_namespace is None else pid_namespace
    return f"{_PARENT_PREFIX}{ns}-{pid}"


def default_parent_name() -> str:
    return parent_name_for(os.getpid())


def open_parent(
    name: str | None = None,
    mountinfo_path: Path = Path("/proc/self/mountinfo"),
    sweep: bool = True,
) -> CgroupParent:
    """Detect the layout, sweep stale parents and create this process's parent cgroup.

    Raise :class:`CgroupUnavailable` (with the reason) when CPU cgroups cannot be used.
    """
    try:
        text = mountinfo_path.read_text()
    except OSError as e:
        raise CgroupUnavailable(f"cannot read {mountinfo_path}: {e.strerror}") from None
    layout = detect_layout(text)
    if sweep:
        try:
            sweep_stale(layout)
        except OSError as e:
            log.warning("could not sweep stale Sluice cgroups: %s", e)
    parent = CgroupParent(layout, name or default_parent_name())
    parent.create()
    return parent


__all__ = [
    "PERIOD_US",
    "CgroupLayout",
    "CgroupParent",
    "CgroupUnavailable",
    "CpuLimit",
    "CpuUsage",
    "ReplicaCgroup",
    "detect_layout",
    "open_parent",
    "parent_name_for",
    "quota_us_for",
    "sweep_stale",
    "weight_for",
]
