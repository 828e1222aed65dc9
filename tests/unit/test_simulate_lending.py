"""Limit enforcement with lending in the simulator (``budget.lending``), exactly.

Hand-computed cases (an idle service's quota, or an idle replica's, goes to the busy replicas
after the hold and comes back at its next request), the rule's bounds at many instants, and: when nothing is ever lent, the
event loop gives what limit enforcement gives each service on its own.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping

import numpy as np
import pytest

from scaler.simulate.arrivals import Arrivals
from scaler.simulate.loop import EventLoop, Lending
from scaler.simulate.model import PENDING, READY, Node, ServiceModel
from tests.support.sim_scenarios import placed, requests, service


def on_node(
    capacity: float,
    targets: Mapping[ServiceModel, tuple[int, float]],
    *,
    after_idle_s: float,
    floor: float = 0.25,
    replicas: bool = False,
) -> tuple[EventLoop, Node]:
    node = placed(capacity, targets)
    models = node.services
    lending = Lending(
        after_idle_s, dict.fromkeys(models, floor), dict.fromkeys(models, 1.0), replicas=replicas
    )
    return EventLoop(capacity, models, rule="limit", lending=lending), node


def test_an_idle_service_lends_after_the_hold_and_takes_it_back_at_its_next_request() -> None:
    a = service("a", requests((0.0, 10.0)))  # one long single-threaded request: wants 1 core
    b = service("b", requests((2.0, 0.3)))
    cpu, _ = on_node(2.0, {a: (1, 0.5), b: (1, 1.0)}, after_idle_s=0.1)
    cpu.run(3.0)
    # b idle from 0, marked at 0.1: it lends 1.0 - 0.25; a takes 0.5 of it (up to cpu.max 1).
    # b's request at 2.0 takes it back at once: it runs at b's full core, 0.3 s; b is idle
    # again at 2.3, marked at 2.4.  a: 0.1 s at 0.5, 1.9 s at 1, 0.4 s at 0.5, 0.6 s at 1.
    assert b.latencies == [pytest.approx(0.3)]
    assert a.cpu_seconds_total == pytest.approx(0.05 + 1.9 + 0.2 + 0.6)
    assert a.throttled_seconds_total == pytest.approx(0.5)  # held at its own quota
    assert cpu.lends >= 4


def test_an_idle_replica_of_a_busy_service_lends_and_its_next_request_takes_it_back() -> None:
    a = service("a", requests((0.0, 10.0), (1.0, 0.1)))  # one replica busy, one idle
    b = service("b", requests((0.0, 10.0)))
    cpu, _ = on_node(3.0, {a: (2, 0.5), b: (1, 0.5)}, after_idle_s=0.1, replicas=True)
    cpu.run(2.0)
    # a's second replica is marked idle at 0.1: it keeps a's floor over its 2 replicas
    # (0.125) and lends 0.375, shared by a's busy replica and b's (room 0.5 each): 0.1875
    # each.  a's request at 1.0 goes to it and takes its 0.5 back: 0.1 CPU-s in 0.2 s; it is
    # marked idle again at 1.3.
    assert a.latencies == [pytest.approx(0.2)]
    lent = 0.5 + 0.1875
    assert b.cpu_seconds_total == pytest.approx(0.1 * 0.5 + 0.9 * lent + 0.3 * 0.5 + 0.7 * lent)
    assert a.cpu_seconds_total == pytest.approx(b.cpu_seconds_total + 0.1)


def test_gaps_shorter_than_the_hold_lend_nothing() -> None:
    a = service("a", requests((0.0, 10.0)))
    b = service("b", requests(*((0.05 * k, 0.01) for k in range(40))))  # busy every 50 ms
    cpu, _ = on_node(2.0, {a: (1, 0.5), b: (1, 1.0)}, after_idle_s=0.1)
    cpu.run(1.9)
    assert a.cpu_seconds_total == pytest.approx(0.5 * 1.9)
    assert len(b.latencies) == 38 and max(b.latencies) == pytest.approx(0.01)


def test_what_is_lent_is_shared_by_the_busy_and_never_above_cpu_max() -> None:
    a = service("a", requests((0.0, 10.0), (0.0, 10.0)), cores_max=0.75)
    c = service("c", requests((0.0, 10.0)), cores_max=2.0)
    b = service("b", requests())
    cpu, _ = on_node(4.0, {a: (2, 0.5), c: (1, 0.5), b: (2, 1.0)}, after_idle_s=0.0)
    cpu.run(1.0)
    # b lends 2 x 0.75 = 1.5: a has room 2 x 0.25 = 0.5 (its cpu.max), c takes the rest, 1.0;
    # c's one request is single-threaded: it uses 1 core of its 1.5 quota
    rates = cpu.rates()
    assert rates["a"] == [pytest.approx(0.75), pytest.approx(0.75)]
    assert rates["c"] == [pytest.approx(1.0)]
    assert a.cpu_seconds_total == pytest.approx(1.5)
    assert c.cpu_seconds_total == pytest.approx(1.0)


def random_arrivals(rng: random.Random, rate: float, until: float) -> Arrivals:
    times: list[float] = []
    t = rng.expovariate(rate)
    while t < until:
        times.append(t)
        t += rng.expovariate(rate)
    works = [rng.expovariate(1 / 0.08) for _ in times]
    return Arrivals(np.array(times), np.array(works))


@pytest.mark.parametrize("seed", range(5))
def test_never_lending_is_limit_enforcement_service_by_service(seed: int) -> None:
    rng = random.Random(seed)
    arrivals = {n: random_arrivals(rng, rng.uniform(2, 20), 30.0) for n in ("a", "b", "c")}
    shape = {"a": (2, 0.5), "b": (1, 0.75), "c": (3, 0.25)}

    def models() -> dict[str, ServiceModel]:
        return {n: service(n, arrivals[n]) for n in arrivals}

    lent = models()
    cpu, _ = on_node(
        3.0, {lent[n]: shape[n] for n in lent}, after_idle_s=math.inf
    )  # the hold never ends: nothing is ever lent
    alone = models()
    node = Node(3.0, alone)
    claims = node.claims()
    for n, m in alone.items():
        m.set_target(*shape[n], claims)
    node.schedule(0.0)
    for m in alone.values():
        for r in m.replicas:
            if r.phase != PENDING:
                r.phase = READY
    plain = EventLoop(3.0, alone, rule="limit")
    for k in range(30):
        cpu.run(float(k + 1))
        plain.run(float(k + 1))
    for n in arrivals:
        assert lent[n].latencies == pytest.approx(alone[n].latencies, abs=1e-9)
        assert lent[n].cpu_seconds_total == pytest.approx(alone[n].cpu_seconds_total, abs=1e-9)
        assert lent[n].throttled_seconds_total == pytest.approx(
            alone[n].throttled_seconds_total, abs=1e-9
        )


@pytest.mark.parametrize("replicas", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_at_every_instant_the_quotas_in_force_fit_what_the_decisions_hold(
    seed: int, replicas: bool
) -> None:
    rng = random.Random(100 + seed)
    arrivals = {n: random_arrivals(rng, rng.uniform(1, 15), 20.0) for n in ("a", "b", "c")}
    ms = {n: service(n, arrivals[n], cores_max=1.0) for n in arrivals}
    shape = {"a": (2, 0.5), "b": (1, 0.75), "c": (2, 0.25)}
    cpu, _ = on_node(
        3.0,
        {ms[n]: shape[n] for n in ms},
        after_idle_s=rng.choice([0.0, 0.02]),
        replicas=replicas,
    )
    held = sum(r * c for r, c in shape.values())
    t = 0.0
    lent_some = False
    while t < 20.0:
        t += rng.uniform(0.001, 0.2)
        cpu.run(t)
        rates = cpu.rates()
        assert math.fsum(x for xs in rates.values() for x in xs) <= held + 1e-9
        for n, xs in rates.items():
            assert all(x <= 1.0 + 1e-9 for x in xs)  # cpu.max
            lent_some = lent_some or any(x > shape[n][1] + 1e-9 for x in xs)
    assert lent_some
    for m in ms.values():
        assert m.completions_total + m.concurrency == m.arrivals_total  # nothing lost


def test_without_lending_per_replica_an_idle_replica_of_a_busy_service_lends_nothing() -> None:
    a = service("a", requests((0.0, 10.0), (1.0, 0.1)))
    b = service("b", requests((0.0, 10.0)))
    node = placed(3.0, {a: (2, 0.5), b: (1, 0.5)})
    models = node.services
    lending = Lending(0.1, dict.fromkeys(models, 0.25), dict.fromkeys(models, 1.0), replicas=False)
    cpu = EventLoop(3.0, models, rule="limit", lending=lending)
    cpu.run(2.0)
    assert b.cpu_seconds_total == pytest.approx(2.0 * 0.5)  # budget.lend_replicas: false
    assert a.latencies == [pytest.approx(0.2)]
