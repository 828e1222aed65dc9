"""Admission shared by data-plane workers (``workers: N``): two workers' admissions on one
shared-memory row (in one process, on a stepped loop clock; a wake is a direct call)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator

import pytest

from gateway.dataplane.admission import Admission, AdmissionError, QueueFull, RateLimited
from gateway.dataplane.shared_admission import MAX_ROWS, SharedLimits, create_file
from gateway.settings import QueueConfig, RateLimitConfig, ServiceLimits
from tests.support.stepped_loop import SteppedLoop


@pytest.fixture
def loop() -> Iterator[SteppedLoop]:
    lp = SteppedLoop()
    yield lp
    lp.close()


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def callbacks(self, name: str):  # type: ignore[no-untyped-def]
        def on_admit(wait_s: float) -> None:
            self.events.append(("admit", name))

        def on_reject(err: AdmissionError) -> None:
            self.events.append(("reject", name))

        return on_admit, on_reject


class Workers:
    """``n`` workers' admissions of one service, sharing one row, plus the main process's view."""

    def __init__(self, loop: SteppedLoop, limits: ServiceLimits, n: int = 2, replicas: int = 1):
        self.fd = create_file(n)
        self.woken: list[int] = []
        self.admissions: list[Admission] = []
        self.views = [SharedLimits(self.fd, n, i, self.notify, loop.time) for i in range(n)]
        self.main = SharedLimits(self.fd, n, -1, self.notify)
        for view in self.views:
            a = Admission("api", limits, replicas=replicas, loop=loop)
            index = view.index_of("api")
            assert index is not None
            a.share(view.row(index))
            self.admissions.append(a)
        self.loop = loop

    def notify(self, worker: int) -> None:
        self.woken.append(worker)
        self.loop.call_soon(self.admissions[worker].wake_shared)

    def close(self) -> None:
        for view in (*self.views, self.main):
            view.close()
        os.close(self.fd)

    def row(self) -> list[tuple[int, int, int]]:
        index = self.main.index_of("api")
        assert index is not None
        return self.main.row(index).snapshot()


def limits(per: int | None = 1, qmax: int = 10, **kw: object) -> ServiceLimits:
    return ServiceLimits(
        concurrency_per_replica=per, queue=QueueConfig(max=qmax, timeout_s=5.0), **kw
    )


def test_slots_are_counted_over_every_worker(loop: SteppedLoop) -> None:
    w = Workers(loop, limits(per=2))
    a0, a1 = w.admissions
    rec = Recorder()
    try:
        assert not a0.try_take()  # shared slots: never the local fast path
        assert a0.admit(*rec.callbacks("r1")) is None
        assert a1.admit(*rec.callbacks("r2")) is None
        queued = a1.admit(*rec.callbacks("r3"))  # 2 slots taken, one in each worker
        assert queued is not None
        assert w.row() == [(1, 0, 0), (1, 1, 0)]
        a0.release()  # worker 0's slot goes to worker 1's queued request (at its round's end)
        assert w.row() == [(1, 0, 0), (1, 1, 0)]
        loop.settle()
        assert rec.events == [("admit", "r3")]
        assert w.woken == [1]
        assert w.row() == [(0, 0, 0), (2, 0, 0)]
        assert (a1.in_use, a1.queued) == (2, 0)
    finally:
        w.close()


def test_freed_slots_go_to_the_oldest_waiter_across_workers(loop: SteppedLoop) -> None:
    w = Workers(loop, limits(per=1))
    a0, a1 = w.admissions
    rec = Recorder()
    try:
        assert a0.admit(*rec.callbacks("holder")) is None
        assert a1.admit(*rec.callbacks("first")) is not None
        loop.advance(0.1)
        assert a0.admit(*rec.callbacks("second")) is not None
        loop.advance(0.1)
        assert a1.admit(*rec.callbacks("third")) is not None
        for a in (a0, a1, a0):
            a.release()
            loop.settle()
        # The slot went holder -> first (worker 1) -> second (worker 0) -> third (worker 1).
        assert [name for _, name in rec.events] == ["first", "second", "third"]
    finally:
        w.close()


def test_the_queue_bound_counts_every_worker(loop: SteppedLoop) -> None:
    w = Workers(loop, limits(per=1, qmax=2))
    a0, a1 = w.admissions
    rec = Recorder()
    try:
        assert a0.admit(*rec.callbacks("r1")) is None
        assert a0.admit(*rec.callbacks("q1")) is not None
        assert a1.admit(*rec.callbacks("q2")) is not None
        with pytest.raises(QueueFull):
            a1.admit(*rec.callbacks("r4"))
        with pytest.raises(QueueFull):
            a0.admit(*rec.callbacks("r5"))
        assert a1.rejected["queue-full"] == 1 and a0.rejected["queue-full"] == 1
    finally:
        w.close()


def test_held_at_zero_the_cold_start_bound_counts_every_worker(loop: SteppedLoop) -> None:
    lim = ServiceLimits(
        concurrency_per_replica=1, queue=QueueConfig(max=1, timeout_s=5.0, cold_start_max=3)
    )
    w = Workers(loop, lim, replicas=0)
    a0, a1 = w.admissions
    for a in w.admissions:
        a.hold_at_zero(lambda: None)
    rec = Recorder()
    try:
        assert a0.admit(*rec.callbacks("q1")) is not None
        assert a1.admit(*rec.callbacks("q2")) is not None
        assert a0.admit(*rec.callbacks("q3")) is not None  # past max: held for the cold start
        with pytest.raises(QueueFull, match=r"cold_start_max 3"):
            a1.admit(*rec.callbacks("r4"))
    finally:
        w.close()


def test_a_request_that_leaves_with_its_grant_frees_the_slot(loop: SteppedLoop) -> None:
    w = Workers(loop, limits(per=1))
    a0, a1 = w.admissions
    rec = Recorder()
    try:
        assert a0.admit(*rec.callbacks("holder")) is None
        left = a1.admit(*rec.callbacks("leaves"))
        assert left is not None
        loop.advance(0.1)
        assert a0.admit(*rec.callbacks("waits")) is not None
        a0.release()
        a0.flush_releases()  # the end of worker 0's loop round: granted to worker 1's request
        a1.abandon(left)  # ... which leaves before worker 1 ran its wake
        loop.settle()
        assert rec.events == [("admit", "waits")]
        assert w.row() == [(1, 0, 0), (0, 0, 0)]
    finally:
        w.close()


def test_a_dead_workers_slots_and_queue_are_freed_by_the_main_process(
    loop: SteppedLoop,
) -> None:
    w = Workers(loop, limits(per=1))
    a0, a1 = w.admissions
    rec = Recorder()
    try:
        assert a0.admit(*rec.callbacks("dies-with-worker-0")) is None
        assert a0.admit(*rec.callbacks("queued-in-worker-0")) is not None
        assert a1.admit(*rec.callbacks("waits")) is not None
        w.main.reset_worker(0, [("api", a1.capacity)])  # worker 0 was killed
        loop.settle()
        assert rec.events == [("admit", "waits")]
        assert w.row() == [(0, 0, 0), (1, 0, 0)]
    finally:
        w.close()


def test_more_capacity_admits_queued_requests_of_every_worker(loop: SteppedLoop) -> None:
    w = Workers(loop, limits(per=1))
    a0, a1 = w.admissions
    rec = Recorder()
    try:
        assert a0.admit(*rec.callbacks("r1")) is None
        assert a0.admit(*rec.callbacks("q0")) is not None
        assert a1.admit(*rec.callbacks("q1")) is not None
        a1.set_replicas(3)  # worker 1 applied the new endpoints first
        loop.settle()
        assert sorted(name for _, name in rec.events) == ["q0", "q1"]
        assert w.row() == [(2, 0, 0), (1, 0, 0)]
    finally:
        w.close()


def test_the_rate_limit_is_shared(loop: SteppedLoop) -> None:
    rate = RateLimitConfig(rps=2, burst=3)
    w = Workers(loop, limits(per=None, rate_limit=rate))
    a0, a1 = w.admissions
    rec = Recorder()
    try:
        passed = 0
        for i in range(10):
            a = (a0, a1)[i % 2]
            try:
                loop.call(lambda a=a: a.admit(*rec.callbacks("r")))  # type: ignore[misc]
                passed += 1
            except RateLimited:
                pass
        assert passed == 3  # the burst, once for both workers
        loop.advance(0.5)  # one more token at 2 rps
        loop.call(lambda: a1.admit(*rec.callbacks("r")))
        with pytest.raises(RateLimited):
            loop.call(lambda: a0.admit(*rec.callbacks("r")))
    finally:
        w.close()


def test_rows_are_found_by_name_the_same_in_every_process(loop: SteppedLoop) -> None:
    fd = create_file(2)
    try:
        a, b = SharedLimits(fd, 2, 0, lambda _: None), SharedLimits(fd, 2, 1, lambda _: None)
        assert a.index_of("x") == 0 and a.index_of("y") == 1
        assert b.index_of("y") == 1 and b.index_of("x") == 0 and b.index_of("z") == 2
        assert MAX_ROWS >= 1024
        a.close()
        b.close()
    finally:
        os.close(fd)


def test_queued_requests_leave_the_shared_queue_when_the_limit_goes_away(
    loop: SteppedLoop,
) -> None:
    w = Workers(loop, limits(per=1))
    a0, a1 = w.admissions
    rec = Recorder()
    try:
        assert a0.admit(*rec.callbacks("r1")) is None
        assert a1.admit(*rec.callbacks("q1")) is not None
        a1.configure(limits(per=None))  # reloaded without concurrency_per_replica
        loop.settle()
        assert rec.events == [("admit", "q1")]
        assert w.row() == [(1, 0, 0), (0, 0, 0)]  # worker 1 queues nothing any more
        a1.release()  # its request ran outside the shared slots
        assert w.row() == [(1, 0, 0), (0, 0, 0)]
    finally:
        w.close()


def test_without_proc_the_table_is_locked_with_record_locks(
    loop: SteppedLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def no_proc(path: str, *args: int) -> int:
        if str(path).startswith("/proc/"):
            raise FileNotFoundError(path)
        return real_open(path, *args)

    monkeypatch.setattr(os, "open", no_proc)
    w = Workers(loop, limits(per=1))
    a0, a1 = w.admissions
    rec = Recorder()
    try:
        assert w.views[0].lock is fcntl.lockf
        assert a0.admit(*rec.callbacks("r1")) is None
        assert a1.admit(*rec.callbacks("q1")) is not None
        a0.release()
        loop.settle()
        assert rec.events == [("admit", "q1")]
    finally:
        w.close()
