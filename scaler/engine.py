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
from scaler.decision import Decision, Explanation, ServiceState
from scaler.horizontal import HorizontalRecommendation, KpaRecommender
from scaler.hpa import HpaBehaviorState, NoMetricsError, PodSample, calculate_replicas
from scaler.policy import BudgetConfig, ScalingPolicy, check_floors
from scaler.signals import BucketedWindow, CounterRate, ServiceSignals

_EPS = 1e-9


class _Track:
    """What the engine remembers about one service between ticks."""

    __slots__ = (
        "arrivals",
        "claim",
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
        minimum = policy.min_replicas * policy.cpu.min
        self.claim = Claim(
            name=name,
            weight=policy.weight,
            minimum=minimum,
            floor=max(policy.floor_cores, minimum),
            cap=policy.max_replicas * policy.cpu.max,
            fair_share=fair_share,
        )


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
        self._by_name = {t.name: t for t in self._tracks}

    def __repr__(self) -> str:
        return (
            f"Engine(services={len(self._tracks)}, budget={self.budget.cpu:g} cores, "
            f"arbitration={self.budget.arbitration})"
        )

    def fair_share(self, service: str) -> float:
        """Cores ``service`` is entitled to when every service wants all it can use."""
        return self._by_name[service].fair_share

    def tick(
        self,
        now: float,
        signals: Mapping[str, ServiceSignals],
        states: Mapping[str, ServiceState],
    ) -> dict[str, Decision]:
        """Decide every configured service's replicas and CPU for this tick."""
        n = len(self._tracks)
        recs: list[HorizontalRecommendation | None] = [None] * n
        frozen: list[str | None] = [None] * n
        currents: list[tuple[int, int, float, bool]] = []
        explains = [Explanation() for _ in range(n)]
        oldest = now - self.staleness_s
        for i, track in enumerate(self._tracks):
            policy = track.policy
            state = states.get(track.name)
            if state is None:
                cur = (0, 0, track.cpu_ref, False)
            else:
                cur = (
                    state.replicas,
                    state.ready_replicas,
                    state.cpu_per_replica_cores,
                    state.resize_blocked,
                )
            currents.append(cur)
            claim = track.claim
            previous = track.last_allocation
            claim.previous = cur[0] * cur[2] if previous is None else previous
            sig = signals.get(track.name)
            reason = None
            if sig is None:
                reason = "frozen: missing signals"
            elif sig.at < oldest:
                reason = "frozen: stale signals"
            else:
                rec = self._recommend(track, now, sig, cur)
                recs[i] = rec
                explains[i] = rec.reasons
                if rec.valid:
                    claim.demand = self._demand(track, rec, cur)
                    claim.hold = 0.0
                    continue
                reason = "frozen: no data"
            frozen[i] = reason
            held = min(max(cur[0], policy.min_replicas), policy.max_replicas)
            cpu = min(max(cur[2], policy.cpu.min), policy.cpu.max)
            claim.demand = held * cpu
            claim.hold = held * policy.cpu.min
            explains[i].add(
                "%s: keeping %d×%.2f cores, never scaling down on missing data",
                reason,
                cur[0],
                cur[2],
            )
        if self.budget.arbitration == "independent":
            return self._decide_independent(now, recs, frozen, currents, explains)
        return self._decide_shared(now, recs, frozen, currents, explains)

    # -- horizontal ------------------------------------------------------------------

    def _recommend(
        self,
        track: _Track,
        now: float,
        sig: ServiceSignals,
        cur: tuple[int, int, float, bool],
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
        if policy.metric == "concurrency":
            value = float(sig.in_flight + sig.queued)
        else:
            value = track.last_rps or 0.0
        kpa = track.kpa
        if kpa is not None:
            if fresh:
                kpa.observe(now, value)
            rec = kpa.recommend(now, cur[1] * cur[2] / track.cpu_ref, cur[0])
        else:
            rec = self._recommend_hpa(track, now, value, fresh, cur)
        rec.inputs[policy.metric] = value
        return rec

    def _recommend_hpa(
        self,
        track: _Track,
        now: float,
        value: float,
        fresh: bool,
        cur: tuple[int, int, float, bool],
    ) -> HorizontalRecommendation:
        policy = track.policy
        window = track.hpa_window
        hpa = track.hpa
        assert window is not None and hpa is not None
        if fresh:
            window.record(now, value)
        average = window.average(now)
        reasons = Explanation()
        if average is None:
            reasons.add("no metric data")
            return HorizontalRecommendation(cur[0], "no-data", reasons, valid=False)
        replicas, ready, cpu, _ = cur
        scale = cpu / track.cpu_ref
        current = math.ceil(replicas * scale - 1e-6)
        ready_ref = min(current, round(ready * scale))
        reasons.add(
            "hpa: %s %.2f over %gs, target %g per replica, %d replicas (%d ready)",
            policy.metric,
            average,
            policy.panic_window_s,
            policy.target,
            current,
            ready_ref,
        )
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
            reasons.add("hpa: %s", result.reason)
        except NoMetricsError as e:
            desired = current
            rule = "hpa-no-ready-pods"
            reasons.add("hpa: %s, holding", e)
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
        self, track: _Track, rec: HorizontalRecommendation, cur: tuple[int, int, float, bool]
    ) -> float:
        """Cores this service needs: its wanted replicas at ``cpu.request`` (replicas kept only
        for min_replicas or the idle hold need just ``cpu.min``), or measured use with headroom."""
        policy = track.policy
        wanted = rec.replicas
        load = wanted if rec.load_replicas is None else min(rec.load_replicas, wanted)
        demand = load * track.cpu_ref
        least = wanted * policy.cpu.min
        demand = max(demand, least)
        used = track.last_used
        replicas = cur[0]
        if used is not None and load > 0 and replicas > 0:
            capacity_ref = replicas * cur[2] / track.cpu_ref
            growth = max(1.0, load / capacity_ref) if capacity_ref > 0 else 1.0
            throttled = track.last_throttled or 0.0
            boost = 1.0 + min(1.0, throttled / replicas)
            measured = used / policy.target_utilization * growth * boost
            demand = max(measured, least)
            rec.inputs["cpu_used_cores"] = used
            rec.inputs["cpu_throttled_per_replica"] = throttled / replicas
        cap = track.claim.cap
        return demand if demand < cap else cap

    # -- arbitration -----------------------------------------------------------------

    def _decide_shared(
        self,
        now: float,
        recs: list[HorizontalRecommendation | None],
        frozen: list[str | None],
        currents: list[tuple[int, int, float, bool]],
        explains: list[Explanation],
    ) -> dict[str, Decision]:
        tracks = self._tracks
        claims = [t.claim for t in tracks]
        cores_list = arbitrate_shared(
            self.budget.cpu, claims, self.hysteresis_cores, self.hysteresis_ratio, explains
        )
        out: dict[str, Decision] = {}
        for i, track in enumerate(tracks):
            policy = track.policy
            cores = cores_list[i]
            cur = currents[i]
            claim = claims[i]
            explain = explains[i]
            is_frozen = frozen[i] is not None
            replicas, cpu = split_allocation(
                cores,
                policy,
                cpu_ref=track.cpu_ref,
                current_replicas=cur[0],
                squeezed=is_frozen or cores < claim.demand - 1e-6,
                # A blocked resize: scale replicas instead -- unless frozen (keep replicas).
                fixed_cpu=cur[2] if cur[3] and cur[0] > 0 and not is_frozen else None,
                explain=explain,
            )
            allocated = replicas * cpu
            track.last_allocation = allocated
            explain.add(
                "budget: demand %.2f cores (floor %.2f, fair share %.2f) -> %d×%.2f = %.2f cores",
                claim.demand,
                claim.floor,
                claim.fair_share,
                replicas,
                cpu,
                allocated,
            )
            rec = recs[i]
            if rec is not None:
                inputs = rec.inputs
                inputs["horizontal_replicas"] = rec.replicas
                rule = frozen[i] or rec.rule
            else:
                inputs = {}
                rule = frozen[i] or "frozen"
            inputs["demand_cores"] = claim.demand
            inputs["allocation_cores"] = cores
            inputs["fair_share_cores"] = claim.fair_share
            inputs["floor_cores"] = claim.floor
            out[track.name] = Decision(
                track.name, now, replicas, cpu, allocated, rule, explain, inputs, is_frozen
            )
            if track.hpa is not None and not is_frozen:
                ref = track.cpu_ref
                track.hpa.record_scale(
                    now, math.ceil(cur[0] * cur[2] / ref - 1e-6), math.ceil(allocated / ref - 1e-6)
                )
        return out

    def _decide_independent(
        self,
        now: float,
        recs: list[HorizontalRecommendation | None],
        frozen: list[str | None],
        currents: list[tuple[int, int, float, bool]],
        explains: list[Explanation],
    ) -> dict[str, Decision]:
        claims: list[IndependentClaim] = []
        for i, track in enumerate(self._tracks):
            cur = currents[i]
            rec = recs[i]
            fixed = frozen[i] is not None
            claims.append(
                IndependentClaim(
                    name=track.name,
                    policy=track.policy,
                    cpu_ref=track.cpu_ref,
                    want_replicas=cur[0] if fixed or rec is None else rec.replicas,
                    held_replicas=cur[0],
                    fixed=fixed,
                )
            )
        granted = arbitrate_independent(self.budget.cpu, claims, explains)
        out: dict[str, Decision] = {}
        for i, track in enumerate(self._tracks):
            replicas, cpu = granted[i]
            allocated = replicas * cpu
            track.last_allocation = allocated
            rec = recs[i]
            cur = currents[i]
            explain = explains[i]
            explain.add(
                "independent: wants %d replicas of %g cores -> %d×%.2f = %.2f cores",
                claims[i].want_replicas,
                track.cpu_ref,
                replicas,
                cpu,
                allocated,
            )
            inputs: dict[str, float] = rec.inputs if rec is not None else {}
            inputs["demand_cores"] = track.claim.demand
            inputs["allocation_cores"] = allocated
            rule = frozen[i] or (rec.rule if rec is not None else "frozen")
            out[track.name] = Decision(
                track.name,
                now,
                replicas,
                cpu,
                allocated,
                rule,
                explain,
                inputs,
                frozen[i] is not None,
            )
            if track.hpa is not None and frozen[i] is None:
                track.hpa.record_scale(now, cur[0], replicas)
        return out
