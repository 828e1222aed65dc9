"""An asyncio event loop whose clock only moves when a test steps it.

Timers (``call_at``/``call_later``) and aiolimiter (which reads ``loop.time()``) then follow
the stepped clock, so time-dependent code is tested without sleeping.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class SteppedLoop(asyncio.SelectorEventLoop):
    def __init__(self, start: float = 1000.0) -> None:
        super().__init__()
        self.now = start

    def time(self) -> float:
        return self.now

    def settle(self) -> None:
        """Run every callback that is due now (and those they schedule for now)."""
        for _ in range(5):
            self.run_until_complete(asyncio.sleep(0))

    def advance(self, seconds: float) -> None:
        """Move the clock forward and run what became due."""
        self.now += seconds
        self.settle()

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` inside the running loop (aiolimiter needs one) and return its result."""

        async def inside() -> T:
            return fn()

        return self.run_until_complete(inside())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.run_until_complete(coro)
