"""cgroup hierarchies as this process sees them: which one holds the ``cpu`` controller (v2
preferred), and where ``cpuacct``, ``memory`` and ``cpuset`` are.

Shared by the local platform (its replicas' cgroups, :mod:`gateway.platforms.local.cgroups`)
and :mod:`gateway.platforms.machine` (whether ``budget.enforcement: auto`` can pin the
replicas to CPUs), so both read the same layout the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


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
    memory_root: Path | None = None
    """Root of the hierarchy with the ``memory`` controller (v2: ``cpu_root``), None if none."""
    cpuset_root: Path | None = None
    """Root of the hierarchy with the ``cpuset`` controller (v2: ``cpu_root``), None if none:
    where the parent pins every replica to the budget's CPUs (``CgroupParent.pin``)."""


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
            memory = m.mount_point if "memory" in controllers else None
            cpuset = m.mount_point if "cpuset" in controllers else None
            return CgroupLayout(
                version=2, cpu_root=m.mount_point, memory_root=memory, cpuset_root=cpuset
            )
        reasons.append(f"cgroup2 at {m.mount_point} has no cpu controller")
    v1 = [m for m in mounts if m.fstype == "cgroup"]
    cpu = next((m for m in v1 if "cpu" in m.super_options), None)
    if cpu is not None:
        mem = next((m for m in v1 if "memory" in m.super_options), None)
        memory_root = mem.mount_point if mem else None
        pinning = next((m for m in v1 if "cpuset" in m.super_options), None)
        cpuset_root = pinning.mount_point if pinning else None
        if "cpuacct" in cpu.super_options:
            return CgroupLayout(
                version=1,
                cpu_root=cpu.mount_point,
                cpuacct_root=None,
                memory_root=memory_root,
                cpuset_root=cpuset_root,
            )
        acct = next((m for m in v1 if "cpuacct" in m.super_options), None)
        return CgroupLayout(
            version=1,
            cpu_root=cpu.mount_point,
            cpuacct_root=acct.mount_point if acct else None,
            memory_root=memory_root,
            cpuset_root=cpuset_root,
        )
    reasons.append("no cgroup v1 hierarchy with the cpu controller")
    raise CgroupUnavailable("; ".join(reasons))
