"""QuotaLender: idle marks after the hold, synchronous reclaim, re-apply on decisions.

The pool is a small in-memory stand-in keeping the decided CPU and the overlays (the real
pool writing cgroups is tested in tests/integration/test_local_lending.py); time is a
stepped loop clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import pytest

from gateway.platforms.local.lender import QuotaLender
from gateway.settings import parse_settings
from scaler.lending import idle_floor
from scaler.policy import ScalingPolicy
from tests.support.stepped_loop import SteppedLoop

HOLD_S = 0.02
KEEP = 0.1
"""What an idle replica keeps (``keep_cores``; the budget's default is 0.01)."""


class MemoryPool:
    """Decided CPU and replicas per service; the quotas in force = decided unless overlaid."""

    def __init__(self, decided: dict[str, tuple[int, float]], total_cpu_cores: float) -> None:
        self.decided = dict(decided)
        self.overlays: dict[str, float | None] = dict.fromkeys(decided)
        self.total_cpu_cores: float | None = total_cpu_cores
        self.on_holdings_change: Callable[[], None] | None = None
        self.writes = 0
        self.serving: dict[str, tuple[str, ...]] = dict.fromkeys(decided, ())
        """Per service, its ready replicas' addresses (none unless a test says so)."""
        self.replica_overlays: dict[str, dict[str, float]] = {}

    @property
    def services(self) -> list[str]:
        return list(self.decided)

    def cpu_holding(self, service: str) -> tuple[int, float | None]:
        return self.decided[service]

    def set_quota_overlays(
        self,
        overlays: Mapping[str, float | None],
        replicas: Mapping[str, Mapping[str, float]] | None = None,
    ) -> None:
        self.overlays.update(overlays)
        for name in overlays:
            self.replica_overlays[name] = dict((replicas or {}).get(name, {}))
        self.writes += 1

    def serving_addresses(self, service: str) -> tuple[str, ...]:
        return self.serving[service]

    def replica_in_force(self, service: str, address: str) -> float:
        own = self.replica_overlays.get(service, {}).get(address)
        return self.in_force(service) if own is None else own

    def decide(self, service: str, replicas: int, cores: float) -> None:
        """What the pool does on a decision: record it, let the lender re-apply."""
        self.decided[service] = (replicas, cores)
        if self.on_holdings_change is not None:
            self.on_holdings_change()

    def in_force(self, service: str) -> float:
        overlay = self.overlays[service]
        return self.decided[service][1] if overlay is None else overlay

    def total_in_force(self) -> float:
        total = 0.0
        for n, (r, _) in self.decided.items():
            own = self.replica_overlays.get(n, {})
            total += (r - len(own)) * self.in_force(n) + sum(own.values())
        return total

    def total_decided(self) -> float:
        return sum(r * c for r, c in self.decided.values())


def policy(cpu_min: float = 0.1, cpu_max: float = 1.5, weight: float = 1.0) -> ScalingPolicy:
    return ScalingPolicy.model_validate(
        {"min_replicas": 1, "cpu": {"min": cpu_min, "max": cpu_max}, "weight": weight}
    )


@pytest.fixture
def loop() -> Iterator[SteppedLoop]:
    lp = SteppedLoop()
    yield lp
    lp.close()


def setup(loop: SteppedLoop) -> tuple[MemoryPool, QuotaLender]:
    pool = MemoryPool({"api": (1, 0.5), "reports": (1, 1.0)}, total_cpu_cores=2.0)
    lender = QuotaLender(
        pool, {"api": policy(), "reports": policy()}, HOLD_S, loop, keep_cores=KEEP
    )
    lender.start()
    return pool, lender


def test_a_service_idle_for_the_hold_lends_to_the_busy_one(loop: SteppedLoop) -> None:
    pool, lender = setup(loop)
    lender.set_busy("reports", False)
    loop.advance(HOLD_S / 2)
    assert lender.idle == set()
    assert pool.in_force("reports") == 1.0
    loop.advance(HOLD_S)
    assert lender.idle == {"reports"}
    assert pool.in_force("reports") == pytest.approx(0.1)
    # api (busy) gets what reports gave up, up to its cpu.max (1.5).
    assert pool.in_force("api") == pytest.approx(1.4)
    assert pool.total_in_force() <= pool.total_decided() + 1e-9
    assert lender.lent_cores() == {"api": pytest.approx(0.9), "reports": pytest.approx(-0.9)}


def test_busy_before_the_hold_ends_cancels_the_lending(loop: SteppedLoop) -> None:
    pool, lender = setup(loop)
    lender.set_busy("reports", False)
    loop.advance(HOLD_S / 2)
    lender.set_busy("reports", True)
    loop.advance(HOLD_S * 5)
    assert lender.idle == set()
    assert pool.overlays == {"api": None, "reports": None}


def test_idle_again_after_a_short_burst_waits_a_whole_hold_from_then(loop: SteppedLoop) -> None:
    _pool, lender = setup(loop)
    lender.set_busy("reports", False)
    loop.advance(HOLD_S * 0.6)
    lender.set_busy("reports", True)
    lender.set_busy("reports", False)  # idle again at 0.6 hold: idle from now on
    loop.advance(HOLD_S * 0.6)  # the first timer fires: only 0.6 hold of this idle spell
    assert lender.idle == set()
    loop.advance(HOLD_S * 0.6)
    assert lender.idle == {"reports"}


def test_the_first_request_reclaims_synchronously(loop: SteppedLoop) -> None:
    pool, lender = setup(loop)
    lender.set_busy("reports", False)
    loop.advance(HOLD_S * 2)
    assert pool.in_force("api") > 0.5
    # No loop step between the request's arrival and the check: it is done in the call.
    lender.set_busy("reports", True)
    assert lender.idle == set()
    assert pool.in_force("reports") == 1.0
    assert pool.in_force("api") == 0.5


def test_a_decision_while_lent_re_applies_on_top_of_it(loop: SteppedLoop) -> None:
    pool, lender = setup(loop)
    lender.set_busy("reports", False)
    loop.advance(HOLD_S * 2)
    assert pool.in_force("api") == pytest.approx(1.4)
    # The next tick moves CPU: reports 0.4, api 1.2 (decided); reports still idle.
    pool.decide("reports", 1, 0.4)
    pool.decide("api", 1, 1.2)
    assert pool.in_force("reports") == pytest.approx(0.1)
    assert pool.in_force("api") == pytest.approx(1.5)  # 1.2 + 0.3 lent, capped at cpu.max
    assert pool.total_in_force() <= pool.total_decided() + 1e-9
    # A second replica for api: the lent 0.3 is spread over both.
    pool.decide("api", 2, 0.8)
    assert pool.in_force("api") == pytest.approx(0.8 + 0.3 / 2)
    assert pool.total_in_force() <= pool.total_decided() + 1e-9


def test_two_idle_services_and_a_weighted_split(loop: SteppedLoop) -> None:
    pool = MemoryPool({"a": (1, 0.5), "b": (1, 0.5), "c": (2, 0.5)}, total_cpu_cores=2.0)
    policies = {"a": policy(weight=3.0), "b": policy(weight=1.0), "c": policy()}
    lender = QuotaLender(pool, policies, HOLD_S, loop, keep_cores=KEEP)
    lender.start()
    lender.set_busy("c", False)
    loop.advance(HOLD_S * 2)
    # c's 2 x (0.5 - 0.1) = 0.8 shared 3:1 by the busy a and b.
    assert pool.in_force("a") == pytest.approx(0.5 + 0.6)
    assert pool.in_force("b") == pytest.approx(0.5 + 0.2)
    lender.set_busy("a", False)
    loop.advance(HOLD_S * 2)
    assert lender.idle == {"a", "c"}
    assert pool.in_force("a") == pytest.approx(0.1)
    assert pool.in_force("b") == pytest.approx(1.5)  # capped at its cpu.max
    assert pool.total_in_force() <= pool.total_decided() + 1e-9


def test_an_idle_service_keeps_its_floor_over_its_replicas_and_lends_the_rest(
    loop: SteppedLoop,
) -> None:
    # reports: 4 warm replicas of 1.0 core, floor 1 × cpu.min = 0.1; api borrows up to 1.5.
    pool = MemoryPool({"api": (1, 0.5), "reports": (4, 1.0)}, total_cpu_cores=5.0)
    lender = QuotaLender(pool, {"api": policy(), "reports": policy()}, HOLD_S, loop)
    lender.start()
    lender.set_busy("reports", False)
    loop.advance(HOLD_S * 2)
    # Its floor spread over its replicas (0.1 / 4), not cpu.min each: its next request takes
    # the decided quota back before it is forwarded.
    assert pool.in_force("reports") == pytest.approx(0.025)
    assert pool.in_force("api") == pytest.approx(1.5)
    assert pool.total_in_force() <= pool.total_decided() + 1e-9


def test_an_idle_replica_keeps_at_least_the_kernels_smallest_quota() -> None:
    assert idle_floor(4, 0.1, 0.01) == pytest.approx(0.025)
    assert idle_floor(20, 0.1, 0.01) == pytest.approx(0.01)  # 1 ms per 100 ms period
    assert idle_floor(1, 0.1, 0.01) == pytest.approx(0.1)


def test_an_idle_service_keeps_a_decided_cpu_below_its_floor(loop: SteppedLoop) -> None:
    pool, lender = setup(loop)
    pool.decide("reports", 1, 0.05)
    lender.set_busy("reports", False)
    loop.advance(HOLD_S * 2)
    assert pool.in_force("reports") == pytest.approx(0.05)


def test_repeated_transitions_keep_one_timer_and_do_not_re_apply(loop: SteppedLoop) -> None:
    pool, lender = setup(loop)
    writes = pool.writes
    for _ in range(100):
        lender.set_busy("api", False)
        lender.set_busy("api", True)
    assert len(loop._scheduled) <= 1
    assert pool.writes == writes  # nothing was marked idle, nothing written
    assert lender.applies == 0


def test_stop_returns_every_quota_to_the_decided_cpu(loop: SteppedLoop) -> None:
    pool, lender = setup(loop)
    lender.set_busy("reports", False)
    loop.advance(HOLD_S * 2)
    lender.stop()
    assert pool.overlays == {"api": None, "reports": None}
    assert pool.on_holdings_change is None
    lender.set_busy("reports", False)
    loop.advance(HOLD_S * 2)  # no longer attached: nothing marked
    assert lender.idle == set()


def test_zero_hold_marks_idle_at_the_next_loop_step(loop: SteppedLoop) -> None:
    pool = MemoryPool({"api": (1, 0.5), "reports": (1, 1.0)}, total_cpu_cores=2.0)
    lender = QuotaLender(pool, {"api": policy(), "reports": policy()}, 0.0, loop, keep_cores=KEEP)
    lender.start()
    lender.set_busy("reports", False)
    assert lender.idle == set()
    loop.settle()
    assert lender.idle == {"reports"}
    with pytest.raises(ValueError, match="hold_s"):
        QuotaLender(pool, {}, -1.0, loop)


def two_replicas(loop: SteppedLoop) -> tuple[MemoryPool, QuotaLender]:
    """api on replicas a1 (busy) and a2 (no request yet), reports on r1 (busy), lending per
    replica."""
    pool = MemoryPool({"api": (2, 0.5), "reports": (1, 1.0)}, total_cpu_cores=2.0)
    pool.serving = {"api": ("a1", "a2"), "reports": ("r1",)}
    lender = QuotaLender(
        pool, {"api": policy(), "reports": policy()}, HOLD_S, loop, keep_cores=KEEP, replicas=True
    )
    lender.start()
    lender.set_replica_busy("api", "a1", True)
    lender.set_replica_busy("reports", "r1", True)
    return pool, lender


def test_an_idle_replica_of_a_busy_service_lends_and_its_next_request_takes_it_back(
    loop: SteppedLoop,
) -> None:
    pool, lender = two_replicas(loop)
    loop.advance(HOLD_S * 2)  # a2 has had no request since the lender started
    assert lender.idle == set()
    assert lender.idle_replicas == {"api": {"a2"}, "reports": set()}
    # a2 keeps api's floor over its 2 replicas (0.1) and lends 0.4: to api's busy replica
    # and to reports' (room 1.0 and 0.5), 0.2 each.
    assert pool.replica_in_force("api", "a2") == pytest.approx(0.1)
    assert pool.replica_in_force("api", "a1") == pytest.approx(0.7)
    assert pool.in_force("reports") == pytest.approx(1.2)
    assert pool.total_in_force() == pytest.approx(pool.total_decided())
    assert lender.lent_cores() == {"api": pytest.approx(-0.2), "reports": pytest.approx(0.2)}
    # A request sent to a2 takes the quota back before it goes on.
    lender.set_replica_busy("api", "a2", True)
    assert lender.idle_replicas["api"] == set()
    assert pool.replica_in_force("api", "a2") == 0.5
    assert pool.in_force("api") == 0.5
    assert pool.in_force("reports") == 1.0


def test_a_replica_that_stops_serving_no_longer_lends(loop: SteppedLoop) -> None:
    pool, lender = two_replicas(loop)
    loop.advance(HOLD_S * 2)
    assert pool.in_force("reports") > 1.0
    pool.serving = {"api": ("a1",), "reports": ("r1",)}
    pool.decide("api", 1, 0.5)  # a2 is gone
    assert lender.idle_replicas["api"] == set()
    assert pool.in_force("reports") == 1.0
    assert pool.total_in_force() <= pool.total_decided() + 1e-9


def test_a_replica_busy_again_within_the_hold_lends_nothing(loop: SteppedLoop) -> None:
    _, lender = two_replicas(loop)
    lender.set_replica_busy("api", "a2", True)
    for _ in range(5):
        lender.set_replica_busy("api", "a2", False)
        loop.advance(HOLD_S * 0.5)
        lender.set_replica_busy("api", "a2", True)
    loop.advance(HOLD_S * 3)
    assert lender.idle_replicas["api"] == set()
    assert lender.applies == 0


def test_lending_per_replica_is_on_by_default_and_can_be_turned_off(loop: SteppedLoop) -> None:
    settings = parse_settings({"budget": {"cpu": 2, "enforcement": "limit"}, "services": {}})
    assert settings.budget.lend_replicas is True
    off = {"budget": {"cpu": 2, "enforcement": "limit", "lend_replicas": False}, "services": {}}
    assert parse_settings(off).budget.lend_replicas is False
    pool = MemoryPool({"api": (2, 0.5), "reports": (1, 1.0)}, total_cpu_cores=2.0)
    pool.serving = {"api": ("a1", "a2"), "reports": ("r1",)}
    lender = QuotaLender(pool, {"api": policy(), "reports": policy()}, HOLD_S, loop)
    lender.start()
    lender.set_replica_busy("api", "a1", True)
    loop.advance(HOLD_S * 3)
    assert lender.idle_replicas == {"api": set(), "reports": set()}
    assert lender.applies == 0


def test_an_idle_edge_relayed_after_its_hold_lends_at_once(loop: SteppedLoop) -> None:
    """Worker processes report an endpoint idle once it has been idle there for the hold:
    the main process marks it idle without waiting a second hold."""
    pool, lender = two_replicas(loop)
    lender.set_replica_busy("api", "a2", True)
    lender.set_replica_busy("api", "a2", False, True)
    assert lender.idle_replicas["api"] == {"a2"}
    assert pool.replica_in_force("api", "a2") == pytest.approx(0.1)
