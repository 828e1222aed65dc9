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
        ServiceSignals("api", 2.0),
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
