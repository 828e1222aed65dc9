"""Signals merged across gateway replicas: every replica sees only its share of the traffic.

``PeerSignals.collect(now)`` asks each peer's admin server for ``GET /api/signals`` (shape in
:mod:`scaler.signals_json`) in parallel with one timeout, and merges the answers with
:class:`SignalMerger`:

* in flight, queued and rps are summed over the peers that answered;
* ``*_total`` counters stay monotonic: each peer's increase since its last answer is added
  (a peer that restarted, whose counter went down, contributes its new value); a peer that does
  not answer adds nothing this tick, and its past contribution is kept.  The concurrency
  integral (``concurrency_seconds_total``) too, except that a peer's first answer adds nothing
  (its integral since it started is not time since the last tick), and it is merged only when
  every peer that answered for the service keeps one;
* latency percentiles and ready replicas take the largest value (conservative);
* the merged snapshot's ``at`` is ``now`` on the caller's clock (peers' clocks differ).

Some peers not answering is tolerated; when none answers, ``collect`` returns no signals at
all, so the engine freezes every service (never scales down on missing data).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from scaler.signals import ServiceSignals
from scaler.signals_json import SignalsFormatError, signals_from_json

log = logging.getLogger(__name__)
_COUNTERS = ("arrivals_total", "completions_total", "errors_total")
_AREA = "concurrency_seconds_total"


@dataclass(frozen=True, slots=True)
class PeerReport:
    answered: tuple[str, ...]
    failed: Mapping[str, str] = field(default_factory=dict)
    """peer -> why it gave nothing usable."""


def merged_metrics(snaps: Sequence[ServiceSignals]) -> dict[str, Any]:
    """``scaling.metrics`` figures across gateway replicas: each app metric's largest value
    (every replica of the gateway sees every replica of the service), and the latency
    histograms added up (when they share their bounds)."""
    out: dict[str, Any] = {}
    app: dict[str, float] = {}
    for s in snaps:
        for name, value in (s.app_metrics or {}).items():
            app[name] = max(value, app.get(name, value))
    if any(s.app_metrics is not None for s in snaps):
        out["app_metrics"] = app
    hists = [s for s in snaps if s.latency_counts is not None and s.latency_bounds_s is not None]
    if hists and all(s.latency_bounds_s == hists[0].latency_bounds_s for s in hists):
        counts = [0] * len(hists[0].latency_counts or ())
        for s in hists:
            for k, n in enumerate(s.latency_counts or ()):
                counts[k] += n
        out["latency_counts"] = tuple(counts)
        out["latency_bounds_s"] = hists[0].latency_bounds_s
    return out


class SignalMerger:
    """Pure merge of per-peer snapshots, with monotonic counters across peer churn."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str, str], float] = {}
        self._totals: dict[tuple[str, str], float] = {}

    def merge(
        self, now: float, per_peer: Mapping[str, Sequence[ServiceSignals]]
    ) -> dict[str, ServiceSignals]:
        by_service: dict[str, list[ServiceSignals]] = {}
        for peer, signals in sorted(per_peer.items()):
            for s in signals:
                by_service.setdefault(s.service, []).append(s)
                for counter in _COUNTERS:
                    value = getattr(s, counter)
                    previous = self._last.get((peer, s.service, counter))
                    increase = value if previous is None or value < previous else value - previous
                    self._last[(peer, s.service, counter)] = value
                    key = (s.service, counter)
                    self._totals[key] = self._totals.get(key, 0) + increase
                area = s.concurrency_seconds_total
                if area is not None:
                    previous_area = self._last.get((peer, s.service, _AREA))
                    if previous_area is None:
                        grown = 0.0
                    else:
                        grown = area if area < previous_area else area - previous_area
                    self._last[(peer, s.service, _AREA)] = area
                    key = (s.service, _AREA)
                    self._totals[key] = self._totals.get(key, 0.0) + grown
        out = {}
        for service, snaps in by_service.items():

            def biggest(name: str, snaps: list[ServiceSignals] = snaps) -> float | None:
                values = [getattr(s, name) for s in snaps if getattr(s, name) is not None]
                return max(values) if values else None

            ready = biggest("ready_replicas")
            out[service] = ServiceSignals(
                service=service,
                at=now,
                in_flight=sum(s.in_flight for s in snaps),
                queued=sum(s.queued for s in snaps),
                arrivals_total=int(self._totals[(service, "arrivals_total")]),
                completions_total=int(self._totals[(service, "completions_total")]),
                errors_total=int(self._totals[(service, "errors_total")]),
                rps=sum(s.rps for s in snaps),
                latency_p50_s=biggest("latency_p50_s"),
                latency_p99_s=biggest("latency_p99_s"),
                ready_replicas=int(ready) if ready is not None else None,
                cpu_seconds_total=biggest("cpu_seconds_total"),
                cpu_throttled_seconds_total=biggest("cpu_throttled_seconds_total"),
                concurrency_seconds_total=(
                    self._totals.get((service, _AREA))
                    if all(s.concurrency_seconds_total is not None for s in snaps)
                    else None
                ),
                **merged_metrics(snaps),
            )
        return out


class PeerSignals:
    """Fetches and merges ``/api/signals`` from every peer gateway replica."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        peers: Callable[[], Sequence[str]],
        timeout_s: float = 1.0,
        admin_token: str | None = None,
    ) -> None:
        self.client = client
        self.peers = peers
        self.timeout_s = timeout_s
        self._headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        self.merger = SignalMerger()
        self.last_report = PeerReport(())

    def __repr__(self) -> str:
        return f"PeerSignals(answered={len(self.last_report.answered)}, failed={dict(self.last_report.failed)})"

    async def _fetch(self, peer: str) -> list[ServiceSignals]:
        response = await self.client.get(
            f"http://{peer}/api/signals", headers=self._headers, timeout=self.timeout_s
        )
        response.raise_for_status()
        return signals_from_json(response.json())

    async def collect(self, now: float) -> tuple[dict[str, ServiceSignals], PeerReport]:
        peers = sorted(set(self.peers()))
        results = await asyncio.gather(*(self._fetch(p) for p in peers), return_exceptions=True)
        answered: dict[str, list[ServiceSignals]] = {}
        failed: dict[str, str] = {}
        for peer, result in zip(peers, results, strict=True):
            if isinstance(result, list):
                answered[peer] = result
            elif isinstance(result, httpx.HTTPError | SignalsFormatError | ValueError):
                failed[peer] = f"{type(result).__name__}: {result}"
            elif isinstance(result, BaseException):
                raise result
        self.last_report = PeerReport(tuple(sorted(answered)), failed)
        if failed:
            log.warning(
                "signals: %d of %d peers did not answer: %s", len(failed), len(peers), failed
            )
        if not answered:
            log.warning("signals: no peer answered")
            return {}, self.last_report
        return self.merger.merge(now, answered), self.last_report
