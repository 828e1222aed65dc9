"""The scaler loop with a fake clock, a fake waiter and the recommend-only actuator."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import pytest

from scaler.actuators.none import RecommendOnlyActuator
from scaler.decision import Decision, ServiceState
from scaler.engine import Engine
from scaler.loop import ScalerLoop, Waiter
from scaler.policy import BudgetConfig, ScalingPolicy
from scaler.signals import ServiceSignals


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    async def wait(self, event: asyncio.Event, timeout_s: float) -> None:
        """Instead of sleeping: jump the clock forward, unless woken."""
        if not event.is_set():
            self.now += timeout_s


def engine() -> Engine:
    return Engine({"api": ScalingPolicy(target=10, max_replicas=5)}, BudgetConfig(cpu=2))


def test_recommend_only_actuator_reports_decisions_as_applied() -> None:
    actuator = RecommendOnlyActuator({"api": ServiceState("api", 1, 1, 0.1)})
    decision = Decision("api", 1.0, 3, 0.5, 1.5, "stable")
    asyncio.run(actuator.apply({"api": decision}))
    state = asyncio.run(actuator.current())["api"]
    assert (state.replicas, state.ready_replicas, state.cpu_per_replica_cores) == (3, 3, 0.5)
    assert list(actuator.applied) == [decision]


async def test_tick_reads_signals_and_state_decides_and_applies() -> None:
    clock = FakeClock()
    actuator = RecommendOnlyActuator()
    seen: list[Mapping[str, Decision]] = []
    loop = ScalerLoop(
        engine(),
        lambda: {"api": ServiceSignals("api", clock.now, in_flight=30)},
        actuator,
        clock=clock,
        on_decisions=seen.append,
    )
    decisions = await loop.tick()
    assert decisions["api"].at == 100.0
    assert decisions["api"].replicas >= 1
    assert (await actuator.current())["api"].replicas == decisions["api"].replicas
    assert loop.last == decisions and seen == [decisions]
    assert [d.service for d in loop.recent] == ["api"]


async def test_async_signals_provider() -> None:
    clock = FakeClock()

    async def provide() -> dict[str, ServiceSignals]:
        return {"api": ServiceSignals("api", clock.now)}

    loop = ScalerLoop(engine(), provide, RecommendOnlyActuator(), clock=clock)
    assert not (await loop.tick())["api"].frozen


async def test_run_ticks_on_the_interval_of_the_injected_clock() -> None:
    clock = FakeClock()
    actuator = RecommendOnlyActuator()
    loop = ScalerLoop(
        engine(),
        lambda: {"api": ServiceSignals("api", clock.now, in_flight=5)},
        actuator,
        clock=clock,
        interval_s=2.0,
        wait=clock.wait,
    )
    await loop.run(max_ticks=3)
    assert loop.ticks == 3
    assert [d.at for d in actuator.applied] == [100.0, 102.0, 104.0]


async def test_a_failing_tick_is_logged_and_the_loop_carries_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    calls = 0

    def flaky() -> dict[str, ServiceSignals]:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("gateway stats unavailable")
        return {"api": ServiceSignals("api", clock.now)}

    loop = ScalerLoop(engine(), flaky, RecommendOnlyActuator(), clock=clock, wait=clock.wait)
    with caplog.at_level(logging.ERROR, logger="scaler.loop"):
        await loop.run(max_ticks=4)
    assert (loop.ticks, loop.errors) == (3, 1)
    assert "scaler tick failed" in caplog.text and "gateway stats unavailable" in caplog.text


async def test_wake_runs_a_tick_at_once() -> None:
    clock = FakeClock()
    loop = ScalerLoop(
        engine(),
        lambda: {"api": ServiceSignals("api", clock.now)},
        RecommendOnlyActuator(),
        clock=clock,
        interval_s=3600.0,  # the real waiter: without wake() the next tick is an hour away
    )
    task = asyncio.create_task(loop.run())
    try:
        for _ in range(500):
            if loop.ticks >= 1:
                break
            await asyncio.sleep(0.01)
        assert loop.ticks == 1
        loop.wake()
        for _ in range(500):
            if loop.ticks >= 2:
                break
            await asyncio.sleep(0.01)
        assert loop.ticks == 2
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def scripted_waiter(clock: FakeClock, wakes: list[float], loop: list[ScalerLoop]) -> Waiter:
    """Jumps the clock like FakeClock.wait, but calls ``wake()`` at the times in ``wakes``."""

    async def wait(event: asyncio.Event, timeout_s: float) -> None:
        if event.is_set():
            return
        end = clock.now + timeout_s
        if wakes and wakes[0] < end:
            clock.now = wakes.pop(0)
            loop[0].wake()
        else:
            clock.now = end

    return wait


@pytest.mark.parametrize(
    ("wake_at", "ticks_at"),
    [
        (100.5, [100.0, 100.5, 101.0, 102.0]),  # early tick at once, the grid unchanged
        (100.03, [100.0, 100.1, 101.0, 102.0]),  # too soon after the last tick: wait the gap
        (100.97, [100.0, 100.97, 101.0, 102.0]),  # the regular tick stays on its grid
    ],
)
async def test_wake_ticks_early_at_most_once_a_gap_and_keeps_the_grid(
    wake_at: float, ticks_at: list[float]
) -> None:
    clock = FakeClock()
    actuator = RecommendOnlyActuator()
    holder: list[ScalerLoop] = []
    loop = ScalerLoop(
        engine(),
        lambda: {"api": ServiceSignals("api", clock.now)},
        actuator,
        clock=clock,
        interval_s=1.0,
        early_tick_gap_s=0.1,
        wait=scripted_waiter(clock, [wake_at], holder),
    )
    holder.append(loop)
    await loop.run(max_ticks=4)
    assert [d.at for d in actuator.applied] == pytest.approx(ticks_at)
    assert loop.early_ticks == 1


def test_bad_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        ScalerLoop(engine(), dict, RecommendOnlyActuator(), interval_s=0)
