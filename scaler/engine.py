"""The scaler's decision function: ``Engine.tick(now, signals, states) -> decisions`` (pure).

Contract (other parts of Sluice code against it; extend, don't rename):

* ``Engine(policies, budget)`` holds per-service window state in memory; no I/O, no clock.
  Optional keywords: ``staleness_s`` (signals older than this freeze the service, default
  3 s = 3 ticks at 1 s), ``hysteresis_cores`` / ``hysteresis_ratio`` (the arbiter's band).
* ``tick(now, signals, states)`` takes the time on the injected clock, the latest
  ``ServiceSignals`` per service (a service missing from ``signals``, or whose snapshot is
  stale, is frozen, never scaled down) and the platform's ``ServiceState`` per service,
  and returns one ``Decision`` per configured service, in the policies' order.

Per tick and service: the metric (concurrency or rps) is fed to the horizontal recommender
(KPA windows, or the HPA calculation), which says how many *reference replicas* (of
``cpu.request`` cores) are needed; that times ``cpu.request`` is the CPU demand (or, when
the platform measures CPU, the measured use with headroom, raised by throttling).  The
arbiter (``scaler.budget``) turns all demands into allocations under the budget, and each
allocation is split into replicas × CPU per replica.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from scaler.budget import (
    Claim,
    IndependentClaim,
    arbitrate_independent,
    arbitrate_shared,
    fair_shares,
    split_allocation,
)
from scaler.decision import Decision, ServiceState
from scaler.horizontal import HorizontalRecommendation, KpaRecommender
from scaler.hpa import HpaBehaviorState, NoMetricsError, PodSample, calculate_replicas
from scaler.policy import BudgetConfig, ScalingPolicy, check_floors
from scaler.signals import BucketedWindow, CounterRate, ServiceSignals

_EPS = 1e-9


class _Track:
    """What the engine remembers about one service between ticks."""

    __slots__ = (
        "arrivals",
        "cpu_rate",
        "cpu_ref",
        "fair_share",
        "hpa",
        "hpa_window",
        "kpa",
        "last_allocation",
        "last_at",
        "last_rps",
        "last_throttled",
        "last_used",
        "name",
        "policy",
        "throttle_rate",
    )

    def __init__(self, name: str, policy: ScalingPolicy, fair_share: float) -> None:
        self.name = name
        self.policy = policy
        self.cpu_ref = policy.cpu.initial_cores
        self.fair_share = fair_share
        self.kpa = KpaRecommender(policy) if policy.mode == "kpa" else None
        self.hpa = HpaBehaviorState(policy.behavior) if policy.mode == "hpa" else None
        self.hpa_window = BucketedWindow(policy.panic_window_s) if policy.mode == "hpa" else None
        self.arrivals = CounterRate()
        self.cpu_rate = CounterRate()
        self.throttle_rate = CounterRate()
        self.last_at: float | None = None
        self.last_rps: float | None = None
        self.last_used: float | None = None
        self.last_throttled: float | None = None
        self.last_allocation: float | None = None


class Engine:
    """Signals + policies + platform state -> one explained decision per service, per tick."""

    def __init__(
        self,
        policies: Mapping[str, ScalingPolicy],
        budget: BudgetConfig,
        *,
        staleness_s: float = 3.0,
        hysteresis_cores: float = 0.05,
        hysteresis_ratio: float = 0.05,
    ) -> None:
        if staleness_s <= 0:
            raise ValueError(f"staleness_s must be > 0, got {staleness_s!r}")
        self.policies = dict(policies)
        self.budget = budget
        check_floors(budget, self.policies)
        self.staleness_s = staleness_s
        self.hysteresis_cores = hysteresis_cores
        self.hysteresis_ratio = hysteresis_ratio
        shares = fair_shares(budget.cpu, list(self.policies.values()))
        self._tracks = [
            _Track(name, policy, share)
            for (name, policy), share in zip(self.policies.items(), shares, strict=True)
        ]

    def __repr__(self) -> str:
        return (
            f"Engine(services={len(self._tracks)}, budget={self.budget.cpu:g} cores, "
            f"arbitration={self.budget.arbitration})"
        )

    def fair_share(self, service: str) -> float:
        """Cores ``service`` is entitled to when every service wants all it can use."""
        for track in self._tracks:
            if track.name == service:
                return track.fair_share
        raise KeyError(service)

    def tick(
        self,
        now: float,
        signals: Mapping[str, ServiceSignals],
        states: Mapping[str, ServiceState],
    ) -> dict[str, Decision]:
        """Decide every configured service's replicas and CPU for this tick."""
        n = len(self._tracks)
        recs: list[HorizontalRecommendation] = [None] * n  # type: ignore[list-item]
        frozen: list[str | None] = [None] * n
        currents: list[tuple[int, int, float]] = [(0, 0, 0.0)] * n
        demands = [0.0] * n
        for i, track in enumerate(self._tracks):
            policy = track.policy
            state = states.get(track.name)
            if state is None:
                cur = (0, 0, track.cpu_ref)
            else:
                cur = (state.replicas, state.ready_replicas, state.cpu_per_replica_cores)
            currents[i] = cur
            sig = signals.get(track.name)
            if sig is None:
                frozen[i] = "frozen: missing signals"
            elif now - sig.at > self.staleness_s:
                frozen[i] = "frozen: stale signals"
            if frozen[i] is not None:
                held = min(max(cur[0], policy.min_replicas), policy.max_replicas)
                cpu = min(max(cur[2], policy.cpu.min), policy.cpu.max)
                demands[i] = held * cpu
                continue
            assert sig is not None
            rec = self._recommend(track, now, sig, cur)
            recs[i] = rec
            if not rec.valid:
                frozen[i] = "frozen: no data"
                held = min(max(cur[0], policy.min_replicas), policy.max_replicas)
                cpu = min(max(cur[2], policy.cpu.min), policy.cpu.max)
                demands[i] = held * cpu
                continue
            demands[i] = self._demand(track, rec, cur)

        if self.budget.arbitration == "independent":
            return self._decide_independent(now, recs, frozen, currents, demands)
        return self._decide_shared(now, recs, frozen, currents, demands)

    # -- horizontal ------------------------------------------------------------------

    def _recommend(
        self, track: _Track, now: float, sig: ServiceSignals, cur: tuple[int, int, float]
    ) -> HorizontalRecommendation:
        policy = track.policy
        fresh = sig.at != track.last_at
        if fresh:
            track.last_at = sig.at
            rate = track.arrivals.update(sig.at, sig.arrivals_total)
            track.last_rps = rate if rate is not None else sig.rps
            if sig.cpu_seconds_total is not None:
                track.last_used = track.cpu_rate.update(sig.at, sig.cpu_seconds_total)
            if sig.cpu_throttled_seconds_total is not None:
                track.last_throttled = track.throttle_rate.update(
                    sig.at, sig.cpu_throttled_seconds_total
                )
        value = (
            float(sig.in_flight + sig.queued)
            if policy.metric == "concurrency"
            else (track.last_rps or 0.0)
        )
        replicas, ready, cpu = cur
        ready_capacity = ready * cpu / track.cpu_ref
        if track.kpa is not None:
            if fresh:
                track.kpa.observe(now, value)
            rec = track.kpa.recommend(now, ready_capacity, replicas)
        else:
            rec = self._recommend_hpa(track, now, value, fresh, cur)
        rec.inputs[policy.metric] = value
        return rec

    def _recommend_hpa(
        self, track: _Track, now: float, value: float, fresh: bool, cur: tuple[int, int, float]
    ) -> HorizontalRecommendation:
        policy = track.policy
        window = track.hpa_window
        hpa = track.hpa
        assert window is not None and hpa is not None
        if fresh:
            window.record(now, value)
        average = window.average(now)
        if average is None:
            return HorizontalRecommendation(cur[0], "no-data", ["no metric data"], valid=False)
        replicas, ready, cpu = cur
        scale = cpu / track.cpu_ref
        current = math.ceil(replicas * scale - 1e-6)
        ready_ref = min(current, round(ready * scale))
        reasons = [
            f"hpa: {policy.metric} {average:.2f} over {policy.panic_window_s:g}s, target "
            f"{policy.target:g} per replica, {current} replicas ({ready_ref} ready)"
        ]
        if current == 0:
            samples = [PodSample(True, average)]
        else:
            per_pod = average / ready_ref if ready_ref else 0.0
            samples = [PodSample(True, per_pod)] * ready_ref + [PodSample(False, None)] * (
                current - ready_ref
            )
        rule = "hpa"
        try:
            result = calculate_replicas(samples, current, policy.target, policy.tolerance)
            desired = result.replicas
            reasons.append(f"hpa: {result.reason}")
        except NoMetricsError as e:
            desired = current
            rule = "hpa-no-ready-pods"
            reasons.append(f"hpa: {e}, holding")
        desired = hpa.normalize(
            now,
            current=current,
            desired=desired,
            min_replicas=policy.min_replicas,
            max_replicas=policy.max_replicas,
            reasons=reasons,
        )
        return HorizontalRecommendation(
            desired, rule, reasons, {"average": average, "capacity_replicas": float(current)}
        )

    def _demand(
        self, track: _Track, rec: HorizontalRecommendation, cur: tuple[int, int, float]
    ) -> float:
        policy = track.policy
        wanted = rec.replicas
        load = wanted if rec.load_replicas is None else min(rec.load_replicas, wanted)
        demand = max(load * track.cpu_ref, wanted * policy.cpu.min)
        used = track.last_used
        replicas, _, cpu = cur
        if used is not None and load > 0 and replicas > 0:
            capacity_ref = replicas * cpu / track.cpu_ref
            growth = max(1.0, load / capacity_ref) if capacity_ref > 0 else 1.0
            throttled = track.last_throttled or 0.0
            boost = 1.0 + min(1.0, throttled / replicas)
            measured = used / policy.target_utilization * growth * boost
            demand = max(measured, wanted * policy.cpu.min)
            rec.inputs["cpu_used_cores"] = used
            rec.inputs["cpu_throttled_per_replica"] = throttled / replicas
        cap = policy.max_replicas * policy.cpu.max
        return min(demand, cap)

    # -- arbitration -----------------------------------------------------------------

    def _decide_shared(
        self,
        now: float,
        recs: list[HorizontalRecommendation],
        frozen: list[str | None],
        currents: list[tuple[int, int, float]],
        demands: list[float],
    ) -> dict[str, Decision]:
        claims: list[Claim] = []
        for i, track in enumerate(self._tracks):
            policy = track.policy
            cur = currents[i]
            previous = track.last_allocation
            if previous is None:
                previous = cur[0] * cur[2]
            minimum = policy.min_replicas * policy.cpu.min
            claims.append(
                Claim(
                    name=track.name,
                    weight=policy.weight,
                    minimum=minimum,
                    floor=max(policy.floor_cores, minimum),
                    cap=policy.max_replicas * policy.cpu.max,
                    demand=demands[i],
                    previous=previous,
                    fair_share=track.fair_share,
                    fixed=frozen[i] is not None,
                )
            )
        allocation = arbitrate_shared(
            self.budget.cpu, claims, self.hysteresis_cores, self.hysteresis_ratio
        )
        out: dict[str, Decision] = {}
        for i, track in enumerate(self._tracks):
            policy = track.policy
            cores = allocation.cores[i]
            cur = currents[i]
            claim = claims[i]
            replicas, cpu, note = split_allocation(
                cores,
                policy,
                cpu_ref=track.cpu_ref,
                current_replicas=cur[0],
                squeezed=frozen[i] is not None or cores < claim.demand - 1e-6,
            )
            allocated = replicas * cpu
            track.last_allocation = allocated
            reasons: list[str] = []
            rec = recs[i]
            inputs: dict[str, float] = {}
            if rec is not None:
                reasons.extend(rec.reasons)
                inputs = rec.inputs
            if frozen[i] is not None:
                reasons.append(
                    f"{frozen[i]}: keeping {cur[0]}×{cur[2]:.2f} cores, never scaling down on missing data"
                )
            reasons.append(
                f"budget: demand {claim.demand:.2f} cores (floor {claim.floor:.2f}, fair share "
                f"{track.fair_share:.2f}) -> {replicas}×{cpu:.2f} = {allocated:.2f} cores"
            )
            reasons.extend(allocation.notes[i])
            if note is not None:
                reasons.append(note)
            inputs["demand_cores"] = claim.demand
            inputs["fair_share_cores"] = track.fair_share
            inputs["floor_cores"] = claim.floor
            if rec is not None:
                inputs["horizontal_replicas"] = float(rec.replicas)
            rule = frozen[i] or (rec.rule if rec is not None else "frozen")
            out[track.name] = Decision(
                service=track.name,
                at=now,
                replicas=replicas,
                cpu_per_replica_cores=cpu,
                allocated_cores=allocated,
                rule=rule,
                reasons=tuple(reasons),
                inputs=inputs,
                frozen=frozen[i] is not None,
            )
            if track.hpa is not None and frozen[i] is None:
                scale = cpu / track.cpu_ref
                track.hpa.record_scale(
                    now,
                    math.ceil(cur[0] * cur[2] / track.cpu_ref - 1e-6),
                    math.ceil(replicas * scale - 1e-6),
                )
        return out

    def _decide_independent(
        self,
        now: float,
        recs: list[HorizontalRecommendation],
        frozen: list[str | None],
        currents: list[tuple[int, int, float]],
        demands: list[float],
    ) -> dict[str, Decision]:
        claims: list[IndependentClaim] = []
        for i, track in enumerate(self._tracks):
            cur = currents[i]
            rec = recs[i]
            want = cur[0] if frozen[i] is not None or rec is None else rec.replicas
            claims.append(
                IndependentClaim(
                    name=track.name,
                    policy=track.policy,
                    cpu_ref=track.cpu_ref,
                    want_replicas=want,
                    held_replicas=cur[0],
                    fixed=frozen[i] is not None,
                )
            )
        granted, notes = arbitrate_independent(self.budget.cpu, claims)
        out: dict[str, Decision] = {}
        for i, track in enumerate(self._tracks):
            replicas, cpu = granted[i]
            allocated = replicas * cpu
            track.last_allocation = allocated
            rec = recs[i]
            cur = currents[i]
            reasons: list[str] = list(rec.reasons) if rec is not None else []
            inputs: dict[str, float] = rec.inputs if rec is not None else {}
            if frozen[i] is not None:
                reasons.append(
                    f"{frozen[i]}: keeping {cur[0]} replicas, never scaling down on missing data"
                )
            reasons.append(
                f"independent: wants {claims[i].want_replicas} replicas of {track.cpu_ref:g} cores "
                f"-> {replicas}×{cpu:.2f} = {allocated:.2f} cores"
            )
            reasons.extend(notes[i])
            inputs["demand_cores"] = demands[i]
            rule = frozen[i] or (rec.rule if rec is not None else "frozen")
            out[track.name] = Decision(
                service=track.name,
                at=now,
                replicas=replicas,
                cpu_per_replica_cores=cpu,
                allocated_cores=allocated,
                rule=rule,
                reasons=tuple(reasons),
                inputs=inputs,
                frozen=frozen[i] is not None,
            )
            if track.hpa is not None and frozen[i] is None:
                track.hpa.record_scale(now, cur[0], replicas)
        return out
