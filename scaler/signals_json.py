"""The JSON shape of ``GET /api/signals`` (one gateway replica's live signals), both ways.

The data plane serves it (``gateway.admin.server``), the leader's signal merger reads it from every
peer::

    {"at": 12.5,
     "signals": {"shop/web": {"service": "shop/web", "at": 12.5, "in_flight": 3, "queued": 0,
                              "arrivals_total": 120, "completions_total": 117,
                              "errors_total": 1, "rps": 8.2, "latency_p50_s": 0.012,
                              "latency_p99_s": 0.09, "ready_replicas": 2,
                              "cpu_seconds_total": null,
                              "cpu_throttled_seconds_total": null,
                              "concurrency_seconds_total": 301.25}, ...}}

Field names are :class:`~scaler.signals.ServiceSignals` fields; the key of ``signals`` is the
service name.  Unknown fields are ignored (newer peers), missing optional ones take their
defaults; ``at`` is the sender's own clock and is not comparable across replicas.  Pure.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

from scaler.signals import ServiceSignals

_INT_FIELDS = ("in_flight", "queued", "arrivals_total", "completions_total", "errors_total")
_FLOAT_FIELDS = ("rps",)
_OPTIONAL_FLOAT = (
    "latency_p50_s",
    "latency_p99_s",
    "cpu_seconds_total",
    "cpu_throttled_seconds_total",
    "concurrency_seconds_total",
)
_OPTIONAL_INT = ("ready_replicas",)


class SignalsFormatError(ValueError):
    """A ``/api/signals`` document that does not have the shape above."""


def signals_to_json(at: float, signals: Iterable[ServiceSignals]) -> dict[str, Any]:
    return {"at": at, "signals": {s.service: dataclasses.asdict(s) for s in signals}}


def _number(value: Any, where: str, integer: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SignalsFormatError(f"{where}: must be a number, got {value!r}")
    if integer and not float(value).is_integer():
        raise SignalsFormatError(f"{where}: must be an integer, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise SignalsFormatError(f"{where}: must be finite and >= 0, got {value!r}")
    return value


def signals_from_json(data: Any) -> list[ServiceSignals]:
    """Parse and check a document; raise :class:`SignalsFormatError` naming the bad field."""
    if not isinstance(data, dict):
        raise SignalsFormatError(f"must be an object, got {type(data).__name__}")
    services = data.get("signals")
    if not isinstance(services, dict):
        raise SignalsFormatError("signals: must be an object of service name -> signals")
    out = []
    for key, item in sorted(services.items()):
        where = f"signals[{key!r}]"
        if not isinstance(item, dict):
            raise SignalsFormatError(f"{where}: must be an object")
        name = item.get("service", key)
        if not isinstance(name, str) or not name or name != key:
            raise SignalsFormatError(f"{where}.service: must equal its key, got {name!r}")
        kw: dict[str, Any] = {
            "service": name,
            "at": float(_number(item.get("at"), f"{where}.at", False)),
        }
        for f in _INT_FIELDS:
            if f in item:
                kw[f] = int(_number(item[f], f"{where}.{f}", True))
        for f in _FLOAT_FIELDS:
            if f in item:
                kw[f] = float(_number(item[f], f"{where}.{f}", False))
        for f in _OPTIONAL_FLOAT:
            if item.get(f) is not None:
                kw[f] = float(_number(item[f], f"{where}.{f}", False))
        for f in _OPTIONAL_INT:
            if item.get(f) is not None:
                kw[f] = int(_number(item[f], f"{where}.{f}", True))
        kw.update(_metric_fields(item, where))
        out.append(ServiceSignals(**kw))
    return out


def _metric_fields(item: dict[str, Any], where: str) -> dict[str, Any]:
    """``app_metrics`` (name -> number) and the latency histogram, when present."""
    kw: dict[str, Any] = {}
    app = item.get("app_metrics")
    if app is not None:
        if not isinstance(app, dict):
            raise SignalsFormatError(f"{where}.app_metrics: must be an object of name -> number")
        kw["app_metrics"] = {
            str(k): float(_number(v, f"{where}.app_metrics[{k!r}]", False)) for k, v in app.items()
        }
    counts, bounds = item.get("latency_counts"), item.get("latency_bounds_s")
    if counts is not None or bounds is not None:
        if not isinstance(counts, list | tuple) or not isinstance(bounds, list | tuple):
            raise SignalsFormatError(
                f"{where}.latency_counts: must be a list, with latency_bounds_s a list"
            )
        if len(counts) != len(bounds) + 1:
            raise SignalsFormatError(
                f"{where}.latency_counts: must have one more entry than latency_bounds_s"
            )
        kw["latency_counts"] = tuple(
            int(_number(v, f"{where}.latency_counts[{k}]", True)) for k, v in enumerate(counts)
        )
        kw["latency_bounds_s"] = tuple(
            float(_number(v, f"{where}.latency_bounds_s[{k}]", False)) for k, v in enumerate(bounds)
        )
    return kw
