"""The engine's two forms, plain Python for a few services and numpy arrays, decide the same.

Two engines, one in each form, get the very same inputs tick after tick (random policies,
loads, irregular tick times and long silences, missing and stale signals, blocked resizes,
measured CPU or not) and must give the very same decisions: every number bit for bit, the
same rule, wake level, reasons and inputs.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from scaler.decision import Decision
from scaler.engine import Engine
from scaler.engine_small import SMALL_MAX_SERVICES, _sum
from scaler.policy import BudgetConfig, ScalingPolicy
from tests.support.random_loops import RandomLoad, random_budget, random_policy


def test_sum_is_numpys_sum() -> None:
    rnd = random.Random(4)
    for _ in range(3000):
        n = rnd.randint(0, 140)
        values = [
            rnd.choice([rnd.random(), rnd.random() * 1e3, rnd.uniform(-1, 1) * 1e-3, 0.1, 0.0])
            for _ in range(n)
        ]
        expected = float(np.add.reduce(np.array(values, dtype=np.float64)))
        assert _sum(values) == expected, values


def same(a: Decision, b: Decision) -> None:
    for key in ("replicas", "cpu_per_replica_cores", "allocated_cores", "wake_concurrency"):
        x, y = getattr(a, key), getattr(b, key)
        assert x == y or (math.isnan(x) and math.isnan(y)), (a.service, key, x, y)
    assert (a.rule, a.frozen) == (b.rule, b.frozen), a.service
    assert a.reasons == b.reasons, a.service
    assert a.inputs.keys() == b.inputs.keys(), a.service
    for key, x in a.inputs.items():
        y = b.inputs[key]
        assert x == y or (math.isnan(x) and math.isnan(y)), (a.service, key, x, y)


@pytest.mark.parametrize("seed", range(24))
def test_both_forms_decide_the_same(seed: int) -> None:
    rnd = random.Random(seed)
    n = rnd.choice([1, 2, 3, 4, 7, 10, 16, SMALL_MAX_SERVICES])
    pols = {f"s{i}": random_policy(rnd) for i in range(n)}
    budget = random_budget(rnd, pols)
    small, arrays = Engine(pols, budget), Engine(pols, budget, small=False)
    assert small.small and not arrays.small
    measured = rnd.random() < 0.6
    load = RandomLoad(rnd, pols, measured)
    now = 0.0
    for _ in range(150):
        # regular ticks, early ones between them, and now and then a long silence
        now += rnd.choice(
            [1.0, 1.0, 1.0, 0.1, 0.25, 0.7, 0.05, 90.0 if rnd.random() < 0.1 else 2.0]
        )
        signals, states = load.tick(now)
        got, want = small.tick(now, signals, states), arrays.tick(now, signals, states)
        assert list(got) == list(want)
        for s in pols:
            same(got[s], want[s])
        load.applied(want)


def test_many_services_or_unbounded_rates_use_the_arrays() -> None:
    pols = {f"s{i}": ScalingPolicy() for i in range(SMALL_MAX_SERVICES + 1)}
    assert not Engine(pols, BudgetConfig(cpu=100)).small
    assert not Engine(pols, BudgetConfig(cpu=100), small=True).small
    unbounded = {"a": ScalingPolicy(max_scale_up_rate=math.inf)}
    assert not Engine(unbounded, BudgetConfig(cpu=2)).small
    assert Engine({"a": ScalingPolicy()}, BudgetConfig(cpu=2)).small
