"""Admission: slots, FIFO queue with timeout, rate limit — on a stepped loop clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.dataplane.admission import (
    Admission,
    AdmissionError,
    QueueFull,
    QueueTimeout,
    RateLimited,
    Waiter,
)
from gateway.settings import QueueConfig, RateLimitConfig, ServiceLimits
from tests.support.stepped_loop import SteppedLoop


@pytest.fixture
def loop() -> Iterator[SteppedLoop]:
    lp = SteppedLoop()
    yield lp
    lp.close()


class Gauge:
    queued = 0


class Recorder:
    """Collects what happened to each queued request, by name."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, float | str]] = []

    def callbacks(self, name: str):  # type: ignore[no-untyped-def]
        def on_admit(wait_s: float) -> None:
            self.events.append(("admit", name, wait_s))

        def on_reject(err: AdmissionError) -> None:
            self.events.append(("reject", name, err.code))

        return on_admit, on_reject


def limits(
    per: int | None = 1, qmax: int = 10, timeout_s: float = 5.0, **kw: object
) -> ServiceLimits:
    return ServiceLimits(
        concurrency_per_replica=per, queue=QueueConfig(max=qmax, timeout_s=timeout_s), **kw
    )


def test_uncontended_admit_takes_a_slot_at_once(loop: SteppedLoop) -> None:
    a = Admission("api", limits(per=2), replicas=1, loop=loop)
    rec = Recorder()
    assert a.admit(*rec.callbacks("r1")) is None
    assert a.admit(*rec.callbacks("r2")) is None
    assert a.in_use == 2
    a.release()
    a.release()
    assert a.in_use == 0
    assert rec.events == []


def test_unlimited_concurrency_never_queues(loop: SteppedLoop) -> None:
    a = Admission("api", limits(per=None), replicas=0, loop=loop)
    rec = Recorder()
    for i in range(1000):
        assert a.admit(*rec.callbacks(str(i))) is None
    assert a.queued == 0


def test_queue_is_fifo_and_wakes_on_release(loop: SteppedLoop) -> None:
    gauge = Gauge()
    a = Admission("api", limits(per=1), replicas=1, gauge=gauge, loop=loop)
    rec = Recorder()
    assert a.admit(*rec.callbacks("first")) is None
    w2 = a.admit(*rec.callbacks("second"))
    w3 = a.admit(*rec.callbacks("third"))
    assert isinstance(w2, Waiter) and isinstance(w3, Waiter)
    assert a.queued == 2 and gauge.queued == 2
    loop.advance(0.25)
    a.release()
    assert rec.events == []  # the waiter is woken from its own loop callback, not inside release
    loop.settle()
    assert rec.events == [("admit", "second", 0.25)]
    assert a.in_use == 1 and a.queued == 1 and gauge.queued == 1
    loop.advance(0.5)
    a.release()
    loop.settle()
    assert rec.events[-1] == ("admit", "third", 0.75)
    assert gauge.queued == 0
    assert sum(a.wait_counts) == 2
    assert a.wait_sum_s == pytest.approx(1.0)


def test_new_arrivals_do_not_jump_the_queue(loop: SteppedLoop) -> None:
    a = Admission("api", limits(per=1), replicas=1, loop=loop)
    rec = Recorder()
    assert a.admit(*rec.callbacks("holder")) is None
    assert a.admit(*rec.callbacks("waiting")) is not None
    a.release()  # a slot is free, but "waiting" is first in line
    assert isinstance(a.admit(*rec.callbacks("late")), Waiter)
    loop.settle()
    assert [e[1] for e in rec.events] == ["waiting"]


def test_full_queue_rejects_at_once_with_503(loop: SteppedLoop) -> None:
    a = Admission("api", limits(per=1, qmax=2), replicas=1, loop=loop)
    rec = Recorder()
    a.admit(*rec.callbacks("holder"))
    a.admit(*rec.callbacks("q1"))
    a.admit(*rec.callbacks("q2"))
    with pytest.raises(QueueFull) as info:
        a.admit(*rec.callbacks("q3"))
    assert info.value.status == 503
    assert info.value.code == "queue-full"
    assert info.value.retry_after_s >= 1
    assert a.rejected["queue-full"] == 1


def test_queue_max_zero_means_no_waiting(loop: SteppedLoop) -> None:
    a = Admission("api", limits(per=1, qmax=0), replicas=1, loop=loop)
    rec = Recorder()
    assert a.admit(*rec.callbacks("holder")) is None
    with pytest.raises(QueueFull):
        a.admit(*rec.callbacks("next"))


def test_queue_timeout_rejects_with_503(loop: SteppedLoop) -> None:
    gauge = Gauge()
    a = Admission("api", limits(per=1, timeout_s=2.0), replicas=1, gauge=gauge, loop=loop)
    rec = Recorder()
    a.admit(*rec.callbacks("holder"))
    a.admit(*rec.callbacks("w"))
    loop.advance(1.999)
    assert rec.events == []
    loop.advance(0.002)
    assert rec.events == [("reject", "w", "queue-timeout")]
    assert a.queued == 0 and gauge.queued == 0
    assert a.rejected["queue-timeout"] == 1
    a.release()  # the holder finishing must not admit the expired waiter
    loop.settle()
    assert len(rec.events) == 1
    assert a.in_use == 0


def test_abandoned_waiter_gets_no_callback_and_frees_its_place(loop: SteppedLoop) -> None:
    a = Admission("api", limits(per=1, qmax=1), replicas=1, loop=loop)
    rec = Recorder()
    a.admit(*rec.callbacks("holder"))
    w = a.admit(*rec.callbacks("gone"))
    assert w is not None
    a.abandon(w)
    a.abandon(w)  # idempotent
    assert a.queued == 0
    assert a.admit(*rec.callbacks("next")) is not None  # the place is free again
    a.release()
    loop.settle()
    assert rec.events == [("admit", "next", 0.0)]
    loop.advance(10)
    assert len(rec.events) == 1


def test_abandoned_middle_waiter_is_skipped(loop: SteppedLoop) -> None:
    a = Admission("api", limits(per=1), replicas=1, loop=loop)
    rec = Recorder()
    a.admit(*rec.callbacks("holder"))
    a.admit(*rec.callbacks("a"))
    wb = a.admit(*rec.callbacks("b"))
    a.admit(*rec.callbacks("c"))
    assert wb is not None
    a.abandon(wb)
    a.release()
    loop.settle()
    a.release()
    loop.settle()
    assert [e[1] for e in rec.events] == ["a", "c"]


def test_zero_replicas_hold_requests_until_capacity_appears(loop: SteppedLoop) -> None:
    a = Admission("api", limits(per=2), replicas=0, loop=loop)
    rec = Recorder()
    for name in ("a", "b", "c"):
        assert a.admit(*rec.callbacks(name)) is not None
    loop.advance(1.0)
    a.set_replicas(1)  # the first replica became ready: two slots
    loop.settle()
    assert [e[1] for e in rec.events] == ["a", "b"]
    assert a.in_use == 2 and a.queued == 1


def test_admit_callback_that_releases_at_once_lets_the_next_one_in(loop: SteppedLoop) -> None:
    a = Admission("api", limits(per=1), replicas=1, loop=loop)
    seen: list[str] = []

    def fail_fast(wait_s: float) -> None:
        seen.append("failed")
        a.release()  # e.g. no endpoint any more: the slot is given back immediately

    a.admit(lambda w: None, lambda e: None)
    a.admit(fail_fast, lambda e: None)
    a.admit(lambda w: seen.append("next"), lambda e: None)
    a.release()
    loop.settle()
    assert seen == ["failed", "next"]
    assert a.in_use == 1


def test_rate_limit_allows_burst_then_429_then_refills(loop: SteppedLoop) -> None:
    a = Admission("api", limits(per=None, rate_limit=RateLimitConfig(rps=10, burst=5)), loop=loop)
    rec = Recorder()

    def burst(n: int) -> list[str]:
        out = []
        for i in range(n):
            try:
                assert a.admit(*rec.callbacks(str(i))) is None
                out.append("ok")
            except RateLimited as e:
                assert e.status == 429
                assert e.retry_after_s >= 1
                out.append("429")
        return out

    assert loop.call(lambda: burst(7)) == ["ok"] * 5 + ["429"] * 2
    loop.advance(0.1)  # one more token at 10 rps
    assert loop.call(lambda: burst(2)) == ["ok", "429"]
    loop.advance(1.0)  # the bucket has fully drained: a whole burst again
    assert loop.call(lambda: burst(6)) == ["ok"] * 5 + ["429"]
    assert a.rejected["rate-limited"] == 4


def test_rate_limited_requests_take_no_slot(loop: SteppedLoop) -> None:
    a = Admission(
        "api", limits(per=1, rate_limit=RateLimitConfig(rps=1, burst=1)), replicas=1, loop=loop
    )
    rec = Recorder()
    assert loop.call(lambda: a.admit(*rec.callbacks("a"))) is None

    def second() -> None:
        a.admit(*rec.callbacks("b"))

    with pytest.raises(RateLimited):
        loop.call(second)
    assert a.in_use == 1 and a.queued == 0


def test_reconfigure_keeps_slots_and_queue(loop: SteppedLoop) -> None:
    a = Admission("api", limits(per=1), replicas=2, loop=loop)
    rec = Recorder()
    a.admit(*rec.callbacks("a"))
    a.admit(*rec.callbacks("b"))
    a.admit(*rec.callbacks("c"))
    assert a.queued == 1
    a.configure(limits(per=2))  # 4 slots now: the waiter gets in
    loop.settle()
    assert [e[1] for e in rec.events] == ["c"]
    assert a.in_use == 3
    a.configure(limits(per=None))
    assert a.admit(*rec.callbacks("d")) is None


def test_repr_shows_state(loop: SteppedLoop) -> None:
    a = Admission("api", limits(per=3), replicas=2, loop=loop)
    assert repr(a) == "Admission(api, slots 0/6, queued 0/10)"


def test_queue_timeout_error_names_the_cause() -> None:
    err = QueueTimeout("api", 1, "no slot")
    assert str(err) == "api: queue-timeout: no slot"
    assert err.status == 503


# -- scale from zero: hold at zero endpoints -------------------------------------------------


@pytest.mark.parametrize("per", [None, 2])
def test_held_at_zero_endpoints_then_dispatched_in_order_by_the_first_replica(
    loop: SteppedLoop, per: int | None
) -> None:
    gauge = Gauge()
    lim = ServiceLimits(
        concurrency_per_replica=per, queue=QueueConfig(max=1, timeout_s=30, cold_start_max=3)
    )
    a = Admission("reports", lim, replicas=0, gauge=gauge, loop=loop)
    woken: list[int] = []
    a.hold_at_zero(lambda: woken.append(a.queued))
    rec = Recorder()
    waiters = [a.admit(*rec.callbacks(f"r{i}")) for i in range(3)]
    assert all(isinstance(w, Waiter) for w in waiters)
    assert woken == [1, 2, 3]  # the scaler is woken as each request starts waiting
    assert gauge.queued == 3  # the held requests count as demand
    with pytest.raises(QueueFull, match=r"queue\.cold_start_max 3"):
        a.admit(*rec.callbacks("r3"))  # held up to cold_start_max (not max): still bounded
    loop.advance(5)
    assert rec.events == []
    a.set_replicas(1)  # the first replica is ready
    loop.settle()
    admitted = [e[1] for e in rec.events if e[0] == "admit"]
    assert admitted == (["r0", "r1", "r2"] if per is None else ["r0", "r1"])
    assert all(e[2] == pytest.approx(5) for e in rec.events)


def test_held_at_zero_waits_through_the_cold_start_then_times_out(loop: SteppedLoop) -> None:
    """A request queued while there is no endpoint is held past ``timeout_s``, up to
    ``cold_start_timeout_s`` (a replica's start-up is not a wait for a slot)."""
    lim = ServiceLimits(
        concurrency_per_replica=None,
        queue=QueueConfig(max=5, timeout_s=2, cold_start_timeout_s=30),
    )
    a = Admission("reports", lim, replicas=0, loop=loop)
    a.hold_at_zero(lambda: None)
    errors: list[AdmissionError] = []
    assert a.admit(lambda _w: None, errors.append) is not None
    loop.advance(29.9)
    assert errors == []
    loop.advance(0.2)
    assert [e.code for e in errors] == [QueueTimeout.code]
    assert "no endpoint ready within queue.cold_start_timeout_s (30s)" in str(errors[0])
    assert a.queued == 0


def test_held_at_zero_dispatched_when_ready_and_later_waits_get_timeout_s(
    loop: SteppedLoop,
) -> None:
    """Only a wait that began with no endpoint gets the cold-start bound: once a replica is
    ready, a request queued for a slot times out after ``timeout_s`` as usual."""
    lim = ServiceLimits(
        concurrency_per_replica=1,
        queue=QueueConfig(max=5, timeout_s=2, cold_start_timeout_s=300),
    )
    a = Admission("reports", lim, replicas=0, loop=loop)
    a.hold_at_zero(lambda: None)
    rec = Recorder()
    assert a.admit(*rec.callbacks("cold")) is not None
    loop.advance(20)  # a 20 s start-up: longer than timeout_s
    a.set_replicas(1)
    loop.settle()
    assert rec.events == [("admit", "cold", pytest.approx(20))]
    assert a.admit(*rec.callbacks("warm")) is not None  # the one slot is taken
    loop.advance(2.01)
    assert rec.events[1:] == [("reject", "warm", QueueTimeout.code)]


def test_without_hold_zero_endpoints_dispatch_at_once(loop: SteppedLoop) -> None:
    """Static platform: nothing will start a replica, so no endpoint means 503 at once."""
    a = Admission("api", limits(per=None), replicas=0, loop=loop)
    rec = Recorder()
    assert a.admit(*rec.callbacks("r0")) is None
    a.hold_at_zero(lambda: None)
    a.hold_at_zero(None)
    assert a.admit(*rec.callbacks("r1")) is None


def test_early_wake_fires_once_when_concurrency_reaches_the_armed_level(
    loop: SteppedLoop,
) -> None:
    adm = Admission("api", limits(per=2, qmax=10), replicas=1, loop=loop)
    woken: list[int] = []
    adm.arm_early_wake(3, lambda: woken.append(adm.in_use + adm.queued))
    rec = Recorder()
    assert adm.try_take()  # 1 in flight
    assert adm.admit(*rec.callbacks("b")) is None  # 2 in flight: below the level
    assert woken == []
    assert isinstance(adm.admit(*rec.callbacks("c")), Waiter)  # 2 + 1 queued = 3
    assert woken == [3]
    assert isinstance(adm.admit(*rec.callbacks("d")), Waiter)
    assert woken == [3], "once per arming"
    adm.arm_early_wake(1, None)  # no callback: disarmed whatever the level
    adm.release()
    assert woken == [3]


def test_early_wake_on_the_fast_path_and_inf_disarms(loop: SteppedLoop) -> None:
    adm = Admission("api", limits(per=None), replicas=1, loop=loop)
    woken: list[str] = []
    adm.arm_early_wake(float("inf"), lambda: woken.append("x"))
    for _ in range(50):
        assert adm.try_take()
    assert woken == []
    adm.arm_early_wake(51, lambda: woken.append("y"))
    assert adm.try_take() and woken == ["y"]


def test_a_mirror_of_the_workers_counts_dispatches_nothing(loop: SteppedLoop) -> None:
    """With ``workers: N`` the main process's admission mirrors the workers' counts
    (``Workers._merge`` sets ``queued``) while its own queue is empty: a replica becoming
    ready there must not try to admit from it (it raised IndexError in a callback)."""
    errors: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    a = Admission("reports", limits(per=None), replicas=0, loop=loop)
    a.hold_at_zero(lambda: None)
    a.queued = 1  # one request held in a worker
    a.set_replicas(1)
    loop.settle()
    assert errors == []
    assert (a.in_use, a.queued) == (0, 1)
