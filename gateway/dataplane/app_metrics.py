"""A service's ``app`` metrics (``scaling.metrics``): numbers its replicas report about themselves.

Two sources: a response header read as responses pass (the last value per replica, combined
by ``aggregate``), and pushed values (``POST /api/metrics/<service>``).  A value older than the
source's ``max_age_s``, or from a replica no longer routable, is dropped: the metric then has
no data (the scaler never scales down on it).

Hot-path cost (:meth:`AppMetrics.observe`, per upstream response head, only for services with
a header metric): one compiled case-insensitive regex search per header metric over the head,
and on a match one ``float()`` and one dict store.  A malformed value (not a finite number
>= 0) is ignored and counted in ``malformed``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from dataclasses import dataclass

from scaler.policy import MetricSpec

AppState = tuple[dict[str, dict[str, tuple[float, float]]], dict[str, int]]
"""One process's app metrics as plain data: per metric, replica -> (value, when); and the
malformed counts (``workers: N``: each worker sends its own to the main process)."""

PUSHED = "(pushed)"
"""The key pushed values are kept under (not a replica address)."""


@dataclass(frozen=True, slots=True)
class _Source:
    name: str
    pattern: re.Pattern[bytes] | None
    """The header's regex (None: a pushed metric)."""
    aggregate: str
    max_age_s: float


class AppMetrics:
    """One service's app metrics: the last value per replica (or pushed), read per tick."""

    __slots__ = ("_headers", "_last", "_sources", "malformed")

    def __init__(self, specs: Collection[MetricSpec]) -> None:
        sources = []
        for spec in specs:
            src = spec.source
            if spec.type != "app" or src is None:
                continue
            pattern = None
            if src.header is not None:
                pattern = re.compile(
                    rb"\r\n" + re.escape(src.header.encode()) + rb"[ \t]*:[ \t]*([^\r\n]*)",
                    re.IGNORECASE,
                )
            sources.append(_Source(spec.key, pattern, src.aggregate, src.max_age_s))
        self._sources = {s.name: s for s in sources}
        self._headers = tuple((s.name, s.pattern) for s in sources if s.pattern is not None)
        self._last: dict[str, dict[str, tuple[float, float]]] = {s.name: {} for s in sources}
        """Per metric: replica address (or :data:`PUSHED`) -> (value, when)."""
        self.malformed: dict[str, int] = {s.name: 0 for s in sources}
        """Per metric: header values ignored as malformed."""

    def __repr__(self) -> str:
        return f"AppMetrics({sorted(self._sources)}, malformed={self.malformed})"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._sources)

    @property
    def reads_headers(self) -> bool:
        return bool(self._headers)

    def same_specs(self, specs: Collection[MetricSpec]) -> bool:
        """Whether ``specs`` configure exactly these sources (a reload keeps the values)."""
        other = AppMetrics(specs)
        return other._sources == self._sources

    def observe(self, address: str, raw_head: bytes, now: float) -> None:
        """A response head from replica ``address``: record the header metrics it carries."""
        for name, pattern in self._headers:
            match = pattern.search(raw_head)
            if match is None:
                continue
            try:
                value = float(match.group(1).strip())
            except ValueError:
                self.malformed[name] += 1
                continue
            if not math.isfinite(value) or value < 0:
                self.malformed[name] += 1
                continue
            self._last[name][address] = (value, now)

    def push(self, name: str, value: float, now: float) -> bool:
        """A pushed value for metric ``name``; False when no pushed metric has that name."""
        source = self._sources.get(name)
        if source is None or source.pattern is not None:
            return False
        self._last[name][PUSHED] = (value, now)
        return True

    def pushable(self) -> tuple[str, ...]:
        """The names ``POST /api/metrics/<service>`` accepts."""
        return tuple(s.name for s in self._sources.values() if s.pattern is None)

    def state(self) -> AppState:
        """This process's values and counts (copies)."""
        return {k: dict(v) for k, v in self._last.items()}, dict(self.malformed)

    def absorb(self, states: Collection[AppState]) -> None:
        """The workers' values merged in (``workers: N``): per replica the newest value (the
        processes share the monotonic clock), malformed counts summed (never going back)."""
        for last, _ in states:
            for name, values in last.items():
                mine = self._last.get(name)
                if mine is None:
                    continue
                for key, (value, at) in values.items():
                    held = mine.get(key)
                    if held is None or held[1] < at:
                        mine[key] = (value, at)
        for name in self.malformed:
            total = sum(m.get(name, 0) for _, m in states)
            self.malformed[name] = max(self.malformed[name], total)

    def values(self, now: float, replicas: Collection[str]) -> dict[str, float]:
        """Each metric's value now: its replicas' (those in ``replicas``) recent last values
        combined by ``aggregate``, or the last push; a metric with none is absent."""
        out: dict[str, float] = {}
        for name, source in self._sources.items():
            last = self._last[name]
            oldest = now - source.max_age_s
            for key in [k for k, (_, at) in last.items() if at < oldest]:
                del last[key]
            if source.pattern is None:
                pushed = last.get(PUSHED)
                if pushed is not None:
                    out[name] = pushed[0]
                continue
            found = [v for key, (v, _) in last.items() if key in replicas]
            if not found:
                continue
            if source.aggregate == "max":
                out[name] = max(found)
            elif source.aggregate == "sum":
                out[name] = sum(found)
            else:
                out[name] = sum(found) / len(found)
        return out
