"""One simulated run: each tick, signals -> controller (the real engine) -> node -> traffic.

Order within a tick at time ``t``: the services' signals and states at ``t`` go to the
controller; its targets are applied (decreases at once, increases as claims on the node);
the node grants claims that fit; then the traffic of ``[t, t + tick_s)`` is simulated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from scaler.policy import BudgetConfig, ScalingPolicy
from scaler.simulate.arrivals import Arrivals, FloatArray, draw_arrivals, offered_per_tick
from scaler.simulate.baselines import Controller, RunName, make_controller
from scaler.simulate.model import DRAINING, PENDING, READY, Node, ServiceModel
from scaler.simulate.workload import LoadStep, ServiceLoad, Workload

SERIES = (
    "arrivals",
    "completions",
    "latency_p50_s",
    "latency_p99_s",
    "in_system",
    "replicas",
    "ready_replicas",
    "pending_replicas",
    "cpu_per_replica_cores",
    "allocated_cores",
    "used_cores",
    "over_slo",
)
"""Per-tick figures recorded for every service (``over_slo`` is 1 in a tick over the SLO)."""


class SimulationError(Exception):
    """The simulation cannot run as asked (e.g. the workload names a service the config lacks)."""


@dataclass(frozen=True)
class Scenario:
    """Everything both runs share: services, their load, the very same arrivals, the clock."""

    services: list[str]
    loads: dict[str, ServiceLoad]
    arrivals: dict[str, Arrivals]
    offered_rps: dict[str, FloatArray]
    offered_cores: dict[str, FloatArray]
    duration_s: float
    tick_s: float
    seed: int

    @property
    def ticks(self) -> int:
        return math.ceil(self.duration_s / self.tick_s - 1e-9)

    def contention(self, budget_cores: float) -> np.ndarray:
        """Ticks where two or more services offer load and together offer more than the budget."""
        offered = np.array([self.offered_cores[s] for s in self.services])
        busy = (offered > 0).sum(axis=0)
        return np.asarray((busy >= 2) & (offered.sum(axis=0) > budget_cores))


def build_scenario(
    workload: Workload,
    policies: Mapping[str, ScalingPolicy],
    *,
    duration_s: float | None = None,
    tick_s: float = 1.0,
    seed: int | None = None,
) -> Scenario:
    """Check the workload against the config and draw the arrivals once for every run."""
    unknown = sorted(set(workload.services) - set(policies))
    if unknown:
        raise SimulationError(
            f"the workload names service(s) the config does not have: {', '.join(unknown)} "
            f"(config has: {', '.join(sorted(policies)) or 'none'})"
        )
    if tick_s <= 0:
        raise SimulationError(f"--tick must be > 0, got {tick_s:g}")
    duration = workload.duration_s if duration_s is None else duration_s
    if duration < tick_s:
        raise SimulationError(f"--duration must be >= the tick ({tick_s:g} s), got {duration:g}")
    run_seed = workload.seed if seed is None else seed
    services = sorted(policies)
    idle = ServiceLoad(slo_s=1.0, load=[LoadStep(at_s=0, rps=0, cpu_s=1)])
    loads = {s: workload.services.get(s, idle) for s in services}
    ticks = math.ceil(duration / tick_s - 1e-9)
    arrivals: dict[str, Arrivals] = {}
    offered_rps: dict[str, FloatArray] = {}
    offered_cores: dict[str, FloatArray] = {}
    for s in services:
        arrivals[s] = draw_arrivals(s, loads[s], ticks * tick_s, run_seed)
        offered_rps[s], offered_cores[s] = offered_per_tick(
            loads[s].pieces(ticks * tick_s), ticks, tick_s
        )
    return Scenario(
        services, loads, arrivals, offered_rps, offered_cores, ticks * tick_s, tick_s, run_seed
    )


@dataclass
class RunResult:
    """What one run produced: per-tick series and every request's latency, per service."""

    name: RunName
    series: dict[str, dict[str, FloatArray]]
    latencies_s: dict[str, FloatArray]
    """Completed requests' latencies, then the ages of those unfinished at the end (censored)."""
    arrivals: dict[str, int]
    completed: dict[str, int]
    unfinished: dict[str, int]
    cpu_seconds: dict[str, float]
    rules: dict[str, dict[str, int]] = field(default_factory=dict)


def run(
    scenario: Scenario,
    name: RunName,
    policies: Mapping[str, ScalingPolicy],
    budget: BudgetConfig,
    *,
    progress: Callable[[int], None] | None = None,
    controller: Controller | None = None,
) -> RunResult:
    """Simulate the whole scenario under one controller (``progress(ticks_done)`` is called as it goes)."""
    ctl = controller or make_controller(name, policies, budget)
    tick = scenario.tick_s
    models = {
        s: ServiceModel(
            s,
            scenario.arrivals[s],
            startup_s=scenario.loads[s].startup_s,
            request_cores_max=scenario.loads[s].request_cores_max,
            tick_s=tick,
        )
        for s in scenario.services
    }
    node = Node(budget.cpu, models)
    claims = node.claims()
    for s, target in ctl.initial().items():
        models[s].set_target(target.replicas, target.cpu_per_replica_cores, claims)
    node.schedule(0.0)
    for m in models.values():  # warm start: the initial replicas are already serving
        for r in m.replicas:
            if r.phase != PENDING:
                r.phase, r.ready_at = READY, 0.0

    ticks = scenario.ticks
    series = {s: {k: np.zeros(ticks) for k in SERIES} for s in scenario.services}
    slo = {s: scenario.loads[s].slo_s for s in scenario.services}
    for k in range(ticks):
        t0 = k * tick
        signals = {s: m.signals(t0) for s, m in models.items()}
        states = {s: m.state() for s, m in models.items()}
        for s, target in ctl.decide(t0, signals, states).items():
            if s in models:
                models[s].set_target(target.replicas, target.cpu_per_replica_cores, claims)
        node.schedule(t0)
        for s, m in models.items():
            before = (m.arrivals_total, m.cpu_seconds_total, m.reserved_cores())
            m.run(t0, t0 + tick)
            _record(series[s], k, m, before, tick, slo[s], t0 + tick)
        if progress is not None and (k % 50 == 49 or k == ticks - 1):
            progress(k + 1)

    end = ticks * tick
    latencies: dict[str, FloatArray] = {}
    unfinished: dict[str, int] = {}
    for s, m in models.items():
        waiting = [end - a for a, _ in m.queue]
        waiting += [end - a for r in m.replicas for _, a in r.tags]
        unfinished[s] = len(waiting)
        latencies[s] = np.asarray(m.latencies + waiting, dtype=np.float64)
    return RunResult(
        name=name,
        series=series,
        latencies_s=latencies,
        arrivals={s: m.arrivals_total for s, m in models.items()},
        completed={s: m.completions_total for s, m in models.items()},
        unfinished=unfinished,
        cpu_seconds={s: m.cpu_seconds_total for s, m in models.items()},
        rules={s: dict(c) for s, c in ctl.rules.items()},
    )


def _record(  # noqa: PLR0917
    out: dict[str, FloatArray],
    k: int,
    m: ServiceModel,
    before: tuple[int, float, float],
    tick_s: float,
    slo_s: float,
    t_end: float,
) -> None:
    arrivals_before, cpu_before, reserved_cores = before
    lat = m.tick_latencies
    out["arrivals"][k] = m.arrivals_total - arrivals_before
    out["completions"][k] = len(lat)
    p99 = math.nan
    if lat:
        ordered = sorted(lat)
        out["latency_p50_s"][k] = ordered[max(math.ceil(0.5 * len(ordered)) - 1, 0)]
        p99 = ordered[max(math.ceil(0.99 * len(ordered)) - 1, 0)]
    else:
        out["latency_p50_s"][k] = math.nan
    out["latency_p99_s"][k] = p99
    in_system = m.in_flight + len(m.queue)
    out["in_system"][k] = in_system
    active = m.active()
    out["replicas"][k] = len(active)
    out["ready_replicas"][k] = sum(1 for r in active if r.phase == READY)
    out["pending_replicas"][k] = sum(1 for r in active if r.phase == PENDING)
    running = [r.cores for r in m.replicas if r.phase not in (PENDING, DRAINING)]
    out["cpu_per_replica_cores"][k] = max(running) if running else 0.0
    out["allocated_cores"][k] = reserved_cores
    out["used_cores"][k] = (m.cpu_seconds_total - cpu_before) / tick_s
    over = bool(lat) and p99 > slo_s
    if not over and in_system:
        oldest = m.oldest_arrival()
        over = oldest is not None and t_end - oldest > slo_s
    out["over_slo"][k] = 1.0 if over else 0.0
