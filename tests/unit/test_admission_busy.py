"""Admission's busy/idle hook: called only when slots taken + queued leave or return to 0."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from gateway.dataplane.admission import Admission, AdmissionError, QueueFull, RateLimited, Waiter
from gateway.settings import QueueConfig, RateLimitConfig, ServiceLimits
from tests.support.stepped_loop import SteppedLoop


@pytest.fixture
def loop() -> Iterator[SteppedLoop]:
    lp = SteppedLoop()
    yield lp
    lp.close()


def limits(
    per: int | None = 1, qmax: int = 10, timeout_s: float = 5.0, **kw: object
) -> ServiceLimits:
    return ServiceLimits(
        concurrency_per_replica=per, queue=QueueConfig(max=qmax, timeout_s=timeout_s), **kw
    )


class Watch:
    """Records the hook's calls and checks each one against the admission's counts."""

    def __init__(self, adm: Admission) -> None:
        self.adm = adm
        self.calls: list[bool] = []
        adm.watch_busy(self)

    def __call__(self, busy: bool) -> None:
        assert self.adm.busy == busy, (busy, self.adm)
        assert not self.calls or self.calls[-1] != busy, "two calls in a row say the same"
        self.calls.append(busy)


def ignore(*_: object) -> None:
    return None


def rejected(
    errors: list[str],
) -> tuple[Callable[[float], None], Callable[[AdmissionError], None]]:
    def on_admit(wait_s: float) -> None:
        errors.append("admitted")

    def on_reject(e: AdmissionError) -> None:
        errors.append(e.code)

    return on_admit, on_reject


def test_busy_on_the_first_slot_idle_when_the_last_is_released(loop: SteppedLoop) -> None:
    adm = Admission("api", limits(per=None), replicas=1, loop=loop)
    w = Watch(adm)
    assert adm.try_take()
    assert w.calls == [True]
    assert adm.admit(ignore, ignore) is None  # 1 -> 2: no call
    assert adm.try_take()  # 2 -> 3
    assert w.calls == [True]
    adm.release()  # 3 -> 2
    adm.release()  # 2 -> 1
    assert w.calls == [True]
    adm.release()  # 1 -> 0
    assert w.calls == [True, False]
    assert adm.admit(ignore, ignore) is None  # the admit fast path: 0 -> 1
    assert w.calls == [True, False, True]
    adm.release()
    assert w.calls == [True, False, True, False]


def test_a_queued_request_makes_the_service_busy_and_moving_to_a_slot_is_no_change(
    loop: SteppedLoop,
) -> None:
    adm = Admission("api", limits(per=1), replicas=0, loop=loop)  # no capacity yet
    w = Watch(adm)
    waiter = adm.admit(ignore, ignore)
    assert isinstance(waiter, Waiter)
    assert w.calls == [True]
    adm.set_replicas(1)
    loop.settle()  # the waiter takes the slot (queued 1 -> 0, in use 0 -> 1): still busy
    assert (adm.in_use, adm.queued) == (1, 0)
    assert w.calls == [True]
    adm.release()
    assert w.calls == [True, False]


def test_release_with_waiters_left_is_not_idle(loop: SteppedLoop) -> None:
    adm = Admission("api", limits(per=1), replicas=1, loop=loop)
    w = Watch(adm)
    assert adm.try_take()
    assert isinstance(adm.admit(ignore, ignore), Waiter)
    adm.release()  # in use 0, one queued: busy
    assert w.calls == [True]
    loop.settle()
    adm.release()
    assert w.calls == [True, False]


def test_an_abandoned_waiter_leaving_the_service_empty_is_idle(loop: SteppedLoop) -> None:
    adm = Admission("api", limits(per=1), replicas=0, loop=loop)
    w = Watch(adm)
    first = adm.admit(ignore, ignore)
    second = adm.admit(ignore, ignore)
    assert isinstance(first, Waiter) and isinstance(second, Waiter)
    adm.abandon(second)
    assert w.calls == [True]
    adm.abandon(first)
    assert w.calls == [True, False]
    adm.abandon(first)  # twice: nothing more
    assert w.calls == [True, False]


def test_a_queue_timeout_leaving_the_service_empty_is_idle(loop: SteppedLoop) -> None:
    adm = Admission("api", limits(per=1, timeout_s=1.0), replicas=0, loop=loop)
    w = Watch(adm)
    errors: list[str] = []
    assert isinstance(adm.admit(*rejected(errors)), Waiter)
    loop.advance(2.0)
    assert errors == ["queue-timeout"]
    assert w.calls == [True, False]


def test_a_queue_timeout_while_a_slot_is_taken_is_not_idle(loop: SteppedLoop) -> None:
    adm = Admission("api", limits(per=1, timeout_s=1.0), replicas=1, loop=loop)
    w = Watch(adm)
    errors: list[str] = []
    assert adm.try_take()
    assert isinstance(adm.admit(*rejected(errors)), Waiter)
    loop.advance(2.0)
    assert errors == ["queue-timeout"]
    assert w.calls == [True]
    adm.release()
    assert w.calls == [True, False]


def test_refused_requests_never_make_the_service_busy(loop: SteppedLoop) -> None:
    adm = Admission("api", limits(per=1, qmax=0), replicas=0, loop=loop)
    w = Watch(adm)
    with pytest.raises(QueueFull):
        adm.admit(ignore, ignore)
    assert w.calls == []
    limited = Admission(
        "api",
        limits(per=None, rate_limit=RateLimitConfig(rps=1, burst=1)),
        replicas=1,
        loop=loop,
    )
    wl = Watch(limited)

    def two() -> None:
        assert limited.admit(ignore, ignore) is None
        limited.release()
        with pytest.raises(RateLimited):
            limited.admit(ignore, ignore)

    loop.call(two)
    assert wl.calls == [True, False]


def test_an_admit_callback_that_releases_at_once_ends_idle(loop: SteppedLoop) -> None:
    adm = Admission("api", limits(per=1), replicas=0, loop=loop)
    w = Watch(adm)
    assert isinstance(adm.admit(lambda wait_s: adm.release(), ignore), Waiter)
    adm.set_replicas(1)
    loop.settle()
    assert (adm.in_use, adm.queued) == (0, 0)
    assert w.calls == [True, False]


def test_unwatched_and_unwatching(loop: SteppedLoop) -> None:
    adm = Admission("api", limits(per=None), replicas=1, loop=loop)
    assert adm.try_take() and adm.busy
    adm.release()
    assert not adm.busy
    w = Watch(adm)
    adm.watch_busy(None)
    assert adm.try_take()
    adm.release()
    assert w.calls == []
