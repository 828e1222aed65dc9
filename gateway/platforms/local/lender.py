"""Lending idle quota between ticks on the local pool (``budget.enforcement: limit``).

:class:`QuotaLender` is the state machine around the rule :func:`scaler.lending.lend`:

* the gateway tells it when a service becomes busy or idle (``set_busy``; its admission's
  slots taken + queued leave or return to 0), and when one of its ready replicas does
  (``set_replica_busy``; the endpoint's requests in flight leave or return to 0);
* a service idle for ``hold_s`` (``budget.lend_after_idle_s``) is *marked idle* (one timer per
  service at most, from the event loop: ``loop.call_later``) and the overlay is applied: its
  replicas keep its floor (spread over them, at least ``keep_cores`` =
  ``budget.lend_keep_cores`` each: :func:`~scaler.lending.idle_floor`) and the busy services' rise, each replica up to
  ``cpu.max`` (and the budget);
* so is a ready replica idle for ``hold_s`` (one timer per replica at most): it keeps its
  share of its service's floor and lends the rest, to its busy siblings and to the other
  services' busy replicas alike (a replica still starting is not routed to: it never lends);
* a request for a service marked idle, or sent to a replica marked idle, unmarks it and
  re-applies at once, synchronously, before the request goes on: the owner has its decided
  quota back, the borrowers shrink, nothing is stopped;
* every change of the decided CPU or of the replicas (the pool's ``on_holdings_change``)
  re-applies the overlay on top of the new decisions.

The pool writes the quotas, the shrinking ones first, so the quotas in force never add up to
more than the decided ones (:func:`lend` never hands out more than the idle services hold).
The decided CPU is untouched: the pool still reports it as decided; the overlay is only what
is in force in the cgroups.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from scaler.lending import Holding, idle_floor, kept, lend
from scaler.policy import ScalingPolicy

log = logging.getLogger(__name__)


class QuotaPool(Protocol):
    """What the lender needs of :class:`~gateway.platforms.local.pool.LocalPool`."""

    on_holdings_change: Callable[[], None] | None
    total_cpu_cores: float | None

    @property
    def services(self) -> list[str]: ...

    def cpu_holding(self, service: str) -> tuple[int, float | None]: ...

    def set_quota_overlays(
        self,
        overlays: Mapping[str, float | None],
        replicas: Mapping[str, Mapping[str, float]] | None = None,
    ) -> None: ...

    def serving_addresses(self, service: str) -> tuple[str, ...]: ...


class QuotaLender:
    """Marks services idle after ``hold_s`` and keeps the pool's quota overlays true.

    ``policies``: the services' scaling policies (``cpu.max`` is a borrowing replica's ceiling, ``weight`` its share of what is lent).  Every
    service starts busy: it is marked idle only after the gateway has seen it idle.  Timers
    and time come from ``loop`` (tests step its clock).  ``keep_cores``: the least each
    replica of an idle service keeps (never more than its decided CPU; the service keeps its
    floor over its replicas).
    """

    def __init__(
        self,
        pool: QuotaPool,
        policies: Mapping[str, ScalingPolicy],
        hold_s: float,
        loop: asyncio.AbstractEventLoop,
        keep_cores: float = 0.01,
        *,
        replicas: bool = False,
    ) -> None:
        if hold_s < 0:
            raise ValueError(f"hold_s must be >= 0, got {hold_s!r}")
        self.pool = pool
        self.policies = {n: p for n, p in policies.items() if n in pool.services}
        self.hold_s = hold_s
        self.keep_cores = keep_cores
        """What each replica of an idle service keeps (``budget.lend_keep_cores``)."""
        self.replicas = replicas
        """Idle ready replicas of a busy service lend too (``budget.lend_replicas``)."""
        self._loop = loop
        self._busy = dict.fromkeys(self.policies, True)
        self._idle_since = dict.fromkeys(self.policies, 0.0)
        self._timer_armed = dict.fromkeys(self.policies, False)
        self.idle: set[str] = set()
        """Services marked idle: their quota above their idle floor is lent."""
        self.idle_replicas: dict[str, set[str]] = {name: set() for name in self.policies}
        """Per service, the addresses of its ready replicas marked idle (they lend too)."""
        self._seen: dict[str, set[str]] = {name: set() for name in self.policies}
        """Per service, the ready replicas' addresses the lender knows of."""
        self._quiet_since: dict[tuple[str, str], float] = {}
        """(service, address) -> since when that replica has had nothing in flight."""
        self._replica_armed: set[tuple[str, str]] = set()
        self._idle_counts: dict[str, int] = {}
        self.quotas: dict[str, float] = {}
        """The quota per replica in force under the latest overlay (services with a decision)."""
        self.applies = 0
        """How many times the overlay was re-computed (for tests and operators)."""

    def __repr__(self) -> str:
        idle = ", ".join(sorted(self.idle)) or "none"
        return f"QuotaLender(idle: {idle}; hold {self.hold_s:g}s; {self.applies} applies)"

    def start(self) -> None:
        """Take over the pool's overlays (re-computed on every decision from now on)."""
        self.pool.on_holdings_change = self.apply
        self._track_replicas()

    def stop(self) -> None:
        """Stop lending: every quota back to the decided CPU (pending timers do nothing)."""
        if self.pool.on_holdings_change == self.apply:
            self.pool.on_holdings_change = None
        self.idle.clear()
        for name in self._busy:
            self._busy[name] = True
        self._forget_replicas()
        self.pool.set_quota_overlays(dict.fromkeys(self.policies), {})
        self.quotas = {}

    def _forget_replicas(self) -> None:
        for name in self.policies:
            self.idle_replicas[name].clear()
            self._seen[name].clear()
        self._quiet_since.clear()
        self._idle_counts = {}

    # -- the gateway's admission hook -------------------------------------------------------

    def set_busy(self, service: str, busy: bool) -> None:
        """``service`` has a request in flight or queued (True) or none any more (False)."""
        if service not in self._busy or self._busy[service] == busy:
            return
        self._busy[service] = busy
        if busy:
            if service in self.idle:
                # Reclaim: synchronously, before the request goes on -- every replica's: the
                # ones the request does not go to lend again after the hold.
                self.idle.discard(service)
                idle = self.idle_replicas[service]
                for address in idle:
                    self._replica_quiet((service, address))
                idle.clear()
                self._apply_guarded()
            return
        self._idle_since[service] = self._loop.time()
        if not self._timer_armed[service]:
            self._timer_armed[service] = True
            self._loop.call_later(self.hold_s, self._check_idle, service)

    def set_replica_busy(
        self, service: str, address: str, busy: bool, held: bool = False, /
    ) -> None:
        """The ready replica of ``service`` at ``address`` has a request in flight (True, called
        before the request is sent) or none any more (False; ``held``: for the hold already,
        as the worker processes report it: marked idle at once)."""
        if not self.replicas or service not in self.policies:
            return
        if self.pool.on_holdings_change is None:
            return
        key = (service, address)
        self._seen[service].add(address)
        if busy:
            self._quiet_since.pop(key, None)
            idle = self.idle_replicas[service]
            if address in idle:
                idle.discard(address)  # reclaim: synchronously, before the request goes on
                if service not in self.idle:
                    self._apply_guarded()
            return
        if held:
            self._quiet_since[key] = self._loop.time() - self.hold_s
            self._check_replica(key)
            return
        self._replica_quiet(key)

    def _replica_quiet(self, key: tuple[str, str]) -> None:
        self._quiet_since[key] = self._loop.time()
        if key not in self._replica_armed:
            self._replica_armed.add(key)
            self._loop.call_later(self.hold_s, self._check_replica, key)

    def _check_replica(self, key: tuple[str, str]) -> None:
        """The hold may be over: mark the replica idle if it has stayed idle and ready."""
        self._replica_armed.discard(key)
        since = self._quiet_since.get(key)
        service, address = key
        if since is None or self.pool.on_holdings_change is None:
            return
        if address in self.idle_replicas[service]:
            return
        left_s = since + self.hold_s - self._loop.time()
        if left_s > 1e-9:
            self._replica_armed.add(key)
            self._loop.call_later(left_s, self._check_replica, key)
            return
        if address not in self.pool.serving_addresses(service):
            self._quiet_since.pop(key, None)
            return
        self.idle_replicas[service].add(address)
        if service not in self.idle:
            self._apply_guarded()

    def _check_idle(self, service: str) -> None:
        """The hold may be over: mark ``service`` idle if it has stayed idle all along."""
        self._timer_armed[service] = False
        if self._busy[service] or service in self.idle or self.pool.on_holdings_change is None:
            return
        left_s = self._idle_since[service] + self.hold_s - self._loop.time()
        if left_s > 1e-9:
            # Busy again and idle again since the timer was set: wait for the rest.
            self._timer_armed[service] = True
            self._loop.call_later(left_s, self._check_idle, service)
            return
        self.idle.add(service)
        self._apply_guarded()

    def _apply_guarded(self) -> None:
        """:meth:`apply` from the data plane or a timer: a failure is logged and every quota
        goes back to the decided CPU (a request is never failed by lending)."""
        try:
            self.apply()
        except Exception:
            log.exception("lending between ticks failed: quotas back to the decided CPU")
            self.idle.clear()
            self._forget_replicas()
            self.quotas = {}
            self.pool.set_quota_overlays(dict.fromkeys(self.policies), {})

    # -- the overlay ------------------------------------------------------------------------

    def holdings(self) -> dict[str, Holding]:
        """What every service with a decided CPU holds now, for :func:`lend`."""
        budget = self.pool.total_cpu_cores
        out = {}
        for name, policy in self.policies.items():
            replicas, cores = self.pool.cpu_holding(name)
            if cores is None:
                continue
            ceiling = policy.cpu.max if budget is None else min(policy.cpu.max, budget)
            out[name] = Holding(
                replicas=replicas,
                cores=cores,
                floor=idle_floor(replicas, policy.floor_cores, self.keep_cores),
                ceiling=max(ceiling, cores),
                weight=policy.weight,
            )
        return out

    def apply(self) -> None:
        """Re-compute the quotas in force from the decided CPU and the idle marks; hand the
        differences from the decided CPU to the pool as overlays (it writes the changes)."""
        self.applies += 1
        holdings = self.holdings()
        self._track_replicas()
        counts = {
            name: h.replicas if name in self.idle else len(self.idle_replicas[name])
            for name, h in holdings.items()
        }
        quotas = lend(holdings, counts)
        self.quotas = quotas
        self._idle_counts = counts
        overlays: dict[str, float | None] = dict.fromkeys(self.policies)
        replicas: dict[str, dict[str, float]] = {}
        for name, quota in quotas.items():
            h = holdings[name]
            if abs(quota - h.cores) > 1e-9:
                overlays[name] = quota
            idle = self.idle_replicas[name]
            if name not in self.idle and idle and 0 < counts[name] < h.replicas:
                keep = kept(h)
                if abs(keep - (overlays[name] or h.cores)) > 1e-9:
                    replicas[name] = dict.fromkeys(idle, keep)
        self.pool.set_quota_overlays(overlays, replicas)

    def _track_replicas(self) -> None:
        """Forget replicas no longer ready; a newly ready one that has had no request yet is
        quiet from now (it lends after the hold if none comes)."""
        if not self.replicas:
            return
        for name in self.policies:
            serving = set(self.pool.serving_addresses(name))
            seen = self._seen[name]
            for address in seen - serving:
                self._quiet_since.pop((name, address), None)
            seen &= serving
            self.idle_replicas[name] &= serving
            for address in serving - seen:
                seen.add(address)
                self._replica_quiet((name, address))

    def lent_cores(self) -> dict[str, float]:
        """Per service: cores in force minus decided (negative: lent out; positive: borrowed)."""
        holdings = self.holdings()
        out = {}
        for name, h in holdings.items():
            idle = min(self._idle_counts.get(name, 0), h.replicas)
            quota = self.quotas.get(name, h.cores)
            in_force = (h.replicas - idle) * quota + idle * (
                kept(h) if idle < h.replicas else quota
            )
            out[name] = round(in_force - h.replicas * h.cores, 6)
        return out


__all__ = ["QuotaLender", "QuotaPool"]
