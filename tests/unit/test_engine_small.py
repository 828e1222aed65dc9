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

from scaler.decision import Decision, ServiceState
from scaler.engine import Engine
from scaler.engine_small import SMALL_MAX_SERVICES, _sum
from scaler.policy import BudgetConfig, ScalingPolicy
from scaler.signals import ServiceSignals


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


def random_policy(rnd: random.Random) -> ScalingPolicy:
    cpu_min = rnd.choice([0.05, 0.1, 0.25, 0.5])
    cpu_max = cpu_min * rnd.choice([1.0, 1.5, 2.0, 4.0])
    min_r = rnd.randint(0, 2)
    stable = rnd.choice([6.0, 20.0, 60.0])
    return ScalingPolicy(
        mode=rnd.choice(["kpa", "kpa", "kpa", "hpa"]),
        metric=rnd.choice(["concurrency", "concurrency", "rps"]),
        target=rnd.choice([1.0, 2.0, 5.0, 10.0]),
        min_replicas=min_r,
        max_replicas=rnd.randint(max(1, min_r), 10),
        stable_window_s=stable,
        panic_window_s=min(stable, rnd.choice([2.0, 6.0])),
        scale_to_zero_grace_s=rnd.choice([0.0, 5.0, 30.0]),
        max_scale_down_rate=rnd.choice([1.5, 2.0, 10.0]),
        cpu={
            "min": cpu_min,
            "max": cpu_max,
            "request": rnd.choice([None, rnd.uniform(cpu_min, cpu_max)]),
        },
        weight=rnd.choice([0.5, 1.0, 2.0]),
        guaranteed_cpu=rnd.choice([None, min_r * cpu_min + rnd.uniform(0, 0.5)]),
        prefer=rnd.choice(["vertical", "horizontal"]),
    )


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
    floors = sum(p.floor_cores for p in pols.values())
    budget = BudgetConfig(
        cpu=max(0.05, floors + rnd.uniform(0.0, 2.0) * max(1.0, n / 4)),
        arbitration=rnd.choice(["shared", "shared", "shared", "independent"]),
    )
    small, arrays = Engine(pols, budget), Engine(pols, budget, small=False)
    assert small.small and not arrays.small
    measured = rnd.random() < 0.6
    states: dict[str, ServiceState] = {}
    arrivals = dict.fromkeys(pols, 0)
    cpu = dict.fromkeys(pols, 0.0)
    level = {s: rnd.uniform(0, 30) for s in pols}
    now = 0.0
    for _ in range(150):
        # regular ticks, early ones between them, and now and then a long silence
        now += rnd.choice(
            [1.0, 1.0, 1.0, 0.1, 0.25, 0.7, 0.05, 90.0 if rnd.random() < 0.1 else 2.0]
        )
        signals: dict[str, ServiceSignals] = {}
        for s in pols:
            if rnd.random() < 0.1:
                level[s] = rnd.choice([0.0, rnd.uniform(0, 8), rnd.uniform(0, 120)])
            load = max(0.0, level[s] * rnd.uniform(0.7, 1.3))
            arrivals[s] = 0 if rnd.random() < 0.01 else arrivals[s] + int(load)
            cpu[s] += load * 0.01
            roll = rnd.random()
            if roll < 0.03:
                continue  # missing
            at = now - rnd.uniform(4.0, 30.0) if roll < 0.07 else now
            signals[s] = ServiceSignals(
                s,
                at,
                in_flight=int(load),
                queued=rnd.randint(0, 3),
                arrivals_total=arrivals[s],
                rps=load,
                cpu_seconds_total=cpu[s] if measured else None,
                cpu_throttled_seconds_total=(
                    cpu[s] * 0.1 if measured and rnd.random() < 0.5 else None
                ),
            )
        blocked = {s for s in states if rnd.random() < 0.05}
        states = {
            s: ServiceState(s, x.replicas, x.ready_replicas, x.cpu_per_replica_cores, s in blocked)
            for s, x in states.items()
        }
        got, want = small.tick(now, signals, states), arrays.tick(now, signals, states)
        assert list(got) == list(want)
        for s in pols:
            same(got[s], want[s])
        states = {
            s: ServiceState(
                s,
                d.replicas,
                d.replicas if rnd.random() < 0.85 else rnd.randint(0, d.replicas),
                d.cpu_per_replica_cores,
            )
            for s, d in want.items()
        }


def test_many_services_or_unbounded_rates_use_the_arrays() -> None:
    pols = {f"s{i}": ScalingPolicy() for i in range(SMALL_MAX_SERVICES + 1)}
    assert not Engine(pols, BudgetConfig(cpu=100)).small
    assert not Engine(pols, BudgetConfig(cpu=100), small=True).small
    unbounded = {"a": ScalingPolicy(max_scale_up_rate=math.inf)}
    assert not Engine(unbounded, BudgetConfig(cpu=2)).small
    assert Engine({"a": ScalingPolicy()}, BudgetConfig(cpu=2)).small
