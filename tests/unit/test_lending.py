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


def test_a_service_the_decision_cut_borrows_first() -> None:
    # idle lends 2 cores; cut's decision left it 1.5 short, full got all it asked for
    holdings = {
        "idle": Holding(2, 1.0, 0.0, 1.0),
        "cut": Holding(2, 1.0, 0.25, 2.0, unmet=1.5),
        "full": Holding(2, 1.0, 0.25, 2.0),
    }
    quota = lend(holdings, {"idle": holdings["idle"].replicas})
    # cut takes all it can (2 cores over its two busy replicas, up to cpu.max)
    assert math.isclose(quota["cut"], 2.0)
    assert quota["full"] == 1.0
    # nobody cut (or by less than the kernel's smallest quota): shared by weight
    for unmet in (0.0, 0.005, math.nan):
        even = lend({**holdings, "cut": Holding(2, 1.0, 0.25, 2.0, unmet=unmet)}, {"idle": 2})
        assert math.isclose(even["cut"], 1.5)
        assert math.isclose(even["full"], 1.5)


def test_what_the_cut_services_cannot_take_goes_to_the_others() -> None:
    holdings = {
        "idle": Holding(1, 2.0, 0.0, 2.0),
        "cut": Holding(1, 1.0, 0.25, 1.5, unmet=5.0),  # room 0.5
        "full": Holding(1, 1.0, 0.25, 3.0),
    }
    quota = lend(holdings, {"idle": 1})
    assert math.isclose(quota["cut"], 1.5)
    assert math.isclose(quota["full"], 2.5)


def test_what_nobody_can_take_stays_unlent() -> None:
    holdings = {"a": Holding(1, 1.0, 0.25, 1.0), "b": Holding(1, 0.5, 0.25, 0.6)}
    quota = lend(holdings, {"a": holdings["a"].replicas})
    assert quota == {"a": 0.25, "b": 0.6}


def test_a_service_without_replicas_neither_lends_nor_borrows() -> None:
    holdings = {"a": Holding(0, 1.0, 0.25, 1.0), "b": Holding(0, 0.5, 0.25, 1.0)}
    assert lend(holdings, {"a": holdings["a"].replicas}) == {"a": 1.0, "b": 0.5}


_holding = st.builds(
    lambda replicas, floor, extra, room, weight, unmet: Holding(
        replicas, floor + extra, floor, floor + extra + room, weight, unmet
    ),
    st.integers(0, 5),
    st.floats(0.0, 1.0),
    st.floats(0.0, 2.0),
    st.floats(0.0, 2.0),
    st.floats(0.1, 10.0),
    st.one_of(st.just(0.0), st.floats(0.0, 20.0), st.sampled_from([math.nan, math.inf, -1.0])),
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
