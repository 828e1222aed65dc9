"""The lending rule (scaler/lending.py): idle services lend quota above their floor to busy ones."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.lending import Holding, kept, lend


def test_nothing_idle_keeps_every_decided_quota() -> None:
    holdings = {"api": Holding(2, 0.5, 0.25, 1.0), "reports": Holding(1, 1.0, 0.25, 1.0)}
    assert lend(holdings, {}) == {"api": 0.5, "reports": 1.0}


def test_idle_service_keeps_its_floor_and_lends_the_rest_to_the_busy_one() -> None:
    holdings = {"api": Holding(2, 0.5, 0.25, 1.0), "reports": Holding(1, 1.0, 0.25, 1.0)}
    quota = lend(holdings, {"reports": holdings["reports"].replicas})
    assert quota["reports"] == 0.25
    # 0.75 lent, spread over api's two replicas
    assert math.isclose(quota["api"], 0.5 + 0.375)


def test_borrowers_share_by_weight_up_to_their_ceiling() -> None:
    holdings = {
        "idle": Holding(2, 1.0, 0.0, 1.0),  # lends 2 cores
        "heavy": Holding(1, 0.5, 0.25, 2.0, weight=3.0),
        "light": Holding(1, 0.5, 0.25, 0.75, weight=1.0),  # room 0.25 only
    }
    quota = lend(holdings, {"idle": holdings["idle"].replicas})
    assert quota["idle"] == 0.0
    assert math.isclose(quota["light"], 0.75)  # capped at its ceiling
    assert math.isclose(quota["heavy"], 2.0)  # takes the rest, up to its own ceiling


def test_what_nobody_can_take_stays_unlent() -> None:
    holdings = {"a": Holding(1, 1.0, 0.25, 1.0), "b": Holding(1, 0.5, 0.25, 0.6)}
    quota = lend(holdings, {"a": holdings["a"].replicas})
    assert quota == {"a": 0.25, "b": 0.6}


def test_a_service_without_replicas_neither_lends_nor_borrows() -> None:
    holdings = {"a": Holding(0, 1.0, 0.25, 1.0), "b": Holding(0, 0.5, 0.25, 1.0)}
    assert lend(holdings, {"a": holdings["a"].replicas}) == {"a": 1.0, "b": 0.5}


_holding = st.builds(
    lambda replicas, floor, extra, room, weight: Holding(
        replicas, floor + extra, floor, floor + extra + room, weight
    ),
    st.integers(0, 5),
    st.floats(0.0, 1.0),
    st.floats(0.0, 2.0),
    st.floats(0.0, 2.0),
    st.floats(0.1, 10.0),
)


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.sampled_from("abcdef"), _holding, min_size=1), st.data())
def test_lending_never_hands_out_more_than_the_decisions_hold(
    holdings: dict[str, Holding], data: st.DataObject
) -> None:
    idle = {
        name: data.draw(st.integers(0, h.replicas), label=f"idle replicas of {name}")
        for name, h in holdings.items()
    }
    quota = lend(holdings, idle)
    decided = math.fsum(h.replicas * h.cores for h in holdings.values())
    in_force = math.fsum(
        (h.replicas - idle[n]) * quota[n] + idle[n] * kept(h) for n, h in holdings.items()
    )
    assert in_force <= decided + 1e-9
    for name, h in holdings.items():
        if h.replicas and idle[name] == h.replicas:
            assert quota[name] == kept(h)
        else:
            # a busy replica never gets less than its decision, nor more than its ceiling
            assert h.cores - 1e-12 <= quota[name] <= max(h.cores, h.ceiling) + 1e-12


def test_an_idle_replica_lends_to_its_busy_siblings_and_to_other_services() -> None:
    holdings = {
        "jobs": Holding(4, 0.75, 0.25, 1.0),  # 2 of 4 idle: each lends 0.5
        "api": Holding(8, 0.5, 0.25, 1.0),
    }
    quota = lend(holdings, {"jobs": 2})
    # 1 core lent, by weight over jobs' 2 busy replicas (room 0.5) and api's 8 (room 4)
    assert math.isclose(quota["jobs"], 1.0)
    assert math.isclose(quota["api"], 0.5 + 0.5 / 8)


def test_a_service_with_every_replica_idle_is_an_idle_service() -> None:
    holdings = {"a": Holding(2, 1.0, 0.25, 1.0), "b": Holding(1, 0.5, 0.25, 2.0)}
    assert lend(holdings, {"a": 2}) == lend(holdings, {"a": 5}) == {"a": 0.25, "b": 2.0}
