"""Retry rules: only safe retries, to another endpoint, within the budget."""

from __future__ import annotations

import pytest

from gateway.dataplane.retry import Failure, RetryBudget, body_replayable, retry_reason, untried
from gateway.settings import RetryPolicy

POLICY = RetryPolicy()


@pytest.mark.parametrize(
    ("failure", "method", "replayable", "expected"),
    [
        (Failure.CONNECT, b"GET", True, "connect-failure"),
        (Failure.CONNECT, b"POST", False, "connect-failure"),  # never sent: safe for any method
        (Failure.RESET_BEFORE_RESPONSE, b"GET", True, "reset"),
        (Failure.RESET_BEFORE_RESPONSE, b"PUT", True, "reset"),
        (Failure.RESET_BEFORE_RESPONSE, b"DELETE", True, "reset"),
        (Failure.RESET_BEFORE_RESPONSE, b"GET", False, None),  # body not replayable
        (Failure.RESET_BEFORE_RESPONSE, b"POST", True, None),  # a POST that reached an upstream
        (Failure.RESET_BEFORE_RESPONSE, b"PATCH", True, None),
        (Failure.AFTER_RESPONSE, b"GET", True, None),
        (Failure.TIMEOUT, b"GET", True, None),
    ],
)
def test_only_safe_failures_are_retried(
    failure: Failure, method: bytes, replayable: bool, expected: str | None
) -> None:
    assert retry_reason(POLICY, failure, 1, method, replayable) == expected


def test_attempts_are_capped() -> None:
    policy = RetryPolicy(max_attempts=3)
    assert retry_reason(policy, Failure.RESET_BEFORE_RESPONSE, 1, b"GET", True) == "reset"
    assert retry_reason(policy, Failure.RESET_BEFORE_RESPONSE, 2, b"GET", True) == "reset"
    assert retry_reason(policy, Failure.RESET_BEFORE_RESPONSE, 3, b"GET", True) is None
    one = RetryPolicy(max_attempts=1)
    assert retry_reason(one, Failure.RESET_BEFORE_RESPONSE, 1, b"GET", True) is None


@pytest.mark.parametrize("attempt", [1, 2, 10])
def test_connect_failures_are_not_capped_by_max_attempts(attempt: int) -> None:
    """Issue 20, item 6: a request that reached no upstream is always safe to send elsewhere
    (the data plane bounds it by the endpoints left and the request's deadline)."""
    for policy in (RetryPolicy(max_attempts=1), RetryPolicy(max_attempts=2)):
        assert retry_reason(policy, Failure.CONNECT, attempt, b"POST", False) == "connect-failure"
    off = RetryPolicy(retry_on=["reset"])
    assert retry_reason(off, Failure.CONNECT, attempt, b"GET", True) is None


def test_retry_on_selects_the_failures() -> None:
    policy = RetryPolicy(retry_on=["connect-failure"])
    assert retry_reason(policy, Failure.RESET_BEFORE_RESPONSE, 1, b"GET", True) is None
    assert retry_reason(policy, Failure.CONNECT, 1, b"GET", True) == "connect-failure"


def test_body_replayable() -> None:
    policy = RetryPolicy(replay_body_bytes=10)
    assert body_replayable(policy, body_complete=False, body_bytes=0)
    assert body_replayable(policy, body_complete=True, body_bytes=10)
    assert not body_replayable(policy, body_complete=True, body_bytes=11)
    assert not body_replayable(policy, body_complete=False, body_bytes=5)


def test_untried_keeps_order() -> None:
    assert untried(("a", "b", "c"), {"b"}) == ("a", "c")
    assert untried(("a",), {"a"}) == ()


def test_budget_is_20_percent_of_active_with_a_minimum_of_3() -> None:
    budget = RetryBudget(RetryPolicy())
    assert budget.allowed(0) == 3
    assert budget.allowed(10) == 3
    assert budget.allowed(100) == 20
    started = sum(budget.try_start(100) for _ in range(50))
    assert started == 20
    assert budget.denied_total == 30
    budget.finish()
    assert budget.try_start(100)
    assert not budget.try_start(100)


def test_budget_min_allows_retries_when_quiet() -> None:
    budget = RetryBudget(RetryPolicy(budget_percent=0, budget_min=1))
    assert budget.try_start(1000)
    assert not budget.try_start(1000)
    budget.finish()
    assert budget.active == 0
    assert "active=0" in repr(budget)
