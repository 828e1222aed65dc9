"""The scaler loop: every tick, signals -> ``Engine.tick`` -> actuator (the scaler's async edge).

``ScalerLoop`` owns no policy logic.  It reads the time from an injected clock (default: the
running event loop's ``time()``), asks a signals provider for the latest snapshots, asks the
actuator what is in force, calls the pure engine, hands the decisions to the actuator and
keeps the recent ones for the admin API.  It is supervised: an exception in a tick is logged
and counted, and the loop carries on at the next tick.

Regular ticks keep to a fixed grid (every ``interval_s``).  ``wake()`` asks for an **early
tick** in between: at once, or ``early_tick_gap_s`` after the previous tick if that was more
recent (the rate limit on wakes).  The data plane wakes the loop when a request is waiting
for a service at 0 replicas (scale from zero) or when a service's concurrency reaches its
latest decision's ``wake_concurrency`` (a burst the decision cannot absorb): a burst then
gets its CPU within milliseconds, not up to a tick later.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from scaler.actuators import Actuator
from scaler.decision import Decision, ServiceState
from scaler.signals import ServiceSignals

log = logging.getLogger(__name__)

SignalsProvider = Callable[
    [], Mapping[str, ServiceSignals] | Awaitable[Mapping[str, ServiceSignals]]
]
Clock = Callable[[], float]
Waiter = Callable[[asyncio.Event, float], Awaitable[None]]
"""Waits until the event is set or the timeout passes (injected so tests need no real sleep)."""


class TickEngine(Protocol):
    """What the loop calls: ``scaler.engine.Engine``, or a wrapper around it (tracing)."""

    def tick(
        self,
        now: float,
        signals: Mapping[str, ServiceSignals],
        states: Mapping[str, ServiceState],
    ) -> dict[str, Decision]: ...


LOG_LINE_CHARS = 200
"""A changed decision's INFO line keeps its reasons to about this many characters (the
whole explanation: ``GET /api/decisions``, or every tick at DEBUG)."""


def short_reason(decision: Decision) -> str:
    """The reasons that say why (not the input recap), cut to :data:`LOG_LINE_CHARS`."""
    recaps = ("kpa.windows", "hpa.inputs")
    parts = decision.explanation.parts
    reasons = decision.reasons
    kept = [
        reason
        for part, reason in zip(parts, reasons, strict=False)
        if getattr(part, "kind", None) not in recaps
    ] or list(reasons)
    text = "; ".join(kept)
    if len(text) > LOG_LINE_CHARS:
        text = text[: LOG_LINE_CHARS - 1].rstrip() + "…"
    return text


def _fields(decision: Decision) -> dict[str, object]:
    return {
        "service": decision.service,
        "replicas": decision.replicas,
        "cpu_per_replica_cores": round(decision.cpu_per_replica_cores, 4),
        "rule": decision.rule,
    }


async def wait_event(event: asyncio.Event, timeout_s: float) -> None:
    """The default waiter: the event loop's own timer."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout=timeout_s)


class ScalerLoop:
    """Runs ``engine`` every ``interval_s`` seconds (or at once when woken)."""

    def __init__(
        self,
        engine: TickEngine,
        signals: SignalsProvider,
        actuator: Actuator,
        *,
        interval_s: float = 1.0,
        clock: Clock | None = None,
        history: int = 256,
        on_decisions: Callable[[Mapping[str, Decision]], None] | None = None,
        wait: Waiter = wait_event,
        early_tick_gap_s: float = 0.1,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        if early_tick_gap_s <= 0:
            raise ValueError(f"early_tick_gap_s must be > 0, got {early_tick_gap_s!r}")
        self.engine = engine
        self.interval_s = interval_s
        self.early_tick_gap_s = early_tick_gap_s
        self._signals = signals
        self._actuator = actuator
        self._clock = clock
        self.on_decisions = on_decisions
        self._wait = wait
        self._wake = asyncio.Event()
        self._never = asyncio.Event()
        self.ticks = 0
        self.early_ticks = 0
        """Ticks run between the regular ones because of :meth:`wake`."""
        self.wakes: dict[str, int] = {}
        """Calls to :meth:`wake` by reason (several may fold into one early tick)."""
        self.errors = 0
        self.last: dict[str, Decision] = {}
        """The latest decision per service."""
        self.recent: deque[Decision] = deque(maxlen=history)
        """Recent decisions that changed something, newest last."""

    def __repr__(self) -> str:
        return (
            f"ScalerLoop(interval_s={self.interval_s:g}, ticks={self.ticks}, errors={self.errors})"
        )

    def now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def wake(self, reason: str = "early") -> None:
        """Tick early: now, or ``early_tick_gap_s`` after the previous tick.  ``reason`` is
        counted in :attr:`wakes` (the gateway's: ``early``, a burst reached the level the last
        tick armed; ``held``, a request is held at zero here; ``peer``, another gateway replica
        holds one)."""
        self.wakes[reason] = self.wakes.get(reason, 0) + 1
        self._wake.set()

    async def tick(self) -> dict[str, Decision]:
        """One evaluation: read signals and state, decide, apply.  Raises what they raise."""
        provided = self._signals()
        snapshot = await provided if inspect.isawaitable(provided) else provided
        states = await self._actuator.current()
        decisions = self.engine.tick(self.now(), snapshot, states)
        await self._actuator.apply(decisions)
        for name, decision in decisions.items():
            before = self.last.get(name)
            if (
                before is None
                or before.replicas != decision.replicas
                or abs(before.cpu_per_replica_cores - decision.cpu_per_replica_cores) > 1e-9
                or before.rule != decision.rule
            ):
                self.recent.append(decision)
                log.info(
                    "scaler decision %s: %s",
                    decision.summary(),
                    short_reason(decision),
                    extra=_fields(decision),
                )
            elif log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "scaler tick %s: %s",
                    decision.summary(),
                    "; ".join(decision.reasons),
                    extra=_fields(decision),
                )
        self.last = decisions
        self.ticks += 1
        if self.on_decisions is not None:
            self.on_decisions(decisions)
        return decisions

    async def run(self, max_ticks: int | None = None) -> None:
        """Tick forever (or ``max_ticks`` times); cancel the task to stop."""
        done = 0
        next_at = self.now()  # the first regular tick: at once
        last_at = -math.inf
        while max_ticks is None or done < max_ticks:
            now = self.now()
            if now < next_at and not self._wake.is_set():
                await self._wait(self._wake, next_at - now)
                now = self.now()
            early = now < next_at
            if early and now < last_at + self.early_tick_gap_s:
                # woken too soon after the previous tick: wait out the gap (more wakes
                # meanwhile are folded into this one)
                await self._wait(self._never, min(last_at + self.early_tick_gap_s, next_at) - now)
                now = self.now()
                early = now < next_at
            self._wake.clear()
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.errors += 1
                log.exception("scaler tick failed; carrying on at the next tick")
            last_at = now
            if early:
                self.early_ticks += 1
            else:
                next_at += self.interval_s
                if next_at <= self.now():  # a tick (or the machine) ran late: skip, don't burst
                    next_at = self.now() + self.interval_s
            done += 1
