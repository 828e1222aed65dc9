"""Admission state shared by the data-plane workers (``workers: N``), so that a service's
concurrency slots, queue bound and rate limit hold for the gateway as a whole.

One row per service in a shared-memory file (``memfd``), changed only under an exclusive
``flock`` of the file (the kernel drops the lock of a worker that dies, so a ``kill -9``
never wedges the others).  A row holds the rate limiter's theoretical
arrival time (GCRA, the same leaky bucket as ``aiolimiter``: ``burst`` at once, ``rps``
sustained) and, per worker, its slots taken, its queued requests, the slots granted to its
queue and the enqueue time of its oldest waiter without a grant.  A freed slot goes to the
worker whose oldest waiting request is oldest (FIFO within a worker, oldest-first across
them), which is woken through its pipe.  Invariant: the slots taken over every worker
(granted ones included) never exceed the capacity the taking worker sees.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import math
import mmap
import os
import time
from collections.abc import Callable, Iterable, Sequence

MAX_ROWS = 4096
"""Services that can share their admission (more are enforced per worker, with a warning)."""

_HEADER = 2
"""Doubles at the start of a row: the rate limiter's theoretical arrival time, a spare."""
_FIELDS = 4
"""Doubles per worker in a row: slots taken, queued, granted, oldest ungranted wait start."""
_IN_USE, _QUEUED, _GRANTS, _HEAD = range(_FIELDS)

ADMITTED, QUEUED, FULL, LIMITED = 0, 1, 2, 3
"""What :meth:`SharedRow.enter` decided (``LIMITED``: over the rate limit)."""


_NAME_BYTES = 32
"""A row's entry in the name table: a used flag and the SHA-256 of the service name (31 bytes
of it)."""


def row_doubles(workers: int) -> int:
    return _HEADER + _FIELDS * workers


def file_bytes(workers: int) -> int:
    return MAX_ROWS * row_doubles(workers) * 8 + MAX_ROWS * _NAME_BYTES


def create_file(workers: int) -> int:
    """A zeroed shared-memory file for ``workers`` workers (its fd)."""
    fd = os.memfd_create("sluice-admission", 0)
    os.ftruncate(fd, file_bytes(workers))
    return fd


def pipe_notifier(pipes: Sequence[tuple[int, int]]) -> Callable[[int], None]:
    """``notify(w)``: a byte into worker ``w``'s wake pipe (a full pipe already wakes it)."""
    writers = [w for _, w in pipes]

    def notify(worker: int) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(writers[worker], b"\0")

    return notify


def drain_then(fd: int, wake: Callable[[], None]) -> None:
    """A wake pipe is readable: empty it, then ``wake()`` (look at every row's grants)."""
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass
    wake()


def create_pipes(workers: int) -> list[tuple[int, int]]:
    """One non-blocking wake pipe per worker."""
    pipes = []
    for _ in range(workers):
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        pipes.append((r, w))
    return pipes


class SharedLimits:
    """One process's view of the shared file: rows by index, the lock, and who to wake.

    ``me`` is this worker's index (``-1`` for the main process, which only resets the slots
    of a worker that died).  ``notify(w)`` wakes worker ``w`` (a byte in its pipe)."""

    def __init__(
        self,
        fd: int,
        workers: int,
        me: int,
        notify: Callable[[int], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fd = fd
        # The lock (flock) is taken on this process's own open file description of the file:
        # the description passed down is shared by every process, and flock excludes
        # descriptions, not processes.
        # Without /proc (a rare sandbox), POSIX record locks on the shared description do
        # the same (they belong to the process), at about twice the cost.
        try:
            self.lock_fd = os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
            self.lock: Callable[[int, int], object] = fcntl.flock
        except OSError:
            self.lock_fd = os.dup(fd)
            self.lock = fcntl.lockf
        self.workers = workers
        self.me = me
        self.notify = notify
        self.clock = clock
        """The rate limiter's clock: read fresh, the same in every process (an event loop's
        time is cached per loop round, so two workers' would disagree by a round)."""
        self._map = mmap.mmap(fd, file_bytes(workers))
        self._names_at = MAX_ROWS * row_doubles(workers) * 8
        self.cells = memoryview(self._map)[: self._names_at].cast("d")
        self.rows: dict[int, SharedRow] = {}
        self._indexes: dict[str, int | None] = {}

    def index_of(self, service: str) -> int | None:
        """The row of ``service``: the same in every process (the first to ask takes a free
        one, under the name table's lock); None when every row is taken."""
        if service in self._indexes:
            return self._indexes[service]
        entry = b"\x01" + hashlib.sha256(service.encode()).digest()[: _NAME_BYTES - 1]
        found: int | None = None
        self.lock(self.lock_fd, fcntl.LOCK_EX)
        try:
            table = self._map
            at = self._names_at
            for i in range(MAX_ROWS):
                used = table[at : at + _NAME_BYTES]
                if used == entry:
                    found = i
                    break
                if used[0] == 0:
                    table[at : at + _NAME_BYTES] = entry
                    found = i
                    break
                at += _NAME_BYTES
        finally:
            self.lock(self.lock_fd, fcntl.LOCK_UN)
        self._indexes[service] = found
        return found

    def row(self, index: int) -> SharedRow:
        row = self.rows.get(index)
        if row is None:
            row = self.rows[index] = SharedRow(self, index)
        return row

    def reset_worker(self, worker: int, capacities: Iterable[tuple[str, float]]) -> None:
        """Worker ``worker`` is gone: its slots, queue and grants are freed in the rows of
        ``capacities`` (service -> capacity), and the freed slots granted to the others."""
        for service, capacity in capacities:
            index = self.index_of(service)
            if index is None:
                continue
            row = self.row(index)
            with row:
                base = row.base + _HEADER + _FIELDS * worker
                for i in range(_FIELDS):
                    row.cells[base + i] = 0.0
                woken = row.regrant(capacity)
            for w in woken:
                self.notify(w)

    def close(self) -> None:
        self.rows.clear()
        self.cells.release()
        self._map.close()
        os.close(self.lock_fd)

    def __repr__(self) -> str:
        return f"SharedLimits(workers={self.workers}, me={self.me}, rows={len(self.rows)})"


class SharedRow:
    """One service's row.  Use ``with row:`` around every read-modify-write."""

    __slots__ = ("base", "cells", "fd", "index", "limits", "lock", "mine", "workers")

    def __init__(self, limits: SharedLimits, index: int) -> None:
        self.limits = limits
        self.fd = limits.lock_fd
        self.lock = limits.lock
        self.index = index
        self.cells = limits.cells
        self.workers = limits.workers
        self.base = index * row_doubles(limits.workers)
        self.mine = self.base + _HEADER + _FIELDS * limits.me

    def __enter__(self) -> SharedRow:
        self.lock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        self.lock(self.fd, fcntl.LOCK_UN)

    # -- under the lock -------------------------------------------------------------------

    def totals(self) -> tuple[float, float, float]:
        """(slots taken, queued, queued without a grant) over every worker."""
        cells = self.cells
        in_use = queued = waiting = 0.0
        i = self.base + _HEADER
        for _ in range(self.workers):
            in_use += cells[i + _IN_USE]
            q = cells[i + _QUEUED]
            queued += q
            waiting += q - cells[i + _GRANTS]
            i += _FIELDS
        return in_use, queued, waiting

    def regrant(self, capacity: float) -> list[int]:
        """Grant free slots to the oldest waiters; the workers to wake."""
        cells = self.cells
        woken: list[int] = []
        in_use, _, waiting = self.totals()
        while waiting > 0 and in_use < capacity:
            best = -1
            best_head = math.inf
            i = self.base + _HEADER
            for w in range(self.workers):
                if cells[i + _QUEUED] > cells[i + _GRANTS] and cells[i + _HEAD] < best_head:
                    best, best_head = w, cells[i + _HEAD]
                i += _FIELDS
            if best < 0:  # pragma: no cover - waiting > 0 means some worker has one
                break
            i = self.base + _HEADER + _FIELDS * best
            cells[i + _IN_USE] += 1
            cells[i + _GRANTS] += 1
            in_use += 1
            waiting -= 1
            if best not in woken:
                woken.append(best)
        return woken

    # -- one locked step each -------------------------------------------------------------

    def enter(
        self,
        capacity: float,
        queue_max: int,
        now: float,
        interval_s: float = 0.0,
        tolerance_s: float = 0.0,
    ) -> int:
        """In one locked step: the rate limit when ``interval_s`` (GCRA, on the shared clock;
        over it: ``LIMITED``), then (with a finite ``capacity``) take a slot (``ADMITTED``)
        when one is free and nobody waits anywhere, else join the queue (``QUEUED``) unless
        it already holds ``queue_max`` requests (``FULL``).  ``now`` dates a queued request
        (the loop's time: it only orders the workers' waiters)."""
        with self:
            cells = self.cells
            if interval_s:
                clock_now = self.limits.clock()
                tat = max(cells[self.base], clock_now)
                if tat - clock_now > tolerance_s:
                    return LIMITED
                cells[self.base] = tat + interval_s
            if capacity == math.inf:
                return ADMITTED
            in_use, queued, waiting = self.totals()
            mine = self.mine
            if in_use < capacity and waiting <= 0:
                cells[mine + _IN_USE] += 1
                return ADMITTED
            if queued >= queue_max:
                return FULL
            if cells[mine + _QUEUED] <= cells[mine + _GRANTS]:
                cells[mine + _HEAD] = now
            cells[mine + _QUEUED] += 1
        return QUEUED

    def release(self, capacity: float, count: int = 1) -> None:
        """``count`` slots this worker held are free: grant them on (and wake who gets them)."""
        with self:
            self.cells[self.mine + _IN_USE] -= count
            woken = self.regrant(capacity)
        for w in woken:
            self.limits.notify(w)

    def grow(self, capacity: float) -> None:
        """The capacity may have grown: grant what is free."""
        with self:
            woken = self.regrant(capacity)
        for w in woken:
            self.limits.notify(w)

    def leave(self, capacity: float, next_head: Callable[[int], float]) -> None:
        """A queued request of this worker left without its slot (abandoned, timed out).

        When every request still queued here had a grant, one grant lost its request: that
        slot is freed.  ``next_head(g)`` is the enqueue time of the queued request after the
        first ``g`` (inf when none)."""
        with self:
            cells = self.cells
            mine = self.mine
            woken: list[int] = []
            if cells[mine + _QUEUED] <= cells[mine + _GRANTS]:
                cells[mine + _GRANTS] -= 1
                cells[mine + _IN_USE] -= 1
                cells[mine + _QUEUED] -= 1
                woken = self.regrant(capacity)
            else:
                cells[mine + _QUEUED] -= 1
                cells[mine + _HEAD] = next_head(int(cells[mine + _GRANTS]))
        for w in woken:
            self.limits.notify(w)

    def consume(self, next_head: Callable[[int], float]) -> int:
        """The grants to this worker's queue: how many of its oldest requests now hold a
        slot (they leave the shared queue count)."""
        with self:
            cells = self.cells
            mine = self.mine
            granted = int(cells[mine + _GRANTS])
            if granted:
                cells[mine + _GRANTS] = 0
                cells[mine + _QUEUED] -= granted
                cells[mine + _HEAD] = next_head(granted)
        return granted

    def forget_queue(self) -> None:
        """The limit went away (no slots to share): this worker's queued requests all go on
        at once, so they leave the shared queue, and slots granted to them are given back."""
        with self:
            cells = self.cells
            mine = self.mine
            cells[mine + _IN_USE] -= cells[mine + _GRANTS]
            cells[mine + _GRANTS] = 0
            cells[mine + _QUEUED] = 0

    def snapshot(self) -> list[tuple[int, int, int]]:
        """(slots taken, queued, granted) per worker (tests, debugging)."""
        with self:
            out = []
            i = self.base + _HEADER
            for _ in range(self.workers):
                c = self.cells
                out.append((int(c[i + _IN_USE]), int(c[i + _QUEUED]), int(c[i + _GRANTS])))
                i += _FIELDS
            return out

    def __repr__(self) -> str:
        return f"SharedRow({self.index}, worker {self.limits.me})"
