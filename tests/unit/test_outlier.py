"""Outlier detection: consecutive failures eject, growing backoff, the percent cap."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from gateway.dataplane.outlier import OutlierDetector
from gateway.settings import HealthCheckConfig, OutlierDetectionConfig
from tests.support.stepped_loop import SteppedLoop


@dataclass
class Ep:
    address: str
    ejected: bool = False


class Table:
    def __init__(self, *addresses: str) -> None:
        self._eps = {a: Ep(a) for a in addresses}
        self.log: list[tuple[str, bool]] = []

    @property
    def endpoints(self) -> tuple[Ep, ...]:
        return tuple(self._eps.values())

    def eject(self, address: str, ejected: bool = True) -> None:
        self._eps[address].ejected = ejected
        self.log.append((address, ejected))

    def routable(self) -> list[str]:
        return [a for a, e in self._eps.items() if not e.ejected]


@pytest.fixture
def loop() -> Iterator[SteppedLoop]:
    lp = SteppedLoop()
    yield lp
    lp.close()


CFG = OutlierDetectionConfig(
    consecutive_failures=3, base_ejection_s=10, max_ejection_s=25, max_ejection_percent=50
)


def fail(det: OutlierDetector, loop: SteppedLoop, address: str, n: int) -> list[bool]:
    return [det.failure(address, loop.time()) for _ in range(n)]


def test_consecutive_failures_eject_then_return(loop: SteppedLoop) -> None:
    table = Table("a:1", "b:1")
    det = OutlierDetector("api", CFG, table, loop=loop)
    assert fail(det, loop, "a:1", 3) == [False, False, True]
    assert table.routable() == ["b:1"]
    loop.advance(9.9)
    assert table.routable() == ["b:1"]
    loop.advance(0.2)
    assert table.routable() == ["a:1", "b:1"]


def test_a_success_resets_the_count(loop: SteppedLoop) -> None:
    table = Table("a:1", "b:1")
    det = OutlierDetector("api", CFG, table, loop=loop)
    fail(det, loop, "a:1", 2)
    det.success("a:1", loop.time())
    assert fail(det, loop, "a:1", 2) == [False, False]
    assert table.routable() == ["a:1", "b:1"]


def test_repeat_ejections_last_longer_up_to_the_cap(loop: SteppedLoop) -> None:
    table = Table("a:1", "b:1")
    det = OutlierDetector("api", CFG, table, loop=loop)
    lengths = []
    for _ in range(4):
        assert fail(det, loop, "a:1", 3)[-1]
        start = loop.time()
        while "a:1" not in table.routable():
            loop.advance(0.5)
        lengths.append(round(loop.time() - start))
    assert lengths == [10, 20, 25, 25]


def test_ejection_count_resets_after_a_clean_period(loop: SteppedLoop) -> None:
    table = Table("a:1", "b:1")
    det = OutlierDetector("api", CFG, table, loop=loop)
    fail(det, loop, "a:1", 3)
    loop.advance(10.1)
    loop.advance(30)
    det.success("a:1", loop.time())
    fail(det, loop, "a:1", 3)
    loop.advance(10.1)
    assert "a:1" in table.routable()  # back after the base length again


def test_never_more_than_max_ejection_percent(loop: SteppedLoop) -> None:
    table = Table("a:1", "b:1", "c:1", "d:1")
    det = OutlierDetector("api", CFG, table, loop=loop)
    assert fail(det, loop, "a:1", 3)[-1]
    assert fail(det, loop, "b:1", 3)[-1]
    assert fail(det, loop, "c:1", 3) == [False, False, False]  # 3 of 4 would exceed 50 %
    assert det.skipped_total == 1
    assert table.routable() == ["c:1", "d:1"]


def test_the_last_endpoint_is_never_ejected(loop: SteppedLoop) -> None:
    table = Table("a:1")
    det = OutlierDetector(
        "api",
        OutlierDetectionConfig(max_ejection_percent=100, consecutive_failures=1),
        table,
        loop=loop,
    )
    assert det.failure("a:1", loop.time()) is False
    assert table.routable() == ["a:1"]


def test_disabled_detection_ejects_nothing(loop: SteppedLoop) -> None:
    table = Table("a:1", "b:1")
    det = OutlierDetector("api", OutlierDetectionConfig(enabled=False), table, loop=loop)
    assert not any(fail(det, loop, "a:1", 50))


def test_disabling_returns_ejected_endpoints(loop: SteppedLoop) -> None:
    table = Table("a:1", "b:1")
    det = OutlierDetector("api", CFG, table, loop=loop)
    fail(det, loop, "a:1", 3)
    det.configure(CFG.model_copy(update={"enabled": False}))
    assert table.routable() == ["a:1", "b:1"]


def test_health_checks_eject_until_healthy(loop: SteppedLoop) -> None:
    table = Table("a:1", "b:1")
    det = OutlierDetector("api", CFG, table, loop=loop)
    check = HealthCheckConfig(unhealthy_threshold=2, healthy_threshold=2)
    det.check_result("a:1", False, check)
    assert table.routable() == ["a:1", "b:1"]
    det.check_result("a:1", False, check)
    assert table.routable() == ["b:1"]
    loop.advance(1000)  # no timer: stays out until the checks pass
    det.check_result("a:1", True, check)
    assert table.routable() == ["b:1"]
    det.check_result("a:1", True, check)
    assert table.routable() == ["a:1", "b:1"]


def test_forget_cancels_the_return_timer(loop: SteppedLoop) -> None:
    table = Table("a:1", "b:1")
    det = OutlierDetector("api", CFG, table, loop=loop)
    fail(det, loop, "a:1", 3)
    det.forget("a:1")
    loop.advance(100)
    assert table.log == [("a:1", True)]
    det.close()


def test_a_restarted_endpoint_is_readmitted_and_frees_its_ejection_slot(loop: SteppedLoop) -> None:
    """Issue 20, item 6: with one ejection allowed, an ejected replica that came back must not
    keep a dead one in rotation."""
    table = Table("a:1", "b:1", "c:1")
    det = OutlierDetector("api", CFG, table, loop=loop)  # 50 % of 3: one at a time
    assert fail(det, loop, "a:1", 3)[-1] is True
    assert fail(det, loop, "b:1", 3)[-1] is False  # the cap: a holds the only slot
    det.readmit("a:1")
    assert table.routable() == ["a:1", "b:1", "c:1"]
    assert fail(det, loop, "b:1", 3)[-1] is True
    assert table.routable() == ["a:1", "c:1"]
    loop.advance(60)  # a's cancelled return timer does nothing
    assert table.routable() == ["a:1", "b:1", "c:1"]
