"""Outlier detection: take endpoints that keep failing out of rotation for a while.

Passive (``services.<name>.outlier_detection``): every finished attempt reports success or
failure for its endpoint.  ``consecutive_failures`` failures in a row (5xx answers or
connect failures) eject the endpoint for ``base_ejection_s × n`` seconds, ``n`` being how
many times it has been ejected (capped at ``max_ejection_s``); it then returns with its
failure count reset.  After a clean ``max_ejection_s`` back in rotation, ``n`` starts over.

Active (optional ``health_check``): a checker GETs ``path`` on every endpoint each
``interval_s``; ``unhealthy_threshold`` failed checks in a row eject it until
``healthy_threshold`` passing checks in a row bring it back.

Never more than ``max_ejection_percent`` of the service's endpoints are ejected at once
(rounded down), and never the last endpoint in rotation: an ejection that would break that
is skipped (counted in ``skipped_total``), the endpoint stays in rotation.  An endpoint the
platform reports ready again after it was not (a restarted replica) is readmitted at once.

State changes are synchronous and take ``now``; the detector applies them through the
endpoint set's ``eject(address, ejected)`` and schedules returns with ``loop.call_at``.
:class:`HealthChecker` is the only part that does I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Sequence
from typing import Protocol

from gateway.settings import HealthCheckConfig, OutlierDetectionConfig

log = logging.getLogger(__name__)


class EndpointView(Protocol):
    address: str
    ejected: bool


class EndpointTable(Protocol):
    """What the detector needs from a service's endpoint set (``gateway.dataplane.endpoints.EndpointSet``)."""

    @property
    def endpoints(self) -> Sequence[EndpointView]: ...

    def eject(self, address: str, ejected: bool = True) -> None: ...


class _Health:
    __slots__ = (
        "check_failures",
        "check_passes",
        "check_unhealthy",
        "consecutive",
        "ejected_until",
        "ejections",
        "returned_at",
        "timer",
    )

    def __init__(self) -> None:
        self.consecutive = 0
        self.ejections = 0
        self.ejected_until: float | None = None
        self.returned_at: float | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.check_failures = 0
        self.check_passes = 0
        self.check_unhealthy = False

    @property
    def ejected(self) -> bool:
        return self.ejected_until is not None or self.check_unhealthy


class OutlierDetector:
    """Passive and active ejection for one service's endpoints."""

    def __init__(
        self,
        service: str,
        config: OutlierDetectionConfig,
        table: EndpointTable,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.service = service
        self.config = config
        self.table = table
        self._loop = loop
        self._health: dict[str, _Health] = {}
        self.ejections_total = 0
        self.skipped_total = 0

    def configure(self, config: OutlierDetectionConfig) -> None:
        self.config = config
        if not config.enabled:
            for address, h in list(self._health.items()):
                if h.ejected:
                    self._return(address, h)

    # -- reports from the data plane (hot path: a dict lookup and an increment) -------------

    def success(self, address: str, now: float) -> None:
        h = self._health.get(address)
        if h is None:
            return
        h.consecutive = 0
        if (
            h.ejections
            and h.returned_at is not None
            and now - h.returned_at >= self.config.max_ejection_s
        ):
            h.ejections = 0

    def failure(self, address: str, now: float) -> bool:
        """An attempt to ``address`` failed; True when this ejected it."""
        h = self._health.get(address)
        if h is None:
            h = self._health[address] = _Health()
        h.consecutive += 1
        config = self.config
        if not config.enabled or h.consecutive < config.consecutive_failures or h.ejected:
            return False
        if not self._may_eject(address):
            self.skipped_total += 1
            h.consecutive = 0
            return False
        h.ejections += 1
        length_s = min(config.base_ejection_s * h.ejections, config.max_ejection_s)
        h.ejected_until = now + length_s
        h.timer = self._loop_now().call_at(
            self._loop_now().time() + length_s, self._expire, address
        )
        self.ejections_total += 1
        self.table.eject(address, True)
        log.warning(
            "%s: ejected endpoint %s for %gs after %d consecutive failures (ejection #%d)",
            self.service,
            address,
            length_s,
            h.consecutive,
            h.ejections,
        )
        return True

    # -- reports from the health checker --------------------------------------------------

    def check_result(self, address: str, ok: bool, check: HealthCheckConfig) -> None:
        h = self._health.get(address)
        if h is None:
            h = self._health[address] = _Health()
        if ok:
            h.check_failures = 0
            h.check_passes += 1
            if h.check_unhealthy and h.check_passes >= check.healthy_threshold:
                h.check_unhealthy = False
                if h.ejected_until is None:
                    self.table.eject(address, False)
                    log.info("%s: endpoint %s passes its health check again", self.service, address)
            return
        h.check_passes = 0
        h.check_failures += 1
        if h.check_unhealthy or h.check_failures < check.unhealthy_threshold:
            return
        if h.ejected_until is not None:
            h.check_unhealthy = True  # already out; stays out until checks pass
            return
        if not self._may_eject(address):
            self.skipped_total += 1
            return
        h.check_unhealthy = True
        self.ejections_total += 1
        self.table.eject(address, True)
        log.warning(
            "%s: ejected endpoint %s after %d failed health checks",
            self.service,
            address,
            h.check_failures,
        )

    # -- internals ------------------------------------------------------------------------

    def _loop_now(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _may_eject(self, address: str) -> bool:
        eps = self.table.endpoints
        known = {ep.address for ep in eps}
        if address not in known:
            return False
        ejected = sum(1 for ep in eps if ep.ejected)
        limit = math.floor(self.config.max_ejection_percent * len(eps) / 100 + 1e-9)
        return ejected + 1 <= limit and ejected + 1 < len(eps)

    def _expire(self, address: str) -> None:
        h = self._health.get(address)
        if h is None or h.ejected_until is None:
            return
        h.timer = None
        h.ejected_until = None
        h.consecutive = 0
        h.returned_at = self._loop_now().time()
        if not h.check_unhealthy:
            self._restore(address)
            log.info("%s: endpoint %s back in rotation", self.service, address)

    def _return(self, address: str, h: _Health) -> None:
        if h.timer is not None:
            h.timer.cancel()
            h.timer = None
        h.ejected_until = None
        h.check_unhealthy = False
        h.consecutive = 0
        self._restore(address)

    def _restore(self, address: str) -> None:
        if any(ep.address == address for ep in self.table.endpoints):
            self.table.eject(address, False)

    def readmit(self, address: str) -> None:
        """The platform saw ``address`` become ready again (a restarted replica): fresher
        evidence than its failures, so a passive ejection ends now — an ejected-but-restarted
        replica must not hold a ``max_ejection_percent`` slot that a dead one needs."""
        h = self._health.get(address)
        if h is None or h.ejected_until is None:
            return
        if h.timer is not None:
            h.timer.cancel()
            h.timer = None
        h.ejected_until = None
        h.consecutive = 0
        h.returned_at = self._loop_now().time()
        if not h.check_unhealthy:
            self._restore(address)
            log.info("%s: endpoint %s is ready again: back in rotation", self.service, address)

    def forget(self, address: str) -> None:
        """``address`` left the service: drop its state and timer."""
        h = self._health.pop(address, None)
        if h is not None and h.timer is not None:
            h.timer.cancel()

    def is_ejected(self, address: str) -> bool:
        h = self._health.get(address)
        return h is not None and h.ejected

    def close(self) -> None:
        for h in self._health.values():
            if h.timer is not None:
                h.timer.cancel()
                h.timer = None

    def __repr__(self) -> str:
        out = sum(1 for h in self._health.values() if h.ejected)
        return f"OutlierDetector({self.service}, {out} ejected, {self.ejections_total} ejections)"


async def check_once(host: str, port: int, check: HealthCheckConfig, host_header: str) -> bool:
    """One active health check: ``GET path`` answered 2xx/3xx within ``timeout_s``."""
    request = (
        f"GET {check.path} HTTP/1.1\r\nHost: {host_header}\r\nUser-Agent: sluice-health-check\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    writer = None
    try:
        async with asyncio.timeout(check.timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(request)
            await writer.drain()
            status_line = await reader.readline()
    except (OSError, TimeoutError):
        return False
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    parts = status_line.split(None, 2)
    return len(parts) >= 2 and parts[0].startswith(b"HTTP/1.") and parts[1][:1] in (b"2", b"3")


class HealthChecker:
    """Runs the active checks of one service every ``interval_s`` (a supervised task)."""

    def __init__(self, detector: OutlierDetector) -> None:
        self.detector = detector
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"health-check:{self.detector.service}"
            )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def check_all(self) -> None:
        check = self.detector.config.health_check
        if check is None or not self.detector.config.enabled:
            return
        eps = list(self.detector.table.endpoints)
        results = await asyncio.gather(
            *(check_once(*_split(ep.address), check, ep.address) for ep in eps)
        )
        for ep, ok in zip(eps, results, strict=True):
            self.detector.check_result(ep.address, ok, check)

    async def _run(self) -> None:
        while True:
            check = self.detector.config.health_check
            interval_s = check.interval_s if check is not None else 1.0
            try:
                await self.check_all()
            except Exception:  # a supervised loop: log and keep checking
                log.exception("%s: health check round failed", self.detector.service)
            await asyncio.sleep(interval_s)


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)
