"""The local pool's state, as plain data: phases, statuses, updates, and per-slot bookkeeping.

The public types (:class:`ReplicaPhase`, :class:`PoolUpdate`, :class:`ReplicaStatus`,
:class:`ServiceStatus`, :class:`CpuTotals`) are what :class:`~gateway.platforms.local.pool.LocalPool`
reports; the private ones are what it keeps per service and per replica slot.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

from gateway.platforms.local.cgroups import ReplicaCgroup
from gateway.platforms.local.config import ReplicasConfig
from gateway.platforms.local.replicas import ReplicaProcess


def restart_delay_s(crashes: int, base_s: float, max_s: float) -> float:
    """Delay before restarting after the ``crashes``-th crash in a row: doubling, capped."""
    if crashes < 1:
        return 0.0
    return float(min(base_s * 2 ** min(crashes - 1, 64), max_s))


class ReplicaPhase(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    UNREADY = "unready"
    """Was ready; now failing its probe: running, but gets no new requests."""
    BACKOFF = "backoff"
    """Crashed (or could not start); waiting before the next start."""
    DRAINING = "draining"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class PoolUpdate:
    """The routable (ready) endpoints of one service, whole."""

    service: str
    addresses: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    name: str
    phase: ReplicaPhase
    address: str | None
    pid: int | None
    restarts: int
    oom_kills: int = 0
    """Times the kernel killed this replica's processes for exceeding ``memory_max``."""


@dataclass(frozen=True, slots=True)
class ServiceStatus:
    """What the pool has for one service right now (plain data)."""

    service: str
    desired: int
    ready: int
    cpu_per_replica_cores: float | None
    """The decided CPU per replica (None = none decided): a hard limit in ``limit``
    enforcement; in ``share`` enforcement reported only (the weight is the service's
    entitlement, ``entitlement_cores``)."""
    cpu_cap_per_replica_cores: float | None
    """The hard cap per replica in force (cgroup quota): the decided CPU in ``limit``
    enforcement, the service's ``cpu.max`` in ``share`` enforcement; never above the budget;
    None = unlimited."""
    enforcement: str
    """``share`` or ``limit`` (see :class:`~gateway.platforms.local.pool.LocalPool`)."""
    cpu_applied: bool
    """False when cgroups are unavailable: the CPU figure is decided, not enforced."""
    restarts_total: int
    replicas: tuple[ReplicaStatus, ...]
    quota_in_force_cores: float | None = None
    """The quota per replica written to the cgroups now: ``cpu_cap_per_replica_cores``, or
    while CPU is lent between ticks (``limit`` enforcement, ``budget.lending``) the lender's
    overlay: ``cpu.min`` for an idle service, more than decided for a borrower."""
    entitlement_cores: float | None = None
    """The service's entitlement (its fair share of the budget): in ``share`` enforcement
    the weight of the cgroup that holds its replicas; None = never set (default weight)."""
    oom_kills_total: int = 0
    """OOM kills of this service's replicas since Sluice started."""
    memory_max_bytes: int | None = None
    """The memory limit per replica (``replicas.memory_max``); None = unlimited."""
    memory_applied: bool = False
    """The memory limit is written to every replica's cgroup (False without one)."""
    user: str | None = None
    """The user the replicas run as (None: Sluice's own user)."""
    workdir: str | None = None
    refused: str | None = None
    """Why no replica of the service is started (it would run as root without
    ``replicas.user: root``); None when they start."""


@dataclass(frozen=True, slots=True)
class CpuTotals:
    """Cumulative CPU of a service's replicas, past and present (monotonic)."""

    usage_s: float | None
    throttled_s: float | None


@dataclass(eq=False)
class Slot:
    """One desired replica (pool-internal): the process running for it now, its cgroup,
    its crash count; ``retire`` is set when the slot is to be stopped."""

    service: str
    name: str
    cgroup: ReplicaCgroup | None
    phase: ReplicaPhase = ReplicaPhase.STARTING
    process: ReplicaProcess | None = None
    crashes: int = 0
    restarts: int = 0
    cpu_ok: bool = True
    """The last CPU limit was written to this replica's cgroup."""
    quota_cores: float | None = None
    """The quota last written to this replica's cgroup (None = unlimited or not written)."""
    quota_written: bool = False
    memory_ok: bool = False
    """The memory limits were written to this replica's cgroup."""
    oom_kills: int = 0
    oom_seen: int = 0
    """The cgroup's OOM-kill counter when last read (it counts across restarts)."""
    retire: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    @property
    def active(self) -> bool:
        """Counts toward the desired replicas (not on its way out)."""
        return not self.retire.is_set()


class ServiceEntry:
    """What the pool keeps per service (pool-internal)."""

    def __init__(self, name: str, spec: ReplicasConfig, cpu_cores: float | None) -> None:
        self.name = name
        self.spec = spec
        self.desired = 0
        self.cpu_cores = cpu_cores
        self.cpu_cap_cores: float | None = None
        """Share enforcement: the hard cap per replica (``scaling.cpu.max``); None = budget."""
        self.entitlement_cores: float | None = None
        """Share enforcement: the service's fair share of the budget, its cgroup's weight
        (None = never set: the kernel's default weight)."""
        self.group: ReplicaCgroup | None = None
        """Share enforcement: the service's cgroup, which holds its replicas' cgroups."""
        self.group_ok = False
        """The entitlement was written to ``group``."""
        self.quota_overlay: float | None = None
        """Limit enforcement with lending: the quota per replica in force instead of
        ``cpu_cores`` (None = the decided CPU)."""
        self.replica_overlays: dict[str, float] = {}
        """Limit enforcement with lending: per replica address, the quota in force of a ready
        replica that lends (idle), instead of ``quota_overlay``."""
        self.slots: list[Slot] = []
        self.next_index = 0
        self.restarts_total = 0
        self.oom_kills_total = 0
        self.memory_warned = False
        self.retired_usage_s = 0.0
        self.retired_throttled_s = 0.0
        self.published: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"ServiceEntry({self.name}, desired={self.desired}, slots={len(self.slots)})"


class Subscriber:
    """One reader of ``LocalPool.updates()``: the latest update per service, coalesced."""

    def __init__(self) -> None:
        self.pending: dict[str, PoolUpdate] = {}
        self.wake = asyncio.Event()

    def push(self, update: PoolUpdate) -> None:
        self.pending[update.service] = update
        self.wake.set()
