"""The status of every ``ScalingPolicy``, written by the leader only, and only on change.

:func:`build_status` is pure: the object, its verdict, the service's last decision, the
workload's replicas -> ``status`` (a :class:`~gateway.platforms.kubernetes.crd.ScalingPolicyStatus`
as JSON).  :class:`PolicyStatusWriter` runs on the leader: each round it builds every
policy's status and PUTs (status subresource, with resourceVersion) those that changed, at most
once per ``min_interval_s`` per object; a policy not in force gets one ``Warning`` Event per
problem and ``Ready=False``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from gateway.platforms.kubernetes import crd
from gateway.platforms.kubernetes.api import KubeApi
from gateway.platforms.kubernetes.model import (
    Conflict,
    KubeError,
    ObjectRef,
    PolicyObject,
    format_cpu,
)
from gateway.platforms.kubernetes.policy_objects import Verdict
from scaler.decision import Decision
from scaler.explanation import Clamp, Step, render_part
from scaler.policy import ScalingPolicy

log = logging.getLogger(__name__)

LIMITS = ("max_replicas", "budget", "cpu.min", "max_scale_up_rate", "behavior.scale_up")
"""Clamps that make a service Limited (it wanted more than it got)."""
_LIMIT_REASONS = {
    "max_replicas": "MaxReplicas",
    "budget": "Budget",
    "cpu.min": "CpuMin",
    "max_scale_up_rate": "ScaleUpRate",
    "behavior.scale_up": "ScaleUpPolicy",
}
REASONS_KEPT = 12


def _condition(
    kind: str,
    ok: bool,
    *,
    reason: str,
    message: str,
    generation: int,
    now: str,
    before: Mapping[str, Any],
) -> dict[str, Any]:
    status = "True" if ok else "False"
    old = before.get(kind) or {}
    since = old.get("lastTransitionTime") if old.get("status") == status else None
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": since or now,
        "observedGeneration": generation,
    }


def _metric(decision: Decision, fallback: str) -> tuple[str, str | None]:
    """The metric that decided and its value."""
    steps = [p for p in decision.explanation.parts if isinstance(p, Step)]
    won = next((s for s in steps if s.kind == "metrics.won"), None)
    name = str(won.values.get("name")) if won is not None else fallback
    for s in steps:
        if s.kind == "metrics.answer" and s.values.get("name") == name:
            return name, str(s.values.get("value"))
    value = decision.inputs.get(name)
    return name, None if value is None else f"{value:.4g}"


def _limited(decision: Decision, policy: ScalingPolicy | None) -> tuple[str, str] | None:
    """(reason, message) when the service got fewer replicas or less CPU than it wants: a clamp
    by one of :data:`LIMITS`, or a rule's ``want`` above the decided replicas."""
    parts = decision.explanation.parts
    clamps = [p for p in parts if isinstance(p, Clamp) and p.name in LIMITS and p.value > p.bound]
    if clamps:
        return _LIMIT_REASONS.get(clamps[0].name, "Clamped"), "; ".join(map(render_part, clamps))
    wants = [
        int(s.values["want"])
        for s in parts
        if isinstance(s, Step) and isinstance(s.values.get("want"), int | float)
    ]
    wanted = max(wants, default=0)
    if wanted <= decision.replicas:
        return None
    at_max = policy is not None and decision.replicas >= policy.max_replicas
    bound = f"max_replicas {policy.max_replicas}" if at_max and policy else "the budget"
    message = f"wants {wanted} replicas, decided {decision.replicas} ({bound})"
    return ("MaxReplicas" if at_max else "Budget"), message


def build_status(
    obj: PolicyObject,
    verdict: Verdict,
    *,
    decision: Decision | None,
    current_replicas: int | None,
    fair_share_cores: float | None,
    budget: str | None,
    policy: ScalingPolicy | None,
    now: str,
) -> dict[str, Any]:
    """The object's ``status`` now (conditions keep their lastTransitionTime while unchanged)."""
    gen = obj.generation
    before = {
        str(c.get("type")): c for c in obj.status.get("conditions") or [] if isinstance(c, dict)
    }
    status: dict[str, Any] = {"observedGeneration": gen, "service": verdict.service}
    conditions = [
        _condition(
            "Ready",
            verdict.ready,
            reason=verdict.reason,
            message=verdict.message,
            generation=gen,
            now=now,
            before=before,
        )
    ]
    if verdict.ready and decision is not None:
        name, value = _metric(decision, "" if policy is None else policy.metric)
        limited = _limited(decision, policy)
        blocked = [
            p
            for p in decision.explanation.parts
            if isinstance(p, Step) and p.kind.startswith("split.resize_blocked")
        ]
        status.update(
            {
                "currentReplicas": current_replicas,
                "desiredReplicas": decision.replicas,
                "cpuPerReplica": format_cpu(decision.cpu_per_replica_cores),
                "allocatedCores": f"{decision.allocated_cores:.3f}",
                "fairShareCores": None if fair_share_cores is None else f"{fair_share_cores:.3f}",
                "budget": budget,
                "metric": name,
                "metricValue": value,
                "rule": decision.rule,
                "reasons": list(decision.reasons)[-REASONS_KEPT:],
            }
        )
        conditions += [
            _condition(
                "Active",
                not decision.frozen,
                reason="Frozen" if decision.frozen else "Deciding",
                message=decision.rule,
                generation=gen,
                now=now,
                before=before,
            ),
            _condition(
                "Limited",
                limited is not None,
                reason=limited[0] if limited is not None else "WithinBounds",
                message=limited[1] if limited is not None else "",
                generation=gen,
                now=now,
                before=before,
            ),
            _condition(
                "ResizeBlocked",
                bool(blocked),
                reason="ResizePending" if blocked else "ResizeAllowed",
                message="; ".join(render_part(p) for p in blocked),
                generation=gen,
                now=now,
                before=before,
            ),
        ]
    elif verdict.ready:
        conditions.append(
            _condition(
                "Active",
                False,
                reason="NoDecision",
                message="no decision yet",
                generation=gen,
                now=now,
                before=before,
            )
        )
    status["conditions"] = conditions
    return {k: v for k, v in status.items() if v is not None}


def _comparable(status: Mapping[str, Any]) -> Any:
    """``status`` without its transition times (a change of time alone is no change)."""
    return {
        **status,
        "conditions": [
            {k: v for k, v in c.items() if k != "lastTransitionTime"}
            for c in status.get("conditions") or []
        ],
    }


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class PolicyStatusWriter:
    """Writes ScalingPolicy statuses from the leader, on change, rate-limited per object."""

    def __init__(
        self,
        api: KubeApi,
        *,
        objects: Callable[[], Mapping[str, PolicyObject]],
        verdicts: Callable[[], Mapping[str, Verdict]],
        decisions: Callable[[], Mapping[str, Decision]],
        replicas: Callable[[str], int | None],
        fair_share: Callable[[str], float | None],
        budget: Callable[[], str | None],
        policy: Callable[[str], ScalingPolicy | None],
        is_leader: Callable[[], bool],
        min_interval_s: float = 2.0,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self._objects = objects
        self._verdicts = verdicts
        self._decisions = decisions
        self._replicas = replicas
        self._fair_share = fair_share
        self._budget = budget
        self._policy = policy
        self._is_leader = is_leader
        self.min_interval_s = min_interval_s
        self._wall = wall_clock
        self._written: dict[str, tuple[Any, float]] = {}
        """uid -> (status as last written, when)."""
        self._warned: set[tuple[str, int, str]] = set()
        self._round = asyncio.Lock()
        self.writes = 0
        self.conflicts = 0

    def __repr__(self) -> str:
        return f"PolicyStatusWriter(writes={self.writes}, conflicts={self.conflicts})"

    async def sync(self) -> int:
        """One round (leader only): write what changed; return how many were written.  Rounds
        never overlap (a second caller waits, then finds the first one's writes done)."""
        async with self._round:
            return await self._sync()

    async def _sync(self) -> int:
        if not self._is_leader():
            return 0
        now = self._wall()
        decisions, verdicts = self._decisions(), self._verdicts()
        written = 0
        for key, obj in sorted(self._objects().items()):
            verdict = verdicts.get(key)
            if verdict is None:
                continue
            if not verdict.ready:
                await self._warn(obj, verdict)
            service = verdict.service
            status = build_status(
                obj,
                verdict,
                decision=decisions.get(service) if service else None,
                current_replicas=self._replicas(service) if service else None,
                fair_share_cores=self._fair_share(service) if service else None,
                budget=self._budget(),
                policy=self._policy(service) if service else None,
                now=rfc3339(now),
            )
            same = _comparable(status)
            last = self._written.get(obj.meta.uid)
            if _comparable(obj.status) == same or (last is not None and last[0] == same):
                continue
            if last is not None and now - last[1] < self.min_interval_s:
                continue  # changed again too soon: the next round after the interval writes it
            if await self._write(obj, status):
                self._written[obj.meta.uid] = (same, now)
                written += 1
        return written

    async def _write(self, obj: PolicyObject, status: Mapping[str, Any]) -> bool:
        try:
            await self.api.update_scaling_policy_status(obj, status)
        except Conflict:
            self.conflicts += 1
            try:  # the watch will bring the new version; write on it now
                fresh = await self.api.get_scaling_policy(obj.meta.namespace, obj.meta.name)
                await self.api.update_scaling_policy_status(fresh, status)
            except KubeError as e:
                log.info("scalingpolicy %s: status not written (%s); next round", obj.meta.key, e)
                return False
        except KubeError as e:
            log.warning("scalingpolicy %s: cannot write its status: %s", obj.meta.key, e)
            return False
        self.writes += 1
        return True

    async def _warn(self, obj: PolicyObject, verdict: Verdict) -> None:
        """One Warning Event per (object, generation, problem)."""
        ident = (obj.meta.uid, obj.generation, verdict.message)
        if ident in self._warned:
            return
        self._warned.add(ident)
        log.warning(
            "scalingpolicy %s not in force: %s: %s", obj.meta.key, verdict.reason, verdict.message
        )
        ref = ObjectRef(crd.KIND, crd.API_VERSION, obj.meta.namespace, obj.meta.name, obj.meta.uid)
        try:
            await self.api.create_event(ref, "Warning", verdict.reason, verdict.message)
        except KubeError as e:
            log.warning("scalingpolicy %s: cannot record an event: %s", obj.meta.key, e)

    async def run(self, interval_s: float = 1.0) -> None:
        """Rounds every ``interval_s`` until cancelled (a failed round is logged, not fatal)."""
        while True:
            try:
                await self.sync()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("scalingpolicy status round failed; next round in %gs", interval_s)
            await asyncio.sleep(interval_s)
