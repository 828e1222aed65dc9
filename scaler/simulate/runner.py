"""One simulated run: each tick, signals -> controller (the real engine) -> node -> traffic.

Order within a tick at time ``t``: the services' signals and states at ``t`` go to the
controller; its targets are applied (decreases at once, increases as claims on the node);
the node grants claims that fit; then the traffic of ``[t, t + tick_s)`` is simulated --
in pieces when early ticks (``scaler.simulate.early``) fall inside it, each one the same
sequence at its own time.  The per-tick series still have one entry per regular tick.

``budget.enforcement`` picks the node's CPU rule, the same for every controller (Sluice and
the baselines), so a comparison isolates the controller; one event loop runs every service
under it (:class:`scaler.simulate.loop.EventLoop`): ``limit``, each replica's decided CPU is
a hard cap; ``share``, the decided CPU is a guaranteed share of the node, which all services'
busy replicas share by weight up to their ``cpu.max``.  Under ``limit`` with
``budget.lending`` (the default), Sluice's run also lends the quota of idle services to busy
ones between ticks (:mod:`scaler.lending`), as the local platform does; the baselines cannot
(an HPA per service and a static split leave a quota its owner does not use idle until
something rescales).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from scaler.arbiter import fair_shares
from scaler.policy import BudgetConfig, Enforcement, ScalingPolicy
from scaler.signals import ServiceSignals
from scaler.simulate.arrivals import Arrivals, FloatArray, draw_arrivals, offered_per_tick
from scaler.simulate.baselines import Controller, RunName, make_controller
from scaler.simulate.early import next_early_tick
from scaler.simulate.loop import EventLoop, Lending
from scaler.simulate.model import DRAINING, PENDING, READY, UNBOUNDED, Admission, Node, ServiceModel
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


CGROUP_FIGURES = "cgroups: every tick"


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
    admission: dict[str, Admission] = field(default_factory=dict)
    """The gateway's admission control per service (missing: :data:`UNBOUNDED`)."""
    cpu_measured: frozenset[str] | None = None
    """The services whose CPU use the platform measures (None: every one, as the local
    platform's cgroups and the Kubernetes platform's PodMetrics do; empty: none, as on
    Kubernetes without metrics-server).  The others' signals carry no CPU figures."""
    cpu_window_s: float = 0.0
    """0: a measured service's CPU figure is exact at every tick (cgroup counters).  > 0: it
    is what metrics.k8s.io serves, polled every ``cpu_window_s``
    (:class:`MetricsServerCpu`): late, averaged, and without throttling figures."""

    @property
    def cpu_figures(self) -> str:
        """How the scaler sees the services' CPU use in this scenario, for reports."""
        if self.cpu_measured is not None and not self.cpu_measured:
            return "none"
        w = self.cpu_window_s
        if w > 0:
            return f"PodMetrics: {w:g} s means, polled every {w:g} s"
        return CGROUP_FIGURES

    @property
    def ticks(self) -> int:
        return math.ceil(self.duration_s / self.tick_s - 1e-9)

    def contention(self, budget_cores: float) -> np.ndarray:
        """Ticks where two or more services offer load and together offer more than the budget."""
        offered = np.array([self.offered_cores[s] for s in self.services])
        busy = (offered > 0).sum(axis=0)
        return np.asarray((busy >= 2) & (offered.sum(axis=0) > budget_cores))


def unmeasured(signals: ServiceSignals) -> ServiceSignals:
    """``signals`` as a platform that does not measure the service's CPU reports them."""
    return dataclasses.replace(signals, cpu_seconds_total=None, cpu_throttled_seconds_total=None)


class MetricsServerCpu:
    """CPU figures as a gateway polling metrics.k8s.io PodMetrics every ``window_s`` sees them.

    metrics-server scrapes each kubelet every ``window_s`` and serves the mean use between
    its last two scrapes; the poll falls, on average, half a window after a scrape.  So the
    figure the poll at ``k * window_s`` brings is the mean use over
    ``[(k - 1.5) * window_s, (k - 0.5) * window_s]``, in force until the next poll, and none
    before a full window has been scraped.  The gateway integrates the figure in force into
    the monotonic counter the scaler takes its rate from, as :class:`CpuCounter` does on
    the platform; throttling is not reported (PodMetrics have no such figure)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._times: list[float] = []
        self._totals: dict[str, list[float]] = {}
        self._polled = -1  # the last poll's index k
        self._figure: dict[str, float] = {}
        self._counter: dict[str, float] = {}
        self._at = 0.0

    def signals(
        self, now: float, signals: Mapping[str, ServiceSignals]
    ) -> dict[str, ServiceSignals]:
        """``signals`` (true CPU counters) as the platform reports them at ``now``."""
        self._times.append(now)
        for s, sig in signals.items():
            total = sig.cpu_seconds_total
            self._totals.setdefault(s, []).append(math.nan if total is None else total)
        w = self.window_s
        while (self._polled + 1) * w <= now + 1e-9:
            self._polled += 1
            poll_at = self._polled * w
            self._integrate(poll_at)
            lo, hi = poll_at - 1.5 * w, poll_at - 0.5 * w
            self._figure = {}
            if lo >= -1e-9:
                for s, totals in self._totals.items():
                    a, b = np.interp([lo, hi], self._times, totals)
                    if math.isfinite(a) and math.isfinite(b):
                        self._figure[s] = max(0.0, (b - a) / w)
            self._forget_before(lo + w)  # the next poll's window starts there
        self._integrate(now)
        return {
            s: dataclasses.replace(
                sig,
                cpu_seconds_total=self._counter.get(s) if s in self._figure else None,
                cpu_throttled_seconds_total=None,
            )
            for s, sig in signals.items()
        }

    def _forget_before(self, t: float) -> None:
        """Drop the samples before ``t`` but the last one (the history stays a few windows
        long however long the run)."""
        keep = max(0, bisect.bisect_left(self._times, t) - 1)
        if keep:
            del self._times[:keep]
            for totals in self._totals.values():
                del totals[:keep]

    def _integrate(self, to: float) -> None:
        for s, figure in self._figure.items():
            # from 1.0, as CpuCounter: > 0, so a reset to 0 would always be a step down
            self._counter[s] = self._counter.get(s, 1.0) + figure * max(0.0, to - self._at)
        self._at = max(self._at, to)


def build_scenario(
    workload: Workload,
    policies: Mapping[str, ScalingPolicy],
    *,
    duration_s: float | None = None,
    tick_s: float = 1.0,
    seed: int | None = None,
    admission: Mapping[str, Admission] | None = None,
) -> Scenario:
    """Check the workload against the config and draw the arrivals once for every run
    (``admission``: the gateway's admission control per service, from its ``limits``)."""
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
        services,
        loads,
        arrivals,
        offered_rps,
        offered_cores,
        ticks * tick_s,
        tick_s,
        run_seed,
        {s: a for s, a in (admission or {}).items() if s in policies and a != UNBOUNDED},
    )


@dataclass
class RunResult:
    """What one run produced: per-tick series and every request's latency, per service."""

    name: RunName
    series: dict[str, dict[str, FloatArray]]
    """Per-tick figures per service (``used_cores``: CPU used, above ``allocated_cores`` when
    a replica uses idle CPU under share enforcement)."""
    latencies_s: dict[str, FloatArray]
    """Completed requests' latencies, then the ages of those unfinished at the end (censored)."""
    arrivals: dict[str, int]
    completed: dict[str, int]
    unfinished: dict[str, int]
    cpu_seconds: dict[str, float]
    rules: dict[str, dict[str, int]] = field(default_factory=dict)
    early_ticks_at: list[float] = field(default_factory=list)
    """When the early ticks ran (``budget.early_ticks``), in order."""
    enforcement: Enforcement = "limit"
    """The node model the run used (``budget.enforcement``)."""
    lend_after_idle_s: float | None = None
    """With lending (limit enforcement, Sluice's run): the idle hold; None without."""
    removed_while_starting: dict[str, int] = field(default_factory=dict)
    """Replicas a decision removed while they were starting, per service."""
    replica_reversals: dict[str, int] = field(default_factory=dict)
    """Times the replicas asked for changed direction, per service (every decision counted)."""
    rejected: dict[str, int] = field(default_factory=dict)
    """Requests the gateway's admission control rejected (503), per service."""

    @property
    def early_ticks(self) -> int:
        return len(self.early_ticks_at)

    def outcomes_s(self, service: str) -> FloatArray:
        """Every request of ``service`` by how long it took: the latencies, then ``+inf`` once
        per request admission rejected (a 503 is no answer, however soon it comes: a run that
        sheds requests must not read as faster than one that serves them).  What the runs'
        latency quantiles (p50, p99, the CDF) are taken over."""
        lat = self.latencies_s[service]
        rejected = self.rejected.get(service, 0)
        if not rejected:
            return lat
        return np.concatenate((lat, np.full(rejected, math.inf)))


TickHook = Callable[[float, Mapping[str, ServiceModel], Node], None]
"""Called after every tick (regular or early) with its time, the models and the node."""


def lends(name: RunName, budget: BudgetConfig) -> bool:
    """Whether a run lends idle quota between ticks: Sluice's own run under limit enforcement
    with ``budget.lending`` (the platform does it; an HPA per service or a static split cannot)."""
    return name == "sluice" and budget.resolved(None).rule == "limit" and budget.lending


def entitlements(
    name: RunName,
    services: list[str],
    policies: Mapping[str, ScalingPolicy],
    budget: BudgetConfig,
) -> dict[str, float] | None:
    """Share enforcement on Sluice's run: each service's weight is its fair share of the
    budget (:func:`scaler.arbiter.fair_shares`), as the local platform's per-service cgroups
    weigh them; the baselines' replicas weigh their decided CPU (pods' requests): None."""
    if name != "sluice" or budget.resolved(None).rule != "share":
        return None
    shares = fair_shares(budget.fixed_cores(), [policies[s] for s in services])
    return {s: float(v) for s, v in zip(services, shares.tolist(), strict=True)}


def run(
    scenario: Scenario,
    name: RunName,
    policies: Mapping[str, ScalingPolicy],
    budget: BudgetConfig,
    *,
    progress: Callable[[int], None] | None = None,
    controller: Controller | None = None,
    on_tick: TickHook | None = None,
) -> RunResult:
    """Simulate the whole scenario under one controller (``progress(ticks_done)`` is called as it goes).

    With ``budget.early_ticks``, a decision's ``wake_concurrency`` triggers early ticks
    between the regular ones (``scaler.simulate.early``).  ``budget.enforcement`` picks the
    node model (module docstring)."""
    budget = budget.resolved(None)  # enforcement: auto is share here (the node is the budget)
    ctl = controller or make_controller(name, policies, budget)
    tick = scenario.tick_s
    models = {
        s: ServiceModel(
            s,
            scenario.arrivals[s],
            startup_s=scenario.loads[s].startup_s,
            request_cores_max=scenario.loads[s].request_cores_max,
            cores_max=policies[s].cpu.max,
            tick_s=tick,
            app={
                name: [(v.at_s, v.value) for v in values]
                for name, values in scenario.loads[s].app.items()
            },
            admission=scenario.admission.get(s, UNBOUNDED),
            latency_histogram=any(m.type == "latency" for m in policies[s].metrics),
        )
        for s in scenario.services
    }
    node = Node(budget.fixed_cores(), models)
    lending: Lending | None = None
    if lends(name, budget):
        lending = Lending(
            budget.lend_after_idle_s,
            {s: policies[s].floor_cores for s in scenario.services},
            {s: policies[s].weight for s in scenario.services},
            keep_cores=budget.lend_keep_cores,
            replicas=budget.lend_replicas,
        )
    loop = EventLoop(
        budget.fixed_cores(),
        models,
        rule=budget.rule,
        lending=lending,
        entitlements=entitlements(name, scenario.services, policies, budget),
    )
    claims = node.claims()
    for s, target in ctl.initial().items():
        models[s].set_target(target.replicas, target.cpu_per_replica_cores, claims)
    node.schedule(0.0)
    for m in models.values():  # warm start: the initial replicas are already serving
        for r in m.replicas:
            if r.phase != PENDING:
                r.phase, r.ready_at = READY, 0.0

    measured = scenario.cpu_measured
    metrics_server = MetricsServerCpu(scenario.cpu_window_s) if scenario.cpu_window_s > 0 else None
    gap = budget.early_tick_gap_s
    levels: dict[str, float] = {}
    """Armed wake levels (finite ones, early ticks on), from each service's latest decision."""
    early_at: list[float] = []

    def tick_at(now: float) -> None:
        """One scaler tick at ``now`` (every model is at ``now``)."""
        for m in models.values():
            m.clock = now
        signals = {s: m.signals(now) for s, m in models.items()}
        if metrics_server is not None:
            signals = metrics_server.signals(now, signals)
        if measured is not None:
            signals = {s: sig if s in measured else unmeasured(sig) for s, sig in signals.items()}
        states = {s: m.state() for s, m in models.items()}
        levels.clear()
        for s, target in ctl.decide(now, signals, states).items():
            if s in models:
                models[s].set_target(target.replicas, target.cpu_per_replica_cores, claims)
                if budget.early_ticks and target.wake_concurrency < math.inf:
                    levels[s] = target.wake_concurrency
        node.schedule(now)
        if on_tick is not None:
            on_tick(now, models, node)

    ticks = scenario.ticks
    series = {s: {k: np.zeros(ticks) for k in SERIES} for s in scenario.services}
    slo = {s: scenario.loads[s].slo_s for s in scenario.services}
    for k in range(ticks):
        t0 = k * tick
        t_end = t0 + tick
        tick_at(t0)
        before = {s: (m.arrivals_total, m.cpu_seconds_total) for s, m in models.items()}
        held = {s: [(t0, m.reserved_cores())] for s, m in models.items()}
        last = t0
        while levels:
            at = next_early_tick(loop, levels, t_end, last + gap)
            if at is None:
                break
            tick_at(at)
            early_at.append(at)
            last = at
            for s, m in models.items():
                held[s].append((at, m.reserved_cores()))
        loop.run(t_end)
        for s, m in models.items():
            _record(series[s], k, m, before[s], _mean_held(held[s], t_end, tick), tick, slo[s])
            m.close_tick()
        if progress is not None and (k % 50 == 49 or k == ticks - 1):
            progress(k + 1)

    end = ticks * tick
    latencies: dict[str, FloatArray] = {}
    unfinished: dict[str, int] = {}
    for s, m in models.items():
        waiting = [end - a for a, *_ in m.queue]
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
        rejected={s: m.rejected_total for s, m in models.items()},
        cpu_seconds={s: m.cpu_seconds_total for s, m in models.items()},
        rules={s: dict(c) for s, c in ctl.rules.items()},
        early_ticks_at=early_at,
        enforcement=budget.rule,
        lend_after_idle_s=budget.lend_after_idle_s if lends(name, budget) else None,
        removed_while_starting={s: m.removed_while_starting for s, m in models.items()},
        replica_reversals={s: m.replica_reversals for s, m in models.items()},
    )


def _mean_held(held: list[tuple[float, float]], t_end: float, tick_s: float) -> float:
    """Cores reserved over a tick, weighted by time (they change at early ticks)."""
    if len(held) == 1:
        return held[0][1]
    ends = [t for t, _ in held[1:]] + [t_end]
    return math.fsum(cores * (end - t) for (t, cores), end in zip(held, ends, strict=True)) / tick_s


def _record(  # noqa: PLR0917
    out: dict[str, FloatArray],
    k: int,
    m: ServiceModel,
    before: tuple[int, float],
    reserved_cores: float,
    tick_s: float,
    slo_s: float,
) -> None:
    arrivals_before, cpu_before = before
    t_end = m.clock
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
