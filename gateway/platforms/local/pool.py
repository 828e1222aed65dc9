"""The local process pool: desired replicas and CPU per service, kept true by supervised tasks.

Per service the pool holds a desired replica count and CPU per replica.  Each replica is a
*slot* run by its own task: pick a free port, start the process in its own cgroup, probe
readiness, publish the endpoint when ready, keep probing, restart after a crash with an
exponential backoff.  Scale-down retires slots (not-ready ones first, then the newest):
the endpoint is withdrawn first, ``drain(service, address)`` is awaited (the gateway's
"its in-flight requests are done"), then SIGTERM, then SIGKILL after ``grace_s``.
``close()`` (or leaving ``async with``) stops every replica and removes every cgroup.

CPU changes are written to the running cgroups in place.  The parent cgroup is capped at
the budget (``total_cpu_cores``).  ``enforcement`` says what enforces a service's CPU:

* ``"limit"`` (the default, ``budget.enforcement: limit``): each replica's decided CPU is a
  hard cap (quota = weight = the decided CPU; replicas flat under the parent), idle CPU stays
  idle until the next decision lends it, or until a lender
  (:class:`~gateway.platforms.local.lender.QuotaLender`, ``budget.lending``) lends it between
  ticks through :meth:`LocalPool.set_quota_overlays`: the quota in force is then the overlay
  (re-computed by ``on_holdings_change`` whenever the decided CPU or the replicas change),
  the decided CPU is still what the pool reports as decided;
* ``"share"``: a cgroup per service below the parent, weighted by the service's entitlement
  (:meth:`LocalPool.set_entitlements`: its fair share of the budget), holds its replicas at
  equal weights, each capped at the service's ``cpu.max`` (:meth:`LocalPool.set_cpu_cap`, at
  most the budget).  Under contention the kernel gives a busy service at least the smaller of
  what it can use and its entitlement, and lends what others leave idle; the decided CPU
  per replica sets no weight (it is reported, and the replica counts follow decisions).

Where cgroups are not usable a warning is logged once, replicas still scale, and
:class:`ServiceStatus` says ``cpu_applied=False``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Literal, TypeAlias

from gateway.platforms.local.cgroup_parent import CgroupParent, open_parent
from gateway.platforms.local.cgroups import DEFAULT_WEIGHT_CORES, CgroupUnavailable, ReplicaCgroup
from gateway.platforms.local.config import ReplicasConfig, group_name
from gateway.platforms.local.identity import (
    Identity,
    IdentityChoice,
    IdentityError,
    choose_identity,
    default_workdir,
    prepare_workdir,
)
from gateway.platforms.local.probe import probe_http
from gateway.platforms.local.replicas import ReplicaProcess
from gateway.platforms.local.state import (
    CpuTotals,
    PoolUpdate,
    ReplicaPhase,
    ReplicaStatus,
    ServiceEntry,
    ServiceStatus,
    Slot,
    Subscriber,
    restart_delay_s,
)
from scaler.policy import cpus_for

log = logging.getLogger(__name__)

Enforcement: TypeAlias = Literal["share", "limit"]
"""What a replica's decided CPU is: its guaranteed share, or a hard limit."""

Drain = Callable[[str, str], Awaitable[object]]
"""``await drain(service, address)`` returns once the gateway routes nothing new to the
address and its in-flight requests have completed."""

STABLE_RUN_S = 10.0
"""A replica ready this long resets its slot's crash count (and so its restart backoff)."""
_RMDIR_ATTEMPTS = 50
_RMDIR_PAUSE_S = 0.02


async def _no_drain(service: str, address: str) -> None:
    return None


def min_cap(a: float | None, b: float | None) -> float | None:
    """The smaller of two caps (None = unlimited)."""
    if a is None:
        return b
    return a if b is None else min(a, b)


class LocalPool:
    """Runs every service's replicas as local child processes, under per-replica CPU cgroups.

    ``cgroups``: ``"auto"`` detects and creates a parent named ``cgroup_parent_name``
    (default ``sluice-<pid>``); ``None`` disables CPU limits; or a ready :class:`CgroupParent`.
    ``enforcement``: see the module docstring.
    """

    def __init__(
        self,
        specs: Mapping[str, ReplicasConfig],
        *,
        drain: Drain | None = None,
        cgroups: CgroupParent | Literal["auto"] | None = "auto",
        cgroup_parent_name: str | None = None,
        mountinfo_path: Path = Path("/proc/self/mountinfo"),
        host: str = "127.0.0.1",
        total_cpu_cores: float | None = None,
        enforcement: Enforcement = "limit",
        allowed_cpus: Callable[[], set[int]] = lambda: os.sched_getaffinity(0),
    ) -> None:
        if total_cpu_cores is not None and total_cpu_cores <= 0:
            raise ValueError(f"total_cpu_cores must be > 0, got {total_cpu_cores!r}")
        if enforcement not in ("share", "limit"):
            raise ValueError(f"enforcement must be 'share' or 'limit', got {enforcement!r}")
        self.enforcement: Enforcement = enforcement
        self._services = {name: ServiceEntry(name, spec, None) for name, spec in specs.items()}
        self._drain = drain or _no_drain
        self._cgroup_mode = cgroups
        self._cgroup_parent_name = cgroup_parent_name
        self._mountinfo_path = mountinfo_path
        self.total_cpu_cores = total_cpu_cores
        """Cap on the parent cgroup: all replicas together never use more (the budget)."""
        self.cgroups: CgroupParent | None = None
        self.cgroups_unavailable_reason: str | None = None
        self._allowed_cpus = allowed_cpus
        self.unpinned_reason: str | None = None
        """Share enforcement with a budget below the CPUs: why the replicas could not be
        pinned to the budget's CPUs (None: pinned, or no pinning needed)."""
        self.host = host
        self._subscribers: list[Subscriber] = []
        self._ports_in_use: set[int] = set()
        self._started = False
        self._closed = False
        self._drain_on_close = True
        self._killed = False
        self._launch: dict[str, tuple[Identity | None, Path]] = {}
        """Per service: the identity its replicas run as and their working directory."""
        self._refused: dict[str, str] = {}
        """Per service whose replicas are not started: why (see ``identity.choose_identity``)."""
        self.on_holdings_change: Callable[[], None] | None = None
        """Limit enforcement: called (synchronously) when a service's decided CPU or its
        replicas holding a cgroup change, before the new quotas are written; the lender
        re-computes its overlays there (:meth:`set_quota_overlays`)."""

    def __repr__(self) -> str:
        parts = ", ".join(
            f"{s.name}: {sum(sl.active for sl in s.slots)}/{s.desired}"
            for s in self._services.values()
        )
        return f"LocalPool({parts}; {self.enforcement}; cgroups={self.cgroups!r})"

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Set up cgroups (warning once if unusable) and start the initial replicas."""
        if self._started:
            return
        self._started = True
        if self._cgroup_mode == "auto":
            try:
                # Sweeping a dead Sluice's cgroups may wait for killed processes: not on the loop.
                self.cgroups = await asyncio.to_thread(
                    open_parent, self._cgroup_parent_name, self._mountinfo_path
                )
            except CgroupUnavailable as e:
                self.cgroups_unavailable_reason = str(e)
                log.warning(
                    "CPU limits are NOT applied on this machine (%s): replicas still scale, "
                    "CPU decisions are reported as not applied",
                    e,
                )
        elif isinstance(self._cgroup_mode, CgroupParent):
            self.cgroups = self._cgroup_mode
        else:
            self.cgroups_unavailable_reason = "cgroups disabled"
        self._apply_total()
        for svc in self._services.values():
            self._open_group(svc)
            self._launch[svc.name] = self._launch_context(svc)
        for svc in self._services.values():
            self._reconcile(svc)

    def _launch_context(self, svc: ServiceEntry) -> tuple[Identity | None, Path]:
        """Who ``svc``'s replicas run as and where (warning loudly when that is root by default)."""
        spec = svc.spec
        euid = os.geteuid()
        try:
            choice = choose_identity(
                svc.name,
                spec.command,
                spec.user,
                spec.group,
                euid=euid,
                path_env=os.environ.get("PATH"),
            )
        except IdentityError as e:
            choice = IdentityChoice(
                None, refusal=f"{svc.name}: replicas NOT started: replicas.user/group: {e}"
            )
        if choice.warning is not None:
            log.warning("%s", choice.warning)
        if choice.refusal is not None:
            log.error("%s", choice.refusal)
            self._refused[svc.name] = choice.refusal
        who = choice.identity
        workdir = (
            Path(spec.workdir)
            if spec.workdir is not None
            else default_workdir(svc.name, euid, os.environ.get("HOME"))
        )
        if spec.workdir is None:
            try:
                prepare_workdir(workdir, who)
            except OSError as e:
                log.warning("%s: cannot create working directory %s: %s", svc.name, workdir, e)
        if choice.refusal is None:
            log.info(
                "%s: replicas run as %s in %s",
                svc.name,
                "Sluice's user" if who is None else f"{who.name} (uid {who.uid}, gid {who.gid})",
                workdir,
            )
        return who, workdir

    async def close(self, drain: bool = True) -> None:
        """Stop every replica (withdraw, drain if asked, SIGTERM, SIGKILL) and remove the cgroups."""
        if self._closed:
            return
        self._closed = True
        self._drain_on_close = drain
        for svc in self._services.values():
            svc.desired = 0
            for slot in svc.slots:
                slot.retire.set()
        tasks = [s.task for svc in self._services.values() for s in svc.slots if s.task]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self.cgroups is not None and self._cgroup_mode == "auto":
            await asyncio.to_thread(self.cgroups.destroy)
        for sub in self._subscribers:
            sub.wake.set()

    def kill_now(self) -> None:
        """Last resort, synchronous: SIGKILL every replica's process group and cgroup at once.

        Nothing is restarted afterwards; ``close()`` still removes the cgroups.
        """
        self._killed = True
        for svc in self._services.values():
            svc.desired = 0
            for slot in svc.slots:
                slot.retire.set()
                if slot.process is not None:
                    slot.process.signal_group(signal.SIGKILL)
                if slot.cgroup is not None:
                    with contextlib.suppress(OSError):
                        slot.cgroup.kill_all()

    async def __aenter__(self) -> LocalPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- desired state ---------------------------------------------------------------------

    @property
    def services(self) -> list[str]:
        return list(self._services)

    @property
    def cpu_limits_applied(self) -> bool:
        return self.cgroups is not None

    def scale(self, service: str, replicas: int, cpu_per_replica_cores: float | None) -> None:
        """Set the desired replicas and CPU per replica of ``service`` (CPU applied in place)."""
        self.set_cpu(service, cpu_per_replica_cores)
        self.set_replicas(service, replicas)

    def set_replicas(self, service: str, replicas: int) -> None:
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {replicas}")
        svc = self._service(service)
        if svc.desired != replicas:
            log.info("%s: replicas %d -> %d", service, svc.desired, replicas)
        if self._killed or self._closed:
            log.warning("%s: the pool is stopped; replicas stay at 0", service)
            return
        svc.desired = replicas
        if self._started:
            self._reconcile(svc)

    def set_cpu(self, service: str, cores: float | None) -> None:
        if cores is not None and cores <= 0:
            raise ValueError(f"cpu per replica must be > 0 cores, got {cores}")
        svc = self._service(service)
        if svc.cpu_cores == cores:
            return
        log.info("%s: cpu per replica %s -> %s cores", service, svc.cpu_cores, cores)
        svc.cpu_cores = cores
        if self.enforcement == "share":
            return  # reported only: the service's entitlement and cpu.max are what is written
        if self.on_holdings_change is not None:
            self._holdings_changed()
        else:
            self._apply_service(svc)

    def set_quota_overlays(
        self,
        overlays: Mapping[str, float | None],
        replicas: Mapping[str, Mapping[str, float]] | None = None,
    ) -> None:
        """Limit enforcement: the quota per replica in force for these services instead of
        their decided CPU (None: back to the decided CPU), and for some of their replicas
        (``replicas``: service -> replica address -> quota; an idle replica's) another one;
        every replica's quota is written at once, the shrinking ones first, so the quotas in
        force never add up to more than before or after.  Quotas stay capped at the budget.
        Ignored under ``share``."""
        replicas = replicas or {}
        for name, cores in overlays.items():
            own = replicas.get(name, {})
            for cores_ in (cores, *own.values()):
                if cores_ is not None and cores_ <= 0:
                    raise ValueError(f"{name}: quota overlay must be > 0 cores, got {cores_}")
            svc = self._service(name)
            svc.quota_overlay = cores
            svc.replica_overlays = dict(own)
        if self.enforcement == "limit":
            self._apply_quotas()

    def serving_addresses(self, service: str) -> tuple[str, ...]:
        """The addresses of ``service``'s ready replicas (those the gateway routes to)."""
        return self._service(service).published

    def cpu_holding(self, service: str) -> tuple[int, float | None]:
        """(replicas whose cgroup holds a quota, decided CPU per replica) of ``service``."""
        svc = self._service(service)
        return sum(s.cgroup is not None for s in svc.slots), svc.cpu_cores

    def set_cpu_cap(self, service: str, cores: float | None) -> None:
        """The hard cap per replica in share enforcement (``scaling.cpu.max``; None = only the
        budget).  In limit enforcement the decided CPU is the cap and this is only recorded."""
        if cores is not None and cores <= 0:
            raise ValueError(f"cpu cap per replica must be > 0 cores, got {cores}")
        svc = self._service(service)
        if svc.cpu_cap_cores == cores:
            return
        svc.cpu_cap_cores = cores
        if self.enforcement == "share":
            self._apply_service(svc)

    def set_entitlements(self, entitlements: Mapping[str, float]) -> None:
        """Share enforcement: each named service's entitlement, in cores (its fair share of the
        budget: ``scaler.arbiter.fair_shares``), written at once as its cgroup's weight.  Call
        it again whenever the budget or the policies change.  A service never given one has
        the kernel's default weight (1 core).  In limit enforcement it is only recorded."""
        for name, cores in entitlements.items():
            self._service(name)
            if not cores >= 0:  # also refuses NaN
                raise ValueError(f"{name}: entitlement must be >= 0 cores, got {cores!r}")
        for name, cores in entitlements.items():
            svc = self._services[name]
            if svc.entitlement_cores == cores:
                continue
            if svc.entitlement_cores is not None or self._started:
                log.info("%s: entitlement %s -> %g cores", name, svc.entitlement_cores, cores)
            svc.entitlement_cores = cores
            if self.enforcement == "share":
                self._write_group(svc)

    def set_total_cpu(self, cores: float | None) -> None:
        """Change the budget: the parent cgroup's cap (and the replicas' caps bounded by it).
        Share enforcement: the entitlements follow only through :meth:`set_entitlements`."""
        if cores is not None and cores <= 0:
            raise ValueError(f"total_cpu_cores must be > 0, got {cores!r}")
        if cores == self.total_cpu_cores:
            return
        shrinking = self.total_cpu_cores is None or (
            cores is not None and cores < self.total_cpu_cores
        )
        self.total_cpu_cores = cores
        # v1 refuses a child quota above its parent's: lower the children first when shrinking.
        if not shrinking:
            self._apply_total()
        for svc in self._services.values():
            self._apply_service(svc)
        if shrinking:
            self._apply_total()
        self._holdings_changed()

    def _apply_total(self) -> None:
        if self.cgroups is None or not self._started:
            return
        try:
            self.cgroups.group.set_cpu(self.total_cpu_cores)
        except OSError as e:
            log.warning("cannot cap %r at %s cores: %s", self.cgroups, self.total_cpu_cores, e)
        self._apply_pin()

    def pin_cpus(self) -> tuple[int, ...] | None:
        """Share enforcement with a budget below the CPUs this process may use: the CPUs the
        replicas are confined to, the budget rounded up (the highest-numbered of the allowed
        ones, leaving the first to the gateway and the system); None: no pinning (``limit``,
        or the budget is every allowed CPU)."""
        if self.enforcement != "share" or self.total_cpu_cores is None:
            return None
        allowed = sorted(self._allowed_cpus())
        n = cpus_for(self.total_cpu_cores)
        if n >= len(allowed):
            return None
        return tuple(allowed[-n:])

    def _apply_pin(self) -> None:
        """Share: weights arbitrate only between tasks that wait for the same CPU, so under a
        quota on more CPUs than the budget a busy service does not get its entitlement; on
        the budget's own CPUs (a cpuset), with the quota in force only for a fraction, it
        does.  Pin the replicas there, or say once why not."""
        assert self.cgroups is not None
        cpus = self.pin_cpus()
        if cpus == self.cgroups.pinned:
            return
        try:
            self.cgroups.pin(cpus)
        except CgroupUnavailable as e:
            if self.unpinned_reason is None:
                log.warning(
                    "share enforcement: replicas NOT pinned to %d CPU(s) %s (%s): the budget's "
                    "quota alone bounds them, under which a busy service may get less than its "
                    "entitlement (budget.enforcement: limit guarantees it)",
                    len(cpus or ()),
                    ",".join(str(c) for c in cpus or ()),
                    e,
                )
            self.unpinned_reason = str(e)
            return
        self.unpinned_reason = None
        if cpus is not None:
            log.info(
                "share enforcement: replicas pinned to CPU(s) %s (budget %g cores)",
                ",".join(str(c) for c in cpus),
                self.total_cpu_cores,
            )

    def _open_group(self, svc: ServiceEntry) -> None:
        """Share enforcement: the service's own cgroup (once), weighted by its entitlement."""
        if self.enforcement != "share" or self.cgroups is None or svc.group is not None:
            return
        try:
            svc.group = self.cgroups.service(group_name(svc.name))
        except OSError as e:
            log.warning("%s: cannot create the service's cgroup: %s", svc.name, e)
            return
        self._write_group(svc)

    def _write_group(self, svc: ServiceEntry) -> None:
        if svc.group is None:
            return
        cores = svc.entitlement_cores
        try:
            # No quota of its own: its replicas' (cpu.max) and the parent's (the budget) bind.
            svc.group.set_share(DEFAULT_WEIGHT_CORES if cores is None else max(cores, 1e-6), None)
        except OSError as e:
            log.warning(
                "cannot set the weight of %r to an entitlement of %s cores: %s", svc.group, cores, e
            )
            svc.group_ok = False
            return
        svc.group_ok = True

    def _apply_service(self, svc: ServiceEntry) -> None:
        for slot in svc.slots:
            if slot.cgroup is not None:
                self._write_cpu(slot, svc, self.slot_quota_cores(svc, slot))

    def _apply_quotas(self) -> None:
        """Limit enforcement: write every replica quota that differs from what should be in
        force, the shrinking ones first (the sum in force never goes above its end value)."""
        inf = float("inf")
        writes: list[tuple[float, Slot, ServiceEntry, float | None]] = []
        for svc in self._services.values():
            for slot in svc.slots:
                target = self.slot_quota_cores(svc, slot)
                if slot.cgroup is None or (slot.quota_written and slot.quota_cores == target):
                    continue
                now = slot.quota_cores if slot.quota_written else None
                delta = (inf if target is None else target) - (inf if now is None else now)
                writes.append((delta, slot, svc, target))
        writes.sort(key=lambda w: w[0])
        for _, slot, svc, target in writes:
            self._write_cpu(slot, svc, target)

    def _holdings_changed(self) -> None:
        """The decided CPU, the replicas or the budget changed: the lender re-computes its
        overlays, then whatever differs is written (a failing lender leaves the decided CPU)."""
        if self.enforcement != "limit" or self.on_holdings_change is None or self._closed:
            return
        try:
            self.on_holdings_change()
        except Exception:
            log.exception("lending between ticks failed: quotas back to the decided CPU")
            for svc in self._services.values():
                svc.quota_overlay = None
                svc.replica_overlays = {}
        self._apply_quotas()

    def _service(self, service: str) -> ServiceEntry:
        try:
            return self._services[service]
        except KeyError:
            raise KeyError(f"the local pool runs no service {service!r}") from None

    def cap_cores(self, svc: ServiceEntry) -> float | None:
        """The hard cap per replica in force for ``svc`` (None = unlimited)."""
        cap = svc.cpu_cores if self.enforcement == "limit" else svc.cpu_cap_cores
        if self.total_cpu_cores is not None:
            # Never above the budget (v1 refuses a child quota above its parent's).
            cap = self.total_cpu_cores if cap is None else min(cap, self.total_cpu_cores)
        return cap

    def quota_cores(self, svc: ServiceEntry) -> float | None:
        """The quota per replica that should be in force for ``svc`` (None = unlimited): the
        decided cap, or in limit enforcement the lender's overlay (also within the budget)."""
        if self.enforcement != "limit" or svc.quota_overlay is None:
            return self.cap_cores(svc)
        if self.total_cpu_cores is not None:
            return min(svc.quota_overlay, self.total_cpu_cores)
        return svc.quota_overlay

    def slot_quota_cores(self, svc: ServiceEntry, slot: Slot) -> float | None:
        """The quota that should be in force for one replica: its own overlay (an idle
        replica lending, limit enforcement), else its service's (:meth:`quota_cores`)."""
        if self.enforcement == "limit" and svc.replica_overlays and slot.process is not None:
            own = svc.replica_overlays.get(slot.process.address)
            if own is not None and slot.phase is ReplicaPhase.READY:
                return own if self.total_cpu_cores is None else min(own, self.total_cpu_cores)
        return self.quota_cores(svc)

    def _write_memory(self, slot: Slot, svc: ServiceEntry) -> None:
        """Write ``memory_max``/``memory_high`` to the slot's cgroup (once, when it is made)."""
        cgroup = slot.cgroup
        assert cgroup is not None
        top, high = svc.spec.memory_max_bytes, svc.spec.memory_high_bytes
        if top is None and high is None:
            slot.memory_ok = True
            return
        try:
            cgroup.set_memory(top, high)
            slot.oom_seen = cgroup.read_oom_kills()
        except (OSError, CgroupUnavailable) as e:
            if not svc.memory_warned:
                svc.memory_warned = True
                log.warning(
                    "%s: memory limit NOT applied (%s): replicas run without memory_max",
                    svc.name,
                    e,
                )
            slot.memory_ok = False
            return
        slot.memory_ok = True

    def _count_oom_kills(self, svc: ServiceEntry, slot: Slot, pid: int | None) -> None:
        """Read the slot's cgroup OOM-kill counter; log and count the kills since last read."""
        if slot.cgroup is None:
            return
        try:
            seen = slot.cgroup.read_oom_kills()
        except OSError:
            return
        new, slot.oom_seen = seen - slot.oom_seen, seen
        if new > 0:
            slot.oom_kills += new
            svc.oom_kills_total += new
            log.warning(
                "%s: %s (pid %s) was OOM-killed: it went past memory_max %s (%d kill(s))",
                svc.name,
                slot.name,
                pid,
                svc.spec.memory_max,
                new,
            )

    def _write_cpu(self, slot: Slot, svc: ServiceEntry, cap: float | None) -> None:
        cgroup = slot.cgroup
        assert cgroup is not None
        try:
            if self.enforcement == "limit":
                cgroup.set_cpu(cap)
            else:
                # Equal weights inside the service: its cgroup's weight is its entitlement.
                cgroup.set_share(DEFAULT_WEIGHT_CORES, cap)
        except OSError as e:
            log.warning(
                "cannot set CPU of %r to %s cores (cap %s, %s): %s",
                cgroup,
                svc.cpu_cores,
                cap,
                self.enforcement,
                e,
            )
            slot.cpu_ok = slot.quota_written = False
            return
        slot.cpu_ok = slot.quota_written = True
        slot.quota_cores = cap

    # ---- what is ---------------------------------------------------------------------------

    def status(self, service: str) -> ServiceStatus:
        svc = self._service(service)
        replicas = tuple(
            ReplicaStatus(
                name=s.name,
                phase=s.phase,
                address=s.process.address if s.process else None,
                pid=s.process.pid if s.process else None,
                restarts=s.restarts,
                oom_kills=s.oom_kills,
            )
            for s in svc.slots
        )
        who, workdir = self._launch.get(service, (None, None))
        return ServiceStatus(
            service=service,
            desired=svc.desired,
            ready=sum(r.phase is ReplicaPhase.READY for r in replicas),
            cpu_per_replica_cores=svc.cpu_cores,
            cpu_cap_per_replica_cores=self.cap_cores(svc),
            enforcement=self.enforcement,
            cpu_applied=self.cgroups is not None
            and all(s.cpu_ok for s in svc.slots)
            and (self.enforcement == "limit" or svc.group_ok),
            restarts_total=svc.restarts_total,
            replicas=replicas,
            quota_in_force_cores=self.quota_cores(svc),
            entitlement_cores=svc.entitlement_cores,
            oom_kills_total=svc.oom_kills_total,
            memory_max_bytes=svc.spec.memory_max_bytes,
            memory_applied=self.cgroups is not None and all(s.memory_ok for s in svc.slots),
            user=None if who is None else who.name,
            workdir=None if workdir is None else str(workdir),
            refused=self._refused.get(service),
        )

    def statuses(self) -> dict[str, ServiceStatus]:
        return {name: self.status(name) for name in self._services}

    def replica_cgroups(self, service: str) -> list[ReplicaCgroup]:
        return [s.cgroup for s in self._service(service).slots if s.cgroup is not None]

    def service_cgroup(self, service: str) -> ReplicaCgroup | None:
        """Share enforcement: the cgroup that holds the service's replicas, weighted by its
        entitlement (None with limit enforcement, where replicas sit in the parent)."""
        return self._service(service).group

    def cpu_totals(self, service: str) -> CpuTotals:
        """CPU used and time throttled by the service's replicas (cgroup counters, monotonic)."""
        svc = self._service(service)
        if self.cgroups is None:
            return CpuTotals(None, None)
        usage, throttled = svc.retired_usage_s, svc.retired_throttled_s
        for slot in svc.slots:
            if slot.cgroup is None:
                continue
            try:
                u = slot.cgroup.read_usage()
            except OSError:
                continue
            if u.usage_s is None:
                return CpuTotals(None, throttled + u.throttled_s)
            usage += u.usage_s
            throttled += u.throttled_s
        return CpuTotals(usage, throttled)

    def endpoints(self, service: str) -> tuple[str, ...]:
        return self._service(service).published

    async def updates(self) -> AsyncIterator[PoolUpdate]:
        """Every service's ready endpoints first, then each service's whole set when it changes."""
        sub = Subscriber()
        for svc in self._services.values():
            sub.push(PoolUpdate(svc.name, svc.published))
        self._subscribers.append(sub)
        try:
            while not self._closed or sub.pending:
                await sub.wake.wait()
                sub.wake.clear()
                pending, sub.pending = sub.pending, {}
                for update in pending.values():
                    yield update
        finally:
            self._subscribers.remove(sub)

    def _publish(self, svc: ServiceEntry) -> None:
        addresses = tuple(
            s.process.address
            for s in svc.slots
            if s.phase is ReplicaPhase.READY and s.process is not None
        )
        if addresses == svc.published:
            return
        svc.published = addresses
        update = PoolUpdate(svc.name, addresses)
        for sub in self._subscribers:
            sub.push(update)
        # A replica that lent and is no longer ready goes back to its service's quota; a new
        # ready one may lend: the lender re-counts them.
        svc.replica_overlays = {a: q for a, q in svc.replica_overlays.items() if a in addresses}
        self._holdings_changed()

    # ---- reconciliation ----------------------------------------------------------------------

    def _reconcile(self, svc: ServiceEntry) -> None:
        active = [s for s in svc.slots if s.active]
        for _ in range(svc.desired - len(active)):
            self._add_slot(svc)
        if svc.desired > len(active):
            self._holdings_changed()
        if len(active) > svc.desired:
            order = {
                ReplicaPhase.BACKOFF: 0,
                ReplicaPhase.STARTING: 1,
                ReplicaPhase.UNREADY: 2,
                ReplicaPhase.READY: 3,
            }
            # Not-ready replicas go first, then the newest ready ones.
            victims = sorted(
                active,
                key=lambda s: (order.get(s.phase, 0), -svc.slots.index(s)),
            )[: len(active) - svc.desired]
            for slot in victims:
                log.info("%s: retiring %s (%s)", svc.name, slot.name, slot.phase.value)
                slot.retire.set()

    def _add_slot(self, svc: ServiceEntry) -> None:
        name = f"{group_name(svc.name)}-{svc.next_index}"
        svc.next_index += 1
        cgroup = None
        if self.cgroups is not None:
            try:
                if self.enforcement == "share":
                    self._open_group(svc)  # (again, if it failed before)
                    cgroup = self.cgroups.child(name, group_name(svc.name))
                else:
                    cgroup = self.cgroups.child(name)
            except OSError as e:
                log.warning("%s: cannot create cgroup for %s: %s", svc.name, name, e)
        slot = Slot(svc.name, name, cgroup, cpu_ok=cgroup is not None)
        if cgroup is not None:
            self._write_memory(slot, svc)
            # The decided CPU (never a borrower's overlay: a new replica must not add more
            # than its decided quota to what is in force); the lender then re-computes.
            self._write_cpu(slot, svc, min_cap(self.cap_cores(svc), self.quota_cores(svc)))
        svc.slots.append(slot)
        slot.task = asyncio.create_task(self._supervise(svc, slot), name=f"replica {name}")

    async def _supervise(self, svc: ServiceEntry, slot: Slot) -> None:
        failed = False
        try:
            await self._run_slot(svc, slot)
        except asyncio.CancelledError:
            raise
        except Exception:
            failed = True
            log.exception("%s: supervisor of %s failed; replacing it", svc.name, slot.name)
        finally:
            slot.retire.set()
            await asyncio.shield(self._finish_slot(svc, slot))
        if failed and not self._closed:
            asyncio.get_running_loop().call_later(1.0, self._reconcile_if_open, svc)

    def _reconcile_if_open(self, svc: ServiceEntry) -> None:
        if not self._closed and not self._killed:
            self._reconcile(svc)

    def _take_port(self, svc: ServiceEntry) -> int | None:
        start, end = svc.spec.port_range
        for port in range(start, end + 1):
            if port in self._ports_in_use:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((self.host, port))
                except OSError:
                    continue
            self._ports_in_use.add(port)
            return port
        return None

    async def _run_slot(self, svc: ServiceEntry, slot: Slot) -> None:
        loop = asyncio.get_running_loop()
        retire_task = asyncio.create_task(slot.retire.wait())
        try:
            if svc.name in self._refused:  # never started (see _launch_context): wait to retire
                slot.phase = ReplicaPhase.BACKOFF
                await retire_task
                return
            while not slot.retire.is_set():
                unstable = await self._run_once(svc, slot, retire_task, loop)
                if slot.retire.is_set():
                    break
                slot.crashes = slot.crashes + 1 if unstable else 1
                delay = restart_delay_s(
                    slot.crashes, svc.spec.restart_backoff_s, svc.spec.restart_backoff_max_s
                )
                slot.phase = ReplicaPhase.BACKOFF
                log.warning("%s: %s will restart in %.2fs", svc.name, slot.name, delay)
                await asyncio.wait({retire_task}, timeout=delay)
                if not slot.retire.is_set():
                    slot.restarts += 1
                    svc.restarts_total += 1
        finally:
            retire_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await retire_task

    async def _run_once(
        self,
        svc: ServiceEntry,
        slot: Slot,
        retire_task: asyncio.Task[bool],
        loop: asyncio.AbstractEventLoop,
    ) -> bool:
        """Run one process for the slot until it exits or the slot retires.

        Return True when it crashed before running stably (the backoff keeps growing).
        """
        spec = svc.spec
        slot.phase = ReplicaPhase.STARTING
        port = self._take_port(svc)
        if port is None:
            log.warning("%s: no free port in %s for %s", svc.name, spec.port_range, slot.name)
            return True
        who, workdir = self._launch.get(svc.name, (None, None))
        proc = ReplicaProcess(
            svc.name,
            slot.name,
            port,
            spec.command,
            spec.env,
            cgroup=slot.cgroup,
            host=self.host,
            identity=who,
            workdir=workdir,
        )
        slot.process = proc
        try:
            if slot.cgroup is not None:
                with contextlib.suppress(OSError):
                    slot.cgroup.kill_all()
            await proc.start()
        except OSError as e:
            log.warning("%s: cannot start %s: %s", svc.name, slot.name, e)
            self._ports_in_use.discard(port)
            return True
        exit_task = asyncio.create_task(proc.wait())
        ready_since: float | None = None
        failures = 0
        started_at = loop.time()
        try:
            while True:
                probing = slot.phase is not ReplicaPhase.STARTING
                period = spec.readiness.period_s if probing else spec.readiness.startup_period_s
                probe = asyncio.create_task(
                    probe_http(self.host, port, spec.readiness.path, spec.readiness.timeout_s)
                )
                done, _ = await asyncio.wait(
                    {probe, exit_task, retire_task}, return_when=asyncio.FIRST_COMPLETED
                )
                if exit_task in done or retire_task in done:
                    probe.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await probe
                if retire_task in done:
                    return False
                if exit_task in done:
                    break
                ok = probe.result()
                if slot.memory_ok and (spec.memory_max_bytes or spec.memory_high_bytes):
                    # Live: a process of the replica (a worker it forked, or the replica
                    # itself before it is reaped) killed over memory_max is seen within a
                    # probe period, not only when the replica exits (one small file read).
                    self._count_oom_kills(svc, slot, proc.pid)
                if ok:
                    failures = 0
                    if slot.phase is not ReplicaPhase.READY:
                        slot.phase = ReplicaPhase.READY
                        ready_since = loop.time()
                        log.info("%s: %s ready at %s", svc.name, slot.name, proc.address)
                        self._publish(svc)
                else:
                    failures += 1
                    if (
                        slot.phase is ReplicaPhase.READY
                        and failures >= spec.readiness.failure_threshold
                    ):
                        slot.phase = ReplicaPhase.UNREADY
                        log.warning("%s: %s failed %d probes", svc.name, slot.name, failures)
                        self._publish(svc)
                    elif (
                        slot.phase is ReplicaPhase.STARTING
                        and loop.time() - started_at > spec.readiness.startup_timeout_s
                    ):
                        log.warning(
                            "%s: %s not ready after %gs: restarting it",
                            svc.name,
                            slot.name,
                            spec.readiness.startup_timeout_s,
                        )
                        break
                done, _ = await asyncio.wait(
                    {exit_task, retire_task}, timeout=period, return_when=asyncio.FIRST_COMPLETED
                )
                if retire_task in done:
                    return False
                if exit_task in done:
                    break
            # The process exited by itself (or never became ready): a crash.
            stable = ready_since is not None and loop.time() - ready_since >= STABLE_RUN_S
            self._count_oom_kills(svc, slot, proc.pid)
            log.warning(
                "%s: %s (pid %s) exited with %s",
                svc.name,
                slot.name,
                proc.pid,
                proc.returncode if exit_task.done() else "no readiness",
            )
            slot.phase = ReplicaPhase.BACKOFF
            self._publish(svc)
            await proc.stop(0.0 if exit_task.done() else spec.grace_s)
            self._ports_in_use.discard(port)
            slot.process = None
            return not stable
        finally:
            if not exit_task.done():
                exit_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await exit_task

    async def _finish_slot(self, svc: ServiceEntry, slot: Slot) -> None:
        """Withdraw the endpoint, drain, stop the process, account its CPU, remove its cgroup."""
        try:
            await self._retire_slot(svc, slot)
        except Exception:
            log.exception("%s: stopping %s failed; killing what is left", svc.name, slot.name)
            if slot.process is not None:
                slot.process.signal_group(signal.SIGKILL)
            if slot.cgroup is not None:
                with contextlib.suppress(OSError):
                    slot.cgroup.kill_all()
        finally:
            slot.phase = ReplicaPhase.STOPPED
            if slot in svc.slots:
                svc.slots.remove(slot)
                if slot.cgroup is not None:
                    self._holdings_changed()
            self._publish(svc)

    async def _retire_slot(self, svc: ServiceEntry, slot: Slot) -> None:
        proc = slot.process
        was_routable = slot.phase in (ReplicaPhase.READY, ReplicaPhase.UNREADY)
        slot.phase = ReplicaPhase.DRAINING if was_routable else ReplicaPhase.STOPPING
        self._publish(svc)
        drain_s = svc.spec.drain_timeout_s if self._drain_on_close and not self._killed else 0.0
        if proc is not None and was_routable and proc.running and drain_s > 0:
            try:
                async with asyncio.timeout(drain_s):
                    await self._drain(svc.name, proc.address)
            except TimeoutError:
                log.warning(
                    "%s: %s still busy after %gs of draining: stopping it",
                    svc.name,
                    slot.name,
                    drain_s,
                )
            except Exception:
                log.exception("%s: draining %s failed: stopping it", svc.name, slot.name)
        slot.phase = ReplicaPhase.STOPPING
        if proc is not None:
            rc = await proc.stop(svc.spec.grace_s)
            log.info("%s: %s stopped (exit %s)", svc.name, slot.name, rc)
            self._ports_in_use.discard(proc.port)
        if slot.cgroup is not None and self.cgroups is not None:
            await self._remove_cgroup(svc, slot.cgroup)

    async def _remove_cgroup(self, svc: ServiceEntry, cgroup: ReplicaCgroup) -> None:
        assert self.cgroups is not None
        with contextlib.suppress(OSError):
            final = cgroup.read_usage()
            svc.retired_usage_s += final.usage_s or 0.0
            svc.retired_throttled_s += final.throttled_s
        for _ in range(_RMDIR_ATTEMPTS):
            with contextlib.suppress(OSError):
                cgroup.kill_all()
            try:
                if not cgroup.pids():
                    break
            except OSError:
                break
            await asyncio.sleep(_RMDIR_PAUSE_S)
        self.cgroups.discard(cgroup)


__all__ = [
    "STABLE_RUN_S",
    "CpuTotals",
    "Drain",
    "Enforcement",
    "LocalPool",
    "PoolUpdate",
    "ReplicaPhase",
    "ReplicaStatus",
    "ServiceStatus",
    "restart_delay_s",
]
