"""Leader election with a ``coordination.k8s.io/v1`` Lease: only the holder actuates.

The rules are client-go's ``leaderelection``:

* a candidate reads the Lease; none -> it creates one holding it (``leaseTransitions`` 0);
* whenever the Lease record it reads differs from the last one it observed, it notes the
  *local* time of that observation (clocks of different machines are never compared);
* someone else's Lease is respected until ``lease_duration_s`` has passed on the local clock
  since the record last changed; after that (or when the holder is empty) it may be taken,
  bumping ``leaseTransitions``; the holder renews by writing a new ``renewTime``;
* every write is an update with the read ``resourceVersion``, so of two racing candidates one
  gets 409 Conflict and stays a follower;
* the leader stops leading at once when it sees another holder, and when it has not renewed
  successfully for ``renew_deadline_s`` (< ``lease_duration_s``), so it stops before anyone
  else may start.

Time is injected: ``clock`` (monotonic seconds, default the event loop's) for every duration;
``wall_clock`` only for the timestamps written into the Lease.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

from gateway.platforms.kubernetes.api import KubeApi
from gateway.platforms.kubernetes.model import Conflict, KubeError, Lease

log = logging.getLogger(__name__)
_Record = tuple[str | None, datetime | None, datetime | None, int | None, int]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class LeaderElector:
    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration_s: int = 15,
        renew_deadline_s: float = 10.0,
        retry_period_s: float = 2.0,
        clock: Callable[[], float] | None = None,
        wall_clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        if not 0 < retry_period_s < renew_deadline_s < lease_duration_s:
            raise ValueError(
                "need 0 < retry_period_s < renew_deadline_s < lease_duration_s, got "
                f"{retry_period_s} / {renew_deadline_s} / {lease_duration_s}"
            )
        if not identity:
            raise ValueError("identity must not be empty")
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._observed: _Record | None = None
        """The Lease's (holder, renew, acquire, duration, transitions) as last seen changing."""
        self._observed_at = 0.0
        self._holding = False
        self._last: Lease | None = None
        """The Lease as we last wrote it (the renewal fast path)."""
        self._renewed_at = float("-inf")
        self.transitions_seen = 0
        self.last_error: str | None = None

    def __repr__(self) -> str:
        return (
            f"LeaderElector({self.namespace}/{self.name}, identity={self.identity!r}, "
            f"leader={self.is_leader()}, last_error={self.last_error!r})"
        )

    def now(self) -> float:
        return self._clock() if self._clock else asyncio.get_running_loop().time()

    def is_leader(self) -> bool:
        """True only while holding the Lease with a renewal younger than ``renew_deadline_s``."""
        return self._holding and self.now() - self._renewed_at < self.renew_deadline_s

    def holder(self) -> str | None:
        """Who leads as this candidate last saw the Lease: itself while it leads, else the
        holder while the record it last saw change is younger than the Lease's duration; None
        when nobody (known) does."""
        if self.is_leader():
            return self.identity
        if self._observed is None:
            return None
        holder, _, _, duration, _ = self._observed
        if not holder or holder == self.identity:
            return None
        if self.now() >= self._observed_at + (duration or self.lease_duration_s):
            return None
        return str(holder)

    def _lose(self, why: str) -> None:
        if self._holding:
            log.warning(
                "leader election %s/%s: %s lost leadership: %s",
                self.namespace,
                self.name,
                self.identity,
                why,
            )
        self._holding = False

    async def try_acquire_or_renew(self) -> bool:
        """One round; returns whether this candidate leads afterwards."""
        now = self.now()
        if self._holding and now - self._renewed_at >= self.renew_deadline_s:
            self._lose(f"no successful renewal for {self.renew_deadline_s:g}s")
        wall = self._wall_clock()
        mine_last = self._last if self._holding else None
        if mine_last is not None:
            # fast path (as client-go): renew the Lease we wrote last, one request; a Conflict
            # (someone else wrote it) falls through to a read
            try:
                renewed = await self.api.update_lease(replace(mine_last, renew_time=wall))
            except Conflict:
                pass
            except KubeError as e:
                self.last_error = str(e)
                log.info("leader election %s/%s: %s", self.namespace, self.name, e)
                return self.is_leader()
            else:
                self._won(renewed, now)
                return True
        try:
            current = await self.api.get_lease(self.namespace, self.name)
            if current is None:
                created = await self.api.create_lease(
                    Lease(
                        self.namespace,
                        self.name,
                        self.identity,
                        self.lease_duration_s,
                        wall,
                        wall,
                        0,
                    )
                )
                self._won(created, now)
                return True
            record = (
                current.holder_identity,
                current.renew_time,
                current.acquire_time,
                current.lease_duration_s,
                current.lease_transitions,
            )
            if record != self._observed:
                self._observed, self._observed_at = record, now
            holder = current.holder_identity
            duration = current.lease_duration_s or self.lease_duration_s
            if holder and holder != self.identity and now < self._observed_at + duration:
                self._lose(f"{holder} holds the lease")
                return False
            mine = holder == self.identity
            updated = await self.api.update_lease(
                Lease(
                    self.namespace,
                    self.name,
                    self.identity,
                    self.lease_duration_s,
                    current.acquire_time if mine and current.acquire_time else wall,
                    wall,
                    current.lease_transitions if mine else current.lease_transitions + 1,
                    current.resource_version,
                )
            )
        except KubeError as e:
            self.last_error = str(e)
            log.info("leader election %s/%s: %s", self.namespace, self.name, e)
            return self.is_leader()
        self._won(updated, now)
        return True

    def _won(self, lease: Lease, now: float) -> None:
        self._last = lease
        if not self._holding:
            log.info(
                "leader election %s/%s: %s is the leader (transitions %d)",
                self.namespace,
                self.name,
                self.identity,
                lease.lease_transitions,
            )
        self._holding = True
        self._renewed_at = now
        self.transitions_seen = lease.lease_transitions
        self._observed = (
            lease.holder_identity,
            lease.renew_time,
            lease.acquire_time,
            lease.lease_duration_s,
            lease.lease_transitions,
        )
        self._observed_at = now
        self.last_error = None

    async def run(self) -> None:
        """Acquire and renew every ``retry_period_s`` until cancelled; then release the Lease."""
        try:
            while True:
                await self.try_acquire_or_renew()
                await asyncio.sleep(self.retry_period_s)
        finally:
            if self._holding:
                await asyncio.shield(self.release())

    async def release(self) -> None:
        """Give the Lease up (empty holder, 1 s duration) so a follower takes over at once."""
        if not self.is_leader():
            self._holding = False
            return
        self._holding = False
        try:
            current = await self.api.get_lease(self.namespace, self.name)
            if current is None or current.holder_identity != self.identity:
                return
            wall = self._wall_clock()
            await self.api.update_lease(
                Lease(
                    self.namespace,
                    self.name,
                    None,
                    1,
                    wall,
                    wall,
                    current.lease_transitions,
                    current.resource_version,
                )
            )
        except KubeError as e:
            log.warning("leader election %s/%s: release failed: %s", self.namespace, self.name, e)
