"""Crash-restart backoff of the local pool: doubling from the base, capped."""

from __future__ import annotations

from gateway.platforms.local.pool import restart_delay_s


def test_backoff_doubles_and_is_capped() -> None:
    delays = [restart_delay_s(n, 0.5, 30.0) for n in range(1, 10)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


def test_no_delay_before_any_crash_and_no_overflow_after_many() -> None:
    assert restart_delay_s(0, 0.5, 30.0) == 0.0
    assert restart_delay_s(10_000, 0.5, 30.0) == 30.0
