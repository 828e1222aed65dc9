"""The arbiter's pieces: water-filling, hysteresis, the replicas × CPU split, FCFS baseline."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.arbiter import (
    WEIGHT_MIN_CORES,
    IndependentClaim,
    arbitrate_arrays,
    arbitrate_independent,
    size_arrays,
    water_fill,
)
from scaler.policy import ScalingPolicy


@pytest.mark.parametrize(
    ("budget", "lows", "highs", "weights", "expected"),
    [
        # everyone fits: everyone gets what they ask
        (4.0, [0, 0], [1, 2], [1, 1], [1, 2]),
        # equal weights, both want everything: equal split
        (2.0, [0, 0], [5, 5], [1, 1], [1, 1]),
        # weights 2:1
        (3.0, [0, 0], [5, 5], [2, 1], [2, 1]),
        # a small demand is met in full, the rest goes to the big one (work-conserving)
        (2.0, [0, 0], [0.3, 5], [1, 1], [0.3, 1.7]),
        # floors first: a floor above the equal share is kept
        (2.0, [1.5, 0], [5, 5], [1, 1], [1.5, 0.5]),
        # lows over the budget: everyone gets their low
        (1.0, [0.75, 0.5], [5, 5], [1, 1], [0.75, 0.5]),
    ],
)
def test_water_fill_examples(
    budget: float,
    lows: list[float],
    highs: list[float],
    weights: list[float],
    expected: list[float],
) -> None:
    assert water_fill(budget, lows, highs, weights).tolist() == pytest.approx(expected)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 2), st.floats(0, 4), st.sampled_from([0.5, 1.0, 2.0, 3.0])),
        min_size=1,
        max_size=12,
    ),
    st.floats(0, 1),
)
def test_water_fill_is_weighted_max_min_fair_within_the_budget(
    rows: list[tuple[float, float, float]], spare: float
) -> None:
    lows = [lo for lo, _, _ in rows]
    highs = [lo + extra for lo, extra, _ in rows]
    weights = [w for _, _, w in rows]
    budget = sum(lows) + spare * (sum(highs) - sum(lows) + 1)
    got = water_fill(budget, lows, highs, weights).tolist()
    assert sum(got) <= budget + 1e-9
    assert all(lo - 1e-9 <= g <= hi + 1e-9 for lo, g, hi in zip(lows, got, highs, strict=True))
    if sum(highs) <= budget:
        assert got == pytest.approx(highs)
        return
    assert sum(got) == pytest.approx(budget, abs=1e-6)  # work-conserving
    # One level λ: between its bounds a service gets λ·w; at its low, low >= λ·w; at its
    # high, high <= λ·w.
    levels = [
        g / w
        for lo, g, hi, w in zip(lows, got, highs, weights, strict=True)
        if lo + 1e-6 < g < hi - 1e-6
    ]
    if levels:
        lam = levels[0]
        assert all(level == pytest.approx(lam, abs=1e-6) for level in levels)
        for lo, g, hi, w in zip(lows, got, highs, weights, strict=True):
            if hi > lo + 1e-6 and g <= lo + 1e-6:
                assert lo >= lam * w - 1e-6
            elif hi > lo + 1e-6 and g >= hi - 1e-6:
                assert hi <= lam * w + 1e-6


def policy(**kw: object) -> ScalingPolicy:
    return ScalingPolicy.model_validate(kw)


def size(
    cores: float,
    p: ScalingPolicy,
    *,
    want: int,
    current: int,
    fixed: float | None = None,
    usable: float | None = None,
    one_more: bool = False,
    in_place: bool = False,
) -> tuple[int, float, int]:
    ref = p.cpu.initial_cores
    r, cpu, note = size_arrays(
        np.array([cores]),
        want=np.array([want]),
        current=np.array([current]),
        unit=np.array([ref if p.prefer == "horizontal" else p.cpu.max]),
        cpu_min=np.array([p.cpu.min]),
        cpu_max=np.array([p.cpu.max]),
        cpu_ref=np.array([ref]),
        min_r=np.array([p.min_replicas]),
        max_r=np.array([p.max_replicas]),
        fixed_cpu=np.array([np.nan if fixed is None else fixed]),
        usable=None if usable is None else np.array([usable]),
        one_more=np.array([one_more]),
        in_place=np.array([in_place]),
    )
    return int(r[0]), float(cpu[0]), int(note[0])


@settings(max_examples=300, deadline=None)
@given(
    st.floats(0.0, 12.0),
    st.sampled_from([0.05, 0.1, 0.25, 0.5]),
    st.sampled_from([1.0, 1.5, 2.0, 4.0]),
    st.integers(0, 3),
    st.integers(0, 9),
    st.integers(0, 12),
    st.integers(0, 8),
    st.booleans(),
    st.one_of(st.none(), st.floats(0.01, 3.0)),
    st.one_of(st.none(), st.floats(0.0, 16.0)),
    st.booleans(),
    st.booleans(),
)
def test_sizing_keeps_the_bounds_and_the_cores(
    cores: float,
    cpu_min: float,
    stretch: float,
    min_r: int,
    extra_r: int,
    want: int,
    current: int,
    horizontal: bool,
    fixed: float | None,
    usable: float | None,
    one_more: bool,
    in_place: bool,
) -> None:
    p = policy(
        min_replicas=min_r,
        max_replicas=max(1, min_r + extra_r),
        cpu={"min": cpu_min, "max": cpu_min * stretch},
        prefer="horizontal" if horizontal else "vertical",
    )
    cores = max(cores, min_r * cpu_min)
    r, cpu, _ = size(
        cores,
        p,
        want=want,
        current=current,
        fixed=fixed if current else None,
        usable=usable,
        one_more=one_more,
        in_place=in_place,
    )
    assert p.min_replicas <= r <= p.max_replicas
    assert r * cpu <= cores + 1e-9 or fixed is not None
    if r:
        assert cpu <= p.cpu.max + 1e-9
        if cpu < p.cpu.min - 1e-9:
            # only replicas it already runs, kept in place (share), at a weight of 1m or more
            assert in_place and r <= current and cpu >= WEIGHT_MIN_CORES - 1e-12
    if in_place and fixed is None:
        # in place, it keeps every replica it wants and runs while 1m each fits
        kept = min(want, current, p.max_replicas)
        if kept * WEIGHT_MIN_CORES <= cores + 1e-12:
            assert r >= kept
    if fixed is None or not current:
        # Never more replicas than wanted (beyond min_replicas), nor than cpu.min each fits.
        assert r <= max(want, p.min_replicas)
        # The replicas it wants and already runs are kept while cpu.min each fits.
        kept = min(want, current, p.max_replicas)
        if kept * cpu_min <= cores + 1e-9:
            assert r >= kept


def test_replicas_follow_the_recommendation_and_cpu_shrinks_in_place() -> None:
    p = policy(max_replicas=8, cpu={"min": 0.25, "max": 1.0, "request": 1.0})
    # 8 replicas wanted and running, the budget gives 4 cores: 8 × 0.5, none removed.
    assert size(4.0, p, want=8, current=8) == (8, pytest.approx(0.5), 0)
    # Too little for cpu.min each: only then do replicas go (note 2).
    assert size(1.0, p, want=8, current=8) == (4, pytest.approx(0.25), 2)


def test_under_share_replicas_it_runs_stay_in_place_below_cpu_min() -> None:
    p = policy(min_replicas=0, max_replicas=8, cpu={"min": 0.25, "max": 0.25})
    # 8 replicas of a fixed size running, 1 core left after another service's claim: all 8
    # kept at 0.125 each (a weight; note 1) instead of 4 kept and 4 removed (note 2).
    assert size(1.0, p, want=8, current=8) == (4, pytest.approx(0.25), 2)
    assert size(1.0, p, want=8, current=8, in_place=True) == (8, pytest.approx(0.125), 1)
    # Only those it runs: none started below cpu.min, and fewer wanted are fewer kept.
    assert size(1.0, p, want=8, current=2, in_place=True) == (4, pytest.approx(0.25), 6)
    assert size(1.0, p, want=6, current=8, in_place=True) == (6, pytest.approx(1 / 6), 1)
    # Down to 1m each: 0.003 cores keep 3 replicas, nothing keeps none.
    assert size(0.003, p, want=8, current=8, in_place=True)[0] == 3
    assert size(0.0, p, want=8, current=8, in_place=True)[0] == 0


def test_new_replicas_start_only_as_far_as_the_cores_fill_them() -> None:
    p = policy(max_replicas=8, cpu={"min": 0.25, "max": 1.0, "request": 1.0})
    # 1 running, 8 wanted, 3 cores: 3 replicas of 1 core, not 8 of 0.375 that would each
    # hold CPU while they start (note 6).
    assert size(3.0, p, want=8, current=1) == (3, pytest.approx(1.0), 6)
    # Running replicas are never removed for that: 6 running, 3 cores -> 6 × 0.5.
    assert size(3.0, p, want=8, current=6) == (6, pytest.approx(0.5), 6)
    h = policy(max_replicas=8, prefer="horizontal", cpu={"min": 0.1, "max": 1.0, "request": 0.25})
    assert size(1.0, h, want=8, current=1) == (4, pytest.approx(0.25), 6)


def test_under_share_new_replicas_may_start_into_the_idle_cpu_they_can_use() -> None:
    p = policy(max_replicas=8, cpu={"min": 0.25, "max": 1.0, "request": 1.0})
    # 3 cores decided, but the service uses 2.5 and the node has 2.5 idle: 5 replicas fill
    # what it can use (a starting replica holds a weight, not CPU), 3 cores shared by them.
    # The note says why the replicas it adds start (9, into idle CPU), not why 3 more wait.
    assert size(3.0, p, want=8, current=3, usable=5.0) == (5, pytest.approx(0.6), 9)
    # Nothing idle: as before, the cores alone say how many start.
    assert size(3.0, p, want=8, current=1, usable=1.0) == (3, pytest.approx(1.0), 6)
    # Never more than the cores give cpu.min each.
    assert size(1.0, p, want=8, current=1, usable=7.5)[0] == 4


def test_under_share_a_service_held_back_by_its_cores_runs_one_replica_more() -> None:
    p = policy(max_replicas=8, cpu={"min": 0.25, "max": 1.0, "request": 1.0})
    # 4.3 cores fill 5 replicas (4 at full size, one for the remainder); under share it runs
    # 6, the 4.3 cores shared by them: the weight is unchanged, the sixth only soaks idle CPU.
    assert size(4.3, p, want=8, current=4) == (5, pytest.approx(0.86), 6)
    assert size(4.3, p, want=8, current=4, one_more=True) == (6, pytest.approx(4.3 / 6), 10)
    # Only when it wants more than the cores fill: wanting 5, it runs 5.
    assert size(4.3, p, want=5, current=4, one_more=True) == (5, pytest.approx(0.86), 0)
    # Never beyond max_replicas, nor below cpu.min each.
    assert size(7.5, p, want=8, current=7, one_more=True)[0] == 8
    assert size(1.0, p, want=8, current=1, one_more=True) == (2, pytest.approx(0.5), 10)
    assert size(0.4, p, want=8, current=1, one_more=True) == (1, pytest.approx(0.4), 2)


def test_a_blocked_resize_keeps_the_cpu_and_changes_the_count() -> None:
    p = policy(max_replicas=8, cpu={"min": 0.25, "max": 1.0, "request": 1.0})
    assert size(2.0, p, want=4, current=4, fixed=0.5) == (4, pytest.approx(0.5), 3)
    # Less CPU than the replicas hold at the CPU in force: a shrink in place (a decrease is not
    # refused for capacity), not a serving replica removed.
    assert size(1.0, p, want=4, current=4, fixed=0.5) == (4, pytest.approx(0.25), 4)


def test_a_blocked_resize_never_keeps_more_replicas_than_the_budget_gives_cpu_min() -> None:
    """cpu.min = cpu.max = 0.5, 9 replicas (2 still starting), resize blocked, and the budget
    gives 4.33 cores: 9 × 0.5 would overrun it.  Replicas go (8 fit at cpu.min), unless
    under share they are kept in place, each at a weight below cpu.min, and say so."""
    p = policy(max_replicas=9, cpu={"min": 0.5, "max": 0.5})
    assert size(4.333, p, want=9, current=9, fixed=0.5) == (8, pytest.approx(0.5), 3)
    kept = size(4.333, p, want=9, current=9, fixed=0.5, in_place=True)
    assert kept == (9, pytest.approx(4.333 / 9), 1)


def arrays(**kw: list[float]) -> dict[str, np.ndarray]:
    return {k: np.array(v, dtype=float) for k, v in kw.items()}


def test_hysteresis_holds_a_borrower_against_small_wiggles_but_never_a_guarantee() -> None:
    base = arrays(minimum=[0.1, 0.1], floor=[0.1, 0.1], cap=[4, 4], weight=[1, 1], fair=[1, 1])
    band = {"hysteresis_cores": 0.05, "hysteresis_ratio": 0.05}
    # "a" borrows; "b" wiggles 0.32 -> 0.30: "a" could grow by 0.02 but keeps 1.68 (no flap)
    cores, ideal, _ = arbitrate_arrays(
        2.0,
        demand=np.array([3.0, 0.30]),
        previous=np.array([1.68, 0.32]),
        hold=np.zeros(2),
        **base,
        **band,
    )
    assert ideal.tolist() == pytest.approx([1.70, 0.30])
    assert cores.tolist() == pytest.approx([1.68, 0.30])
    # beyond the band it moves
    cores, _, _ = arbitrate_arrays(
        2.0,
        demand=np.array([3.0, 0.10]),
        previous=np.array([1.68, 0.32]),
        hold=np.zeros(2),
        **base,
        **band,
    )
    assert cores[0] == pytest.approx(1.90)
    # a service below min(demand, fair share) is never held back by the band
    cores, _, _ = arbitrate_arrays(
        2.0,
        demand=np.array([3.0, 3.0]),
        previous=np.array([0.97, 1.03]),
        hold=np.zeros(2),
        **base,
        **band,
    )
    assert cores.tolist() == pytest.approx([1.0, 1.0])


def test_a_held_replica_gives_way_to_another_services_claim_but_a_frozen_one_to_floors_only() -> (
    None
):
    # "long" holds 8 serving replicas at cpu.min (2 cores: the whole budget); "short" (no
    # floor) asks for 2.  A hold that yields leaves "short" its claim (its fair share); a
    # frozen service's hold gives way to floors only.
    base = arrays(minimum=[0, 0], floor=[0, 0], cap=[2, 2], weight=[1, 1], fair=[1, 1])
    args = {
        "demand": np.array([2.0, 2.0]),
        "previous": np.array([2.0, 0.0]),
        "hold": np.array([2.0, 0.0]),
        "hysteresis_cores": 0.05,
        "hysteresis_ratio": 0.05,
    }
    cores, _, _ = arbitrate_arrays(2.0, **base, **args, yielding=np.array([True, True]))
    assert cores.tolist() == pytest.approx([1.0, 1.0])
    frozen, _, _ = arbitrate_arrays(2.0, **base, **args, yielding=np.array([False, True]))
    assert frozen.tolist() == pytest.approx([2.0, 0.0])
    # a hold within its holder's own claim is kept
    kept, _, _ = arbitrate_arrays(
        2.0,
        **{**base, "fair": np.array([1.5, 0.5])},
        **{**args, "hold": np.array([1.5, 0.0])},
        yielding=np.array([True, True]),
    )
    assert kept.tolist() == pytest.approx([1.5, 0.5])


def test_a_hold_that_gives_way_meets_every_claim_and_keeps_whole_replicas() -> None:
    # "long" holds 9 replicas of 0.1 cores (0.9 of a 0.925-core budget); four services wake
    # from zero, claiming their fair shares, one replica each: of 0.1 cores, but 0.25 for
    # "big".  The hold yields
    # what the claims need and each claim is met: the water-fill's level alone (0.2125) would
    # leave "big" short of its one replica, and "mid" (0.2 cap) would take it.
    base = arrays(
        minimum=[0] * 5,
        floor=[0] * 5,
        cap=[1.2, 0.1, 0.1, 0.2, 0.25],
        weight=[1] * 5,
        fair=[0.375, 0.1, 0.1, 0.1, 0.25],
    )
    cores, _, _ = arbitrate_arrays(
        0.925,
        **base,
        demand=np.array([1.2, 0.1, 0.1, 0.2, 0.25]),
        previous=np.array([0.9, 0, 0, 0, 0]),
        hold=np.array([0.9, 0, 0, 0, 0]),
        hysteresis_cores=0.05,
        hysteresis_ratio=0.05,
        yielding=np.ones(5, dtype=bool),
        step=np.array([0.1, 0.1, 0.1, 0.1, 0.25]),
    )
    assert cores[4] == pytest.approx(0.25)
    assert cores.tolist()[:4] == pytest.approx([0.3, 0.1, 0.1, 0.175])
    assert cores.sum() == pytest.approx(0.925)
    # "long" holds 2 replicas of 0.1 (cpu.max 0.15), "short" wakes claiming one of 0.1 (its
    # fair share): the hold gives way by whole replicas (1.6 of them would hold CPU no
    # replica runs on), and the rest is shared by the water-fill
    two = {
        **arrays(minimum=[0, 0], floor=[0, 0], cap=[0.3, 0.5], weight=[1, 1], fair=[0, 0]),
        "fair": np.array([0.1625, 0.1]),
        "demand": np.array([0.3, 0.5]),
        "previous": np.array([0.2, 0.0]),
        "hold": np.array([0.2, 0.0]),
        "hysteresis_cores": 0.05,
        "hysteresis_ratio": 0.05,
        "yielding": np.array([True, True]),
    }
    whole, _, _ = arbitrate_arrays(0.2625, **two, step=np.array([0.1, 0.1]))
    assert whole.tolist() == pytest.approx([0.13125, 0.13125])
    part, _, _ = arbitrate_arrays(0.2625, **two)
    assert part.tolist() == pytest.approx([0.1625, 0.1])


def test_independent_is_first_come_first_served_without_reclaim() -> None:
    p = policy(min_replicas=0, max_replicas=10, cpu={"min": 0.5, "max": 0.5})
    long = IndependentClaim("long", p, 0.5, want_replicas=4, held_replicas=4)
    short = IndependentClaim("short", p, 0.5, want_replicas=3, held_replicas=0)
    granted = arbitrate_independent(2.0, [short, long])
    # "short" comes first in order, but "long" already runs its replicas: nothing is reclaimed
    assert granted == [(0, 0.5), (4, 0.5)]
    long_done = IndependentClaim("long", p, 0.5, want_replicas=1, held_replicas=4)
    assert arbitrate_independent(2.0, [short, long_done]) == [(3, 0.5), (1, 0.5)]
