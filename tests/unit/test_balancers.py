"""Balancers: deterministic picks with an injected random source, and their distributions."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from gateway.dataplane.balancers import make_balancer
from gateway.dataplane.balancers.least_request import LeastRequest, two_distinct
from gateway.dataplane.balancers.peak_ewma import PeakEwma
from gateway.dataplane.balancers.round_robin import RoundRobin
from gateway.dataplane.endpoints import Endpoint


class Scripted:
    """A random source that returns the given floats in order (then repeats the last)."""

    def __init__(self, *values: float) -> None:
        self.values = list(values)

    def random(self) -> float:
        return self.values.pop(0) if len(self.values) > 1 else self.values[0]


def endpoints(n: int) -> tuple[Endpoint, ...]:
    return tuple(Endpoint(f"127.0.0.1:{9000 + i}") for i in range(n))


def test_round_robin_cycles_from_a_random_start() -> None:
    eps = endpoints(3)
    rr = RoundRobin(Scripted(0.0))
    assert [rr.pick(eps).port for _ in range(7)] == [9000, 9001, 9002, 9000, 9001, 9002, 9000]
    rr2 = RoundRobin(Scripted(1 / 1024))
    assert rr2.pick(eps).port == 9001


def test_round_robin_is_exactly_even() -> None:
    eps = endpoints(4)
    rr = RoundRobin(random.Random(1))
    counts = Counter(rr.pick(eps).port for _ in range(4000))
    assert set(counts.values()) == {1000}


def test_two_distinct_is_uniform_over_pairs() -> None:
    rng = random.Random(7)
    counts = Counter(two_distinct(rng, 4) for _ in range(24000))
    assert all(a != b for a, b in counts)
    assert len(counts) == 12
    assert all(1700 < n < 2300 for n in counts.values())


def test_least_request_prefers_the_less_loaded_of_two() -> None:
    eps = endpoints(3)
    eps[0].in_flight = 5
    eps[1].in_flight = 1
    eps[2].in_flight = 3
    lr = LeastRequest(Scripted(0.0, 0.0))  # indices 0 and 1
    assert lr.pick(eps) is eps[1]
    lr = LeastRequest(Scripted(0.99, 0.0))  # indices 2 and 0
    assert lr.pick(eps) is eps[2]
    lr = LeastRequest(Scripted(0.5, 0.0))  # indices 1 and 0 -> 1
    assert lr.pick(eps) is eps[1]


def test_least_request_tie_goes_to_first_sample_and_single_endpoint_shortcut() -> None:
    eps = endpoints(2)
    assert LeastRequest(Scripted(0.0, 0.0)).pick(eps) is eps[0]
    assert LeastRequest(Scripted(0.9, 0.0)).pick(eps) is eps[1]
    one = endpoints(1)
    assert LeastRequest(Scripted(0.5)).pick(one) is one[0]


def test_least_request_never_picks_the_busiest_of_three_when_others_are_idle() -> None:
    eps = endpoints(3)
    eps[2].in_flight = 10
    lr = LeastRequest(random.Random(3))
    counts = Counter(lr.pick(eps).port for _ in range(3000))
    # p2c: the busiest is picked only when both samples... cannot be it (distinct), so never.
    assert counts[9002] == 0
    assert 1300 < counts[9000] < 1700


def test_least_request_balances_in_flight_under_simulated_load() -> None:
    eps = endpoints(4)
    lr = LeastRequest(random.Random(11))
    rng = random.Random(12)
    active: list[Endpoint] = []
    for _ in range(20000):
        ep = lr.pick(eps)
        ep.acquire()
        active.append(ep)
        if len(active) > 40:
            active.pop(rng.randrange(len(active))).release()
    loads = [ep.in_flight for ep in eps]
    assert sum(loads) == 40
    assert max(loads) - min(loads) <= 3


def test_peak_ewma_takes_peaks_at_once_and_decays_over_time() -> None:
    ep = endpoints(1)[0]
    b = PeakEwma(Scripted(0.0), decay_s=10.0)
    b.observe(ep, 0.1, now=0.0)
    assert ep.ewma_s == pytest.approx(0.1)
    b.observe(ep, 0.5, now=1.0)
    assert ep.ewma_s == pytest.approx(0.5)  # peak: up at once
    b.observe(ep, 0.1, now=11.0)  # 10 s later: weight e^-1 on the old value
    assert ep.ewma_s == pytest.approx(0.5 * 0.36787944 + 0.1 * (1 - 0.36787944))


def test_peak_ewma_cost_counts_in_flight_and_defaults_unseen() -> None:
    slow, fast = endpoints(2)
    b = PeakEwma(Scripted(0.0, 0.0), default_latency_s=0.001)
    assert b.cost(slow) == pytest.approx(0.001)
    b.observe(slow, 0.2, 0.0)
    b.observe(fast, 0.01, 0.0)
    fast.in_flight = 9
    assert b.cost(slow) == pytest.approx(0.2)
    assert b.cost(fast) == pytest.approx(0.1)
    assert b.pick((slow, fast)) is fast
    fast.in_flight = 30
    assert b.pick((slow, fast)) is slow


def test_peak_ewma_sends_less_to_a_slow_endpoint() -> None:
    eps = endpoints(3)
    b = PeakEwma(random.Random(5))
    latency = {9000: 0.01, 9001: 0.01, 9002: 0.1}
    counts: Counter[int] = Counter()
    now = 0.0
    for _ in range(6000):
        ep = b.pick(eps)
        counts[ep.port] += 1
        now += 0.001
        b.observe(ep, latency[ep.port], now)
    assert counts[9002] < counts[9000] / 3
    assert counts[9002] < counts[9001] / 3


def test_make_balancer_by_name_and_bad_name() -> None:
    assert isinstance(make_balancer("round_robin", Scripted(0.0)), RoundRobin)
    assert isinstance(make_balancer("least_request"), LeastRequest)
    assert isinstance(make_balancer("peak_ewma"), PeakEwma)
    with pytest.raises(
        ValueError, match="balancer must be one of round_robin, least_request, peak_ewma, got 'x'"
    ):
        make_balancer("x")
    with pytest.raises(ValueError, match="decay_s must be > 0"):
        PeakEwma(Scripted(0.0), decay_s=0)
