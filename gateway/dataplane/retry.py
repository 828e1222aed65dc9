"""When a failed upstream attempt may be tried again, and the budget that stops retry storms.

The rules (``services.<name>.retries``):

* a request is retried only when doing so cannot repeat a side effect:

  - ``connect-failure``: the attempt never sent a byte (refused, unreachable, connect
    timeout) — always safe, whatever the method;
  - ``reset``: the request was sent but the upstream closed the connection before the first
    response byte (the classic keep-alive race) — only for an idempotent method (GET, HEAD,
    OPTIONS, TRACE, PUT, DELETE) whose body is replayable: empty, or received whole and at
    most ``replay_body_bytes``.  A POST (or PATCH) that reached an upstream is never retried;

* never after any response byte arrived, never after a response-header or total timeout;
* each attempt to an endpoint not tried before;
* a connect failure (the request reached no upstream: it costs no upstream any work) is
  retried on every endpoint left, within the request's total deadline, without counting
  against ``max_attempts`` or the budget;
* a reset is retried at most up to ``max_attempts`` attempts that reached an upstream, and
  within a per-service **retry budget**: retries in progress may be at most
  ``budget_percent`` of the service's active requests, but ``budget_min`` at once are always
  allowed — so when every endpoint fails, retries add at most a fifth to the load instead
  of multiplying it.

Pure: no I/O, no clock.  The data plane asks :func:`retry_reason` and
:meth:`RetryBudget.try_start` / :meth:`RetryBudget.finish` around a retried attempt.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence
from typing import TypeVar

from gateway.settings import RetryPolicy

IDEMPOTENT_METHODS = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})


class Failure(enum.Enum):
    """How an upstream attempt failed, as far as retrying is concerned."""

    CONNECT = "connect-failure"
    """Nothing was sent: the connection could not be made (or timed out while connecting)."""
    RESET_BEFORE_RESPONSE = "reset"
    """The request was (possibly) sent; the upstream closed before any response byte."""
    AFTER_RESPONSE = "after-response"
    """Response bytes arrived (or were forwarded): never retried."""
    TIMEOUT = "timeout"
    """A response-header or total timeout: the upstream may still be working; never retried."""


def retry_reason(
    policy: RetryPolicy,
    failure: Failure,
    attempt: int,
    method: bytes,
    body_replayable: bool,
) -> str | None:
    """The reason to retry (``"connect-failure"`` or ``"reset"``), or ``None`` when unsafe.

    ``attempt`` is the number of the attempt that just failed, counting only attempts that
    reached an upstream (1 = the first);
    ``body_replayable``: the request has no body, or all of it is buffered and at most
    ``policy.replay_body_bytes``.
    """
    reason = failure.value
    if reason not in policy.retry_on:
        return None
    if failure is Failure.CONNECT:
        return reason  # bounded by the endpoints not tried yet and the deadline, not here
    if attempt >= policy.max_attempts:
        return None
    if failure is Failure.RESET_BEFORE_RESPONSE:
        if method in IDEMPOTENT_METHODS and body_replayable:
            return reason
        return None
    return None


def body_replayable(policy: RetryPolicy, body_complete: bool, body_bytes: int) -> bool:
    """A body can be sent again when it is empty, or whole and small enough to keep."""
    return body_bytes == 0 or (body_complete and body_bytes <= policy.replay_body_bytes)


E = TypeVar("E")


def untried(candidates: Sequence[E], tried: Collection[E]) -> tuple[E, ...]:
    """The candidates not tried yet (a retry goes to a different endpoint)."""
    return tuple(c for c in candidates if c not in tried)


class RetryBudget:
    """Retries in progress for one service, capped relative to its active requests."""

    __slots__ = ("active", "denied_total", "min_retries", "ratio", "started_total")

    def __init__(self, policy: RetryPolicy | None = None) -> None:
        self.active = 0
        self.started_total = 0
        self.denied_total = 0
        self.ratio = 0.2
        self.min_retries = 3
        self.configure(policy or RetryPolicy())

    def configure(self, policy: RetryPolicy) -> None:
        self.ratio = policy.budget_percent / 100.0
        self.min_retries = policy.budget_min

    def allowed(self, active_requests: int) -> int:
        """How many retries may be in progress with ``active_requests`` requests active."""
        return max(self.min_retries, int(self.ratio * active_requests))

    def try_start(self, active_requests: int) -> bool:
        """Reserve a retry; False (and counted as denied) when the budget is spent."""
        if self.active >= self.allowed(active_requests):
            self.denied_total += 1
            return False
        self.active += 1
        self.started_total += 1
        return True

    def start_unbudgeted(self) -> None:
        """Count a retry that needs no reservation (a connect failure's)."""
        self.started_total += 1

    def finish(self) -> None:
        """A retried attempt ended (whatever the outcome)."""
        self.active -= 1

    def __repr__(self) -> str:
        return (
            f"RetryBudget(active={self.active}, {self.ratio:.0%} of active, min {self.min_retries})"
        )
