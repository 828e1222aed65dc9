"""The /api/signals JSON shape and the pure cross-replica merge."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.platforms.kubernetes.peers import SignalMerger
from scaler.signals import ServiceSignals
from scaler.signals_json import SignalsFormatError, signals_from_json, signals_to_json


def test_round_trip() -> None:
    s = [
        ServiceSignals("shop/web", 1.5, 3, 1, 10, 9, 1, 2.5, 0.01, 0.2, 2, 4.0, 0.5),
        ServiceSignals("api", 2.0, concurrency_seconds_total=12.5),
    ]
    assert signals_from_json(signals_to_json(3.0, s)) == sorted(s, key=lambda x: x.service)


def doc(**fields: object) -> dict[str, object]:
    return {"at": 1.0, "signals": {"a": {"service": "a", "at": 1, **fields}}}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "must be an object, got list"),
        ({"at": 1}, "signals: must be an object of service name -> signals"),
        ({"signals": {"a": 3}}, "signals['a']: must be an object"),
        (
            {"signals": {"a": {"service": "b", "at": 1}}},
            "signals['a'].service: must equal its key, got 'b'",
        ),
        (doc(in_flight=1.5), "signals['a'].in_flight: must be an integer"),
        (doc(rps=-1), "signals['a'].rps: must be finite and >= 0"),
        (
            doc(concurrency_seconds_total=-2.0),
            "signals['a'].concurrency_seconds_total: must be finite and >= 0",
        ),
        (doc(at=True), "signals['a'].at: must be a number"),
    ],
)
def test_bad_documents_name_the_field(doc: object, message: str) -> None:
    with pytest.raises(SignalsFormatError, match=re.escape(message)):
        signals_from_json(doc)


def test_unknown_fields_are_ignored() -> None:
    (s,) = signals_from_json(doc(new_field=3))
    assert s == ServiceSignals("a", 1.0)


@given(
    st.lists(
        st.tuples(st.sampled_from(["p1", "p2", "p3"]), st.integers(0, 50), st.booleans()),
        max_size=60,
    )
)
def test_merged_counters_never_go_down(steps: list[tuple[str, int, bool]]) -> None:
    """Whatever peers report (restarts, silences), the merged arrivals never decrease."""
    merger = SignalMerger()
    counters = {"p1": 0, "p2": 0, "p3": 0}
    last = 0
    for t, (peer, increase, restart) in enumerate(steps):
        counters[peer] = increase if restart else counters[peer] + increase
        merged = merger.merge(
            float(t), {peer: [ServiceSignals("s", 0.0, arrivals_total=counters[peer])]}
        )
        assert merged["s"].arrivals_total >= last
        last = merged["s"].arrivals_total


def test_the_concurrency_integral_merges_by_increase_from_each_peers_first_answer() -> None:
    """A peer's integral since it started is not time since the last tick: its first answer
    adds nothing, then its increases are summed (a restart adds its new value); a peer that
    keeps no integral leaves the merged snapshot without one (the engine then reads the count
    in flight)."""

    def sig(area: float | None) -> list[ServiceSignals]:
        return [ServiceSignals("s", 0.0, in_flight=1, concurrency_seconds_total=area)]

    merger = SignalMerger()
    assert merger.merge(1.0, {"p1": sig(500.0)})["s"].concurrency_seconds_total == 0.0
    merged = merger.merge(2.0, {"p1": sig(503.0), "p2": sig(9000.0)})["s"]
    assert merged.concurrency_seconds_total == 3.0
    merged = merger.merge(3.0, {"p1": sig(504.0), "p2": sig(9002.5)})["s"]
    assert merged.concurrency_seconds_total == 3.0 + 1.0 + 2.5
    merged = merger.merge(4.0, {"p1": sig(0.5), "p2": sig(9003.0)})["s"]  # p1 restarted
    assert merged.concurrency_seconds_total == 6.5 + 0.5 + 0.5
    assert (
        merger.merge(5.0, {"p1": sig(1.0), "p3": sig(None)})["s"].concurrency_seconds_total is None
    )
