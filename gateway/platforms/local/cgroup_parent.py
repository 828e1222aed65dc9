"""The Sluice-owned parent cgroup of one gateway process, and the sweep of dead ones' parents.

Layout: ``<hierarchy root>/sluice-<pid namespace>-<pid>/<replica>`` (limit enforcement), or
``.../sluice-<pid namespace>-<pid>/<service>/<replica>`` (share enforcement: a cgroup per
service holds its replicas).  The parent is removed, whole, when Sluice stops.  A parent whose process is gone (Sluice was killed) is swept at the next
start: its processes are killed and its directories removed, so nothing started by a dead
Sluice survives it for long.  Parents of another pid namespace are never touched (their
pids cannot be checked from here).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from gateway.platforms.local.cgroups import (
    CgroupLayout,
    CgroupUnavailable,
    ReplicaCgroup,
    detect_layout,
    remove_dirs,
    write_control,
)

log = logging.getLogger(__name__)

_PARENT_PREFIX = "sluice-"
_STALE_PARENT = re.compile(r"^sluice-(\d+)-(\d+)$")
"""``sluice-<pid namespace inode>-<pid>``: the namespace keeps one container's Sluice from
taking another's live parent (whose pid it cannot see) for a dead one."""
_EMPTY_WAIT_S = 3.0
"""Longest blocking wait for killed processes to leave a cgroup before removing it."""


class CgroupParent:
    """The Sluice-owned parent cgroup that holds every replica cgroup of one gateway process,
    directly or in a cgroup per service."""

    def __init__(
        self, layout: CgroupLayout, name: str, rmdir: Callable[[Path], None] = os.rmdir
    ) -> None:
        _check_name(name)
        self.layout = layout
        self.name = name
        self.cpu_dir = layout.cpu_root / name
        self.acct_dir = layout.cpuacct_root / name if layout.cpuacct_root is not None else None
        self.mem_dir = _mem_dir(layout, self.cpu_dir, name)
        self.cpuset_dir: Path | None = None
        """Where the replicas are pinned to CPUs (:meth:`pin`; v2: ``cpu_dir``), else None."""
        self.pinned: tuple[int, ...] | None = None
        """The CPUs every replica may run on (:meth:`pin`), None: not pinned."""
        self._rmdir = rmdir
        self._children: dict[tuple[str | None, str], ReplicaCgroup] = {}
        """Replica cgroups by (service cgroup or None, name)."""
        self._services: dict[str, ReplicaCgroup] = {}

    def __repr__(self) -> str:
        return (
            f"CgroupParent(v{self.layout.version}, {self.cpu_dir}, {len(self._children)} children)"
        )

    @property
    def group(self) -> ReplicaCgroup:
        """The parent itself, to cap (``set_cpu``) or measure every replica at once."""
        return ReplicaCgroup(self.layout, self.cpu_dir, self.acct_dir, self.mem_dir)

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
        if self.mem_dir is not None and self.mem_dir != self.cpu_dir:
            try:
                self.mem_dir.mkdir(exist_ok=True)
            except OSError as e:
                log.warning("no memory limits: cannot create cgroup %s: %s", self.mem_dir, e)
                self.mem_dir = None

    def pin(self, cpus: Sequence[int] | None) -> None:
        """Confine every replica, present and future, to ``cpus`` (None: every CPU again) with
        the ``cpuset`` controller on the parent: v2 its ``cpuset.cpus`` (the whole subtree
        obeys it), v1 a cgroup of the parent's name in the cpuset hierarchy, which replicas
        join at launch (:attr:`ReplicaCgroup.join_files`).  Raise :class:`CgroupUnavailable`
        when the controller is missing or refuses."""
        root = self.layout.cpuset_root
        if root is None:
            raise CgroupUnavailable("no cpuset cgroup controller")
        text = ",".join(str(c) for c in sorted(cpus)) if cpus is not None else None
        try:
            if self.layout.version == 2:
                _enable(root, "cpuset")
                directory = self.cpu_dir
            else:
                directory = root / self.name
                if not directory.is_dir():
                    directory.mkdir()
                    # v1: a cpuset takes no task before it has memory nodes (its parent's)
                    write_control(
                        directory / "cpuset.mems", (root / "cpuset.mems").read_text().strip()
                    )
            if text is None:  # v2: empty is "the parent's"; v1: the parent's CPUs
                text = "" if self.layout.version == 2 else (root / "cpuset.cpus").read_text()
            write_control(directory / "cpuset.cpus", text.strip())
        except OSError as e:
            raise CgroupUnavailable(
                f"cannot pin {self.name} to CPUs {text}: {e.strerror or e}"
            ) from None
        self.cpuset_dir = directory
        self.pinned = None if cpus is None else tuple(sorted(cpus))
        if self.layout.version == 1:
            for cg in self._children.values():
                cg.cpuset_dir = directory  # replicas launched from now on join it
                for pid in cg.pids():  # and those running now move into it
                    with contextlib.suppress(OSError):  # gone meanwhile
                        write_control(directory / "cgroup.procs", str(pid))

    def service(self, name: str) -> ReplicaCgroup:
        """Create (or reuse) the cgroup that holds the replicas of the service ``name`` (share
        enforcement), in every hierarchy the parent lives in; on v2 with the controllers
        enabled for its children.  Its directory is ``name``, or ``<name>.service`` where a
        control file already has that name (a service named ``tasks``, say)."""
        _check_name(name)
        cg = self._services.get(name)
        if cg is None:
            holders = [d for d in (self.cpu_dir, self.acct_dir, self.mem_dir) if d is not None]
            taken = any((d / name).exists() and not (d / name).is_dir() for d in holders)
            cg = self._make(self.group, f"{name}.service" if taken else name)
            if self.layout.version == 2:
                _enable_cpu(cg.cpu_dir)
            self._services[name] = cg
        return cg

    def child(self, name: str, service: str | None = None) -> ReplicaCgroup:
        """Create (or reuse) the replica cgroup ``name`` below this parent, or below the
        cgroup of the service ``service`` (see :meth:`service`, which creates it if needed)."""
        _check_name(name)
        key = (service, name)
        cg = self._children.get(key)
        if cg is None:
            cg = self._make(self.group if service is None else self.service(service), name)
            self._children[key] = cg
        return cg

    def _make(self, holder: ReplicaCgroup, name: str) -> ReplicaCgroup:
        """The directories of the cgroup ``name`` below ``holder``, in each of its hierarchies."""
        cpu_dir = holder.cpu_dir / name
        acct_dir = holder.acct_dir / name if holder.acct_dir is not None else None
        mem_dir = None
        if holder.mem_dir is not None:  # v2: the memory controller's files are beside cpu's
            mem_dir = cpu_dir if self.layout.version == 2 else holder.mem_dir / name
        for d in (cpu_dir, acct_dir, mem_dir):
            if d is not None:
                d.mkdir(exist_ok=True)
        joins = self.cpuset_dir if self.layout.version == 1 else None
        return ReplicaCgroup(self.layout, cpu_dir, acct_dir, mem_dir, joins)

    def discard(self, cg: ReplicaCgroup) -> bool:
        """Remove one (empty) replica cgroup."""
        for name, known in list(self._children.items()):
            if known is cg:
                del self._children[name]
        return cg.remove(self._rmdir)

    def children(self) -> list[ReplicaCgroup]:
        """Every replica cgroup (not the services' cgroups)."""
        return list(self._children.values())

    def destroy(self) -> bool:
        """Kill whatever still runs below the parent, then remove every directory."""
        return _destroy_tree(
            self.layout,
            self.cpu_dir,
            self.acct_dir,
            self._rmdir,
            mem_dir=self.mem_dir,
            cpuset_dir=_cpuset_dir(self.layout, self.name),
        )


def _check_name(name: str) -> None:
    if not name or "/" in name or name in {".", ".."}:
        raise ValueError(f"a cgroup name must be one path element, got {name!r}")


def _mem_dir(layout: CgroupLayout, cpu_dir: Path, name: str) -> Path | None:
    """The memory cgroup directory named ``name`` (v2: ``cpu_dir`` itself)."""
    if layout.memory_root is None:
        return None
    return cpu_dir if layout.version == 2 else layout.memory_root / name


def _cpuset_dir(layout: CgroupLayout, name: str) -> Path | None:
    """v1: the parent ``name``'s directory in the cpuset hierarchy (it may not exist)."""
    if layout.version != 1 or layout.cpuset_root is None:
        return None
    return layout.cpuset_root / name


def _enable(directory: Path, controller: str) -> None:
    """Enable ``controller`` for the children of ``directory`` (v2), if it is not yet."""
    control = directory / "cgroup.subtree_control"
    try:
        enabled = control.read_text().split()
    except FileNotFoundError:
        enabled = []
    if controller not in enabled:
        write_control(control, f"+{controller}")


def _enable_cpu(directory: Path) -> None:
    """Enable the cpu controller (and memory, when the hierarchy offers it) for children."""
    control = directory / "cgroup.subtree_control"
    try:
        enabled = control.read_text().split()
    except FileNotFoundError:
        enabled = []
    try:
        offered = (directory / "cgroup.controllers").read_text().split()
    except OSError:
        offered = []
    wanted = [c for c in ("cpu", "memory") if c not in enabled and (c == "cpu" or c in offered)]
    if not wanted:
        return
    try:
        write_control(control, " ".join(f"+{c}" for c in wanted))
    except OSError as e:
        if "cpu" in wanted:
            raise
        log.warning("cannot enable the memory controller in %s: %s", directory, e.strerror)


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
    *,
    mem_dir: Path | None = None,
    cpuset_dir: Path | None = None,
) -> bool:
    """Kill and remove ``cpu_dir`` and the same tree in the other hierarchies, deepest first."""
    separate_mem = mem_dir if mem_dir is not None and mem_dir != cpu_dir else None
    separate_cpuset = cpuset_dir if cpuset_dir is not None and cpuset_dir != cpu_dir else None
    ok = True
    for root in (cpu_dir, acct_dir, separate_mem, separate_cpuset):
        if root is not None:
            ok = _destroy_dir(layout, root, rmdir) and ok
    return ok


def _destroy_dir(layout: CgroupLayout, directory: Path, rmdir: Callable[[Path], None]) -> bool:
    """Empty and remove one cgroup directory of one hierarchy, its descendants first (any
    depth: replicas below the parent, or below a service's cgroup)."""
    ok = True
    for child in _subdirs(directory):
        ok = _destroy_dir(layout, child, rmdir) and ok
    with contextlib.suppress(FileNotFoundError):
        kill_and_wait(ReplicaCgroup(layout, directory, None))
    return remove_dirs([directory], rmdir) and ok


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
    names = {d.name for d in _subdirs(layout.cpu_root)}
    if layout.version == 1 and layout.cpuset_root is not None:
        names |= {d.name for d in _subdirs(layout.cpuset_root)}  # may outlive its cpu parent
    for name in sorted(names):
        m = _STALE_PARENT.match(name)
        if m is None or int(m.group(1)) != pid_namespace or pid_alive(int(m.group(2))):
            continue
        d = layout.cpu_root / name
        acct = layout.cpuacct_root / name if layout.cpuacct_root is not None else None
        _destroy_tree(
            layout,
            d,
            acct,
            rmdir,
            mem_dir=_mem_dir(layout, d, name),
            cpuset_dir=_cpuset_dir(layout, name),
        )
        swept.append(name)
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
