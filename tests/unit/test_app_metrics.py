"""App metrics in the data plane (header values per replica, pushes) and in the signals JSON."""

from __future__ import annotations

import pytest

from gateway.dataplane.app_metrics import AppMetrics
from gateway.platforms.kubernetes.peers import SignalMerger
from scaler.policy import MetricSpec
from scaler.signals import ServiceSignals
from scaler.signals_json import SignalsFormatError, signals_from_json, signals_to_json


def spec(aggregate: str = "max", **source: object) -> MetricSpec:
    return MetricSpec.model_validate(
        {
            "type": "app",
            "name": "users",
            "source": source or {"header": "X-Active-Users", "aggregate": aggregate},
            "target": 100,
        }
    )


def head(*fields: str) -> bytes:
    return b"HTTP/1.1 200 OK\r\n" + b"".join(f.encode() + b"\r\n" for f in fields)


def test_the_last_value_per_replica_combined_by_the_aggregate() -> None:
    for aggregate, expected in (("max", 30.0), ("sum", 40.0), ("avg", 20.0)):
        app = AppMetrics([spec(aggregate)])
        app.observe("a:1", head("X-Active-Users: 5"), 0.0)
        app.observe("a:1", head("Content-Length: 2", "x-active-users:10"), 1.0)  # any case
        app.observe("b:1", head("X-Active-Users:\t30 "), 1.0)
        assert app.values(2.0, {"a:1", "b:1"}) == {"users": expected}, aggregate


def test_malformed_values_are_ignored_and_counted() -> None:
    app = AppMetrics([spec()])
    app.observe("a:1", head("X-Active-Users: 7"), 0.0)
    for bad in ("lots", "", "-3", "nan", "inf", "1e999"):
        app.observe("a:1", head(f"X-Active-Users: {bad}"), 1.0)
    assert app.malformed == {"users": 6}
    assert app.values(1.0, {"a:1"}) == {"users": 7.0}  # the last good one stands
    app.observe("a:1", head("X-Other: 9", "X-Active-Users-Total: 9"), 1.0)  # other fields
    assert app.values(1.0, {"a:1"}) == {"users": 7.0}


def test_old_values_and_gone_replicas_drop_out() -> None:
    app = AppMetrics([spec("sum")])
    app.observe("a:1", head("X-Active-Users: 5"), 0.0)
    app.observe("b:1", head("X-Active-Users: 7"), 50.0)
    assert app.values(55.0, {"a:1", "b:1"}) == {"users": 12.0}
    assert app.values(55.0, {"b:1"}) == {"users": 7.0}  # a:1 is no longer routable
    assert app.values(61.0, {"a:1", "b:1"}) == {"users": 7.0}  # a:1's value is 61 s old
    assert app.values(111.0, {"a:1", "b:1"}) == {}  # no data at all


def test_pushes_go_only_to_pushed_metrics() -> None:
    pushed = MetricSpec.model_validate(
        {"type": "app", "name": "queue", "source": {"push": True}, "target": 10}
    )
    app = AppMetrics([spec(), pushed])
    assert app.pushable() == ("queue",)
    assert app.push("queue", 42.0, 0.0)
    assert not app.push("users", 1.0, 0.0)  # read from a header, not pushed
    assert not app.push("nope", 1.0, 0.0)
    assert app.values(1.0, set()) == {"queue": 42.0}
    assert app.values(61.0, set()) == {}
    assert AppMetrics([spec(), pushed]).same_specs([spec(), pushed])
    assert not app.same_specs([spec()])


def test_the_new_signal_fields_cross_the_signals_json_and_merge_across_gateways() -> None:
    one = ServiceSignals(
        "api",
        1.0,
        app_metrics={"users": 120.0},
        latency_counts=(1, 2, 3),
        latency_bounds_s=(0.1, 0.2),
    )
    back = signals_from_json(signals_to_json(1.0, [one]))
    assert back == [one]
    two = ServiceSignals(
        "api",
        1.0,
        app_metrics={"users": 90.0, "q": 3.0},
        latency_counts=(0, 1, 1),
        latency_bounds_s=(0.1, 0.2),
    )
    merged = SignalMerger().merge(2.0, {"p1": [one], "p2": [two]})["api"]
    assert merged.app_metrics == {"users": 120.0, "q": 3.0}
    assert merged.latency_counts == (1, 3, 4)
    bad = signals_to_json(1.0, [one])
    bad["signals"]["api"]["latency_counts"] = [1, 2]
    with pytest.raises(SignalsFormatError, match="one more entry than latency_bounds_s"):
        signals_from_json(bad)
    bad["signals"]["api"]["latency_counts"] = [1, 2, 3]
    bad["signals"]["api"]["app_metrics"] = {"users": -1}
    with pytest.raises(SignalsFormatError, match="app_metrics"):
        signals_from_json(bad)
