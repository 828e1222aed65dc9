"""Which ``ScalingPolicy`` objects are in force, and why the others are not (pure).

Precedence for a service: the config file's ``services."<ns>/<name>".scaling`` > a
ScalingPolicy whose ``targetRef.service`` names it > ``sluice.io/`` Ingress annotations.  Two
ScalingPolicies for one service: the older (creationTimestamp, then name) is in force, the
other conflicts.  Every object gets a :class:`Verdict`; one that is not in force says why
(``InvalidSpec``, ``OverriddenByConfig``, ``Conflict``, ``BudgetExceeded``, ``NotRouted``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gateway.platforms.kubernetes.crd import parse_spec
from gateway.platforms.kubernetes.model import PolicyObject, Workload
from scaler.policy import BudgetConfig, KeyedValueError, ScalingPolicy, check_floors


@dataclass(frozen=True, slots=True)
class Verdict:
    ready: bool
    reason: str
    message: str
    service: str = ""
    """The Sluice service it targets (``namespace/name``); '' when the spec is invalid."""


@dataclass(frozen=True, slots=True)
class PolicyObjects:
    """The policies in force by service, and a verdict per object (``namespace/name``)."""

    policies: Mapping[str, ScalingPolicy] = field(default_factory=dict)
    workloads: Mapping[str, Workload] = field(default_factory=dict)
    verdicts: Mapping[str, Verdict] = field(default_factory=dict)

    def not_routed(self, routed: Iterable[str]) -> PolicyObjects:
        """Mark the policies whose service no Ingress of ours routes to (not in force)."""
        served = set(routed)
        verdicts = {
            key: (
                Verdict(
                    False,
                    "NotRouted",
                    f"no Ingress of this gateway routes to Service {v.service}",
                    v.service,
                )
                if v.ready and v.service not in served
                else v
            )
            for key, v in self.verdicts.items()
        }
        return PolicyObjects(self.policies, self.workloads, verdicts)


def resolve(
    objects: Iterable[PolicyObject],
    configured: Mapping[str, ScalingPolicy],
    budget: BudgetConfig | None = None,
) -> PolicyObjects:
    """The policies of ``objects`` in force (see the module doc); ``configured`` are the
    config file's services (they win); the floors of everything in force must fit ``budget``."""
    policies: dict[str, ScalingPolicy] = {}
    workloads: dict[str, Workload] = {}
    owner: dict[str, str] = {}
    verdicts: dict[str, Verdict] = {}
    for obj in sorted(objects, key=lambda o: (o.created, o.meta.key)):
        key = obj.meta.key
        spec, why = parse_spec(obj.spec)
        if spec is None:
            verdicts[key] = Verdict(False, "InvalidSpec", why)
            continue
        ref = spec.target_ref
        service = f"{obj.meta.namespace}/{ref.service}"
        if service in configured:
            verdicts[key] = Verdict(
                False,
                "OverriddenByConfig",
                f"the config file's services.{service}.scaling wins over this policy",
                service,
            )
            continue
        if service in owner:
            verdicts[key] = Verdict(
                False,
                "Conflict",
                f"ScalingPolicy {owner[service]} (older) already targets Service {service}",
                service,
            )
            continue
        policy = spec.policy()
        if budget is not None:
            try:
                check_floors(budget, {**configured, **policies, service: policy})
            except KeyedValueError as e:
                verdicts[key] = Verdict(
                    False, "BudgetExceeded", f"budget.{e.key}: {e.message}", service
                )
                continue
        policies[service] = policy
        workloads[service] = Workload(ref.kind, obj.meta.namespace, ref.name or ref.service)
        owner[service] = key
        verdicts[key] = Verdict(
            True, "InForce", f"scales {ref.kind}/{ref.name or ref.service}", service
        )
    return PolicyObjects(policies, workloads, verdicts)
