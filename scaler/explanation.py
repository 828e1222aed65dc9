"""A decision's explanation as data, and the one place it becomes text (pure).

An :class:`Explanation` is the rule that fired, the figures it used (``inputs``) and, in
order, its parts: :class:`Step` (what a rule computed), :class:`Clamp` (a value held to a
named bound) and :class:`Flow` (CPU lent, borrowed, held by floors and kept replicas,
reclaimed, given back or taken for floors, with the peers).  Readers (telemetry, metrics,
``/api/decisions``) read the fields; :func:`render` turns them into the reason lines a
person reads, from :data:`TEMPLATES`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Value = float | int | str

FlowKind = Literal[
    "lent", "borrowed", "held", "held_from", "reclaimed", "gave_back", "taken_for_floors"
]
FLOW_KINDS: tuple[FlowKind, ...] = (
    "lent",
    "borrowed",
    "held",
    "held_from",
    "reclaimed",
    "gave_back",
    "taken_for_floors",
)


@dataclass(frozen=True, slots=True)
class Step:
    """One thing a rule computed: ``kind`` names it (a key of :data:`TEMPLATES`)."""

    kind: str
    values: Mapping[str, Value] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Clamp:
    """``quantity`` would have been ``value`` but was held to ``bound`` by ``name``."""

    quantity: Literal["replicas", "cores"]
    value: float
    bound: float
    name: str
    """The bound: ``max_replicas``, ``min_replicas``, ``max_scale_up_rate``, ``budget``,
    ``hysteresis``, ``cpu.min``, ``behavior.scale_up``, ``stabilization`` ..."""


@dataclass(frozen=True, slots=True)
class Flow:
    """CPU moved between this service and ``peers`` (the largest first)."""

    kind: FlowKind
    cores: float
    peers: tuple[str, ...] = ()


Part = Step | Clamp | Flow


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why a decision is what it is: rule, inputs, and its steps, clamps and flows in order."""

    rule: str
    inputs: Mapping[str, float] = field(default_factory=dict)
    parts: tuple[Part, ...] = ()

    @property
    def steps(self) -> tuple[Step, ...]:
        return tuple(p for p in self.parts if isinstance(p, Step))

    @property
    def clamps(self) -> tuple[Clamp, ...]:
        return tuple(p for p in self.parts if isinstance(p, Clamp))

    @property
    def flows(self) -> tuple[Flow, ...]:
        return tuple(p for p in self.parts if isinstance(p, Flow))

    def flow_cores(self, kind: FlowKind) -> float:
        """Cores moved by flows of ``kind`` (0 when none)."""
        return sum(f.cores for f in self.flows if f.kind == kind)

    def as_json(self) -> dict[str, object]:
        """Plain JSON (non-finite numbers become ``None``)."""
        return {
            "rule": self.rule,
            "inputs": {k: finite_or_none(v) for k, v in self.inputs.items()},
            "steps": [
                {"kind": s.kind, **{k: finite_or_none(v) for k, v in s.values.items()}}
                for s in self.steps
            ],
            "clamps": [
                {
                    "quantity": c.quantity,
                    "value": finite_or_none(c.value),
                    "bound": finite_or_none(c.bound),
                    "name": c.name,
                }
                for c in self.clamps
            ],
            "flows": [
                {"kind": f.kind, "cores": finite_or_none(f.cores), "peers": list(f.peers)}
                for f in self.flows
            ],
        }


def finite_or_none(value: Value) -> Value | None:
    """``value``, or ``None`` when it is a float that is not finite (JSON has no NaN/inf)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class Trace:
    """Collects an explanation's parts while rules run (one per service and tick)."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[Part] = []

    def __repr__(self) -> str:
        return f"Trace({len(self.parts)} parts)"

    def __len__(self) -> int:
        return len(self.parts)

    def step(self, kind: str, **values: Value) -> None:
        self.parts.append(Step(kind, values))

    def clamp(
        self, quantity: Literal["replicas", "cores"], value: float, bound: float, name: str
    ) -> None:
        self.parts.append(Clamp(quantity, value, bound, name))

    def flow(self, kind: FlowKind, cores: float, peers: tuple[str, ...] = ()) -> None:
        self.parts.append(Flow(kind, cores, peers))

    def render(self) -> tuple[str, ...]:
        return tuple(render_part(p) for p in self.parts)


TEMPLATES: dict[str, str] = {
    "text": "{text}",
    "no_data": "no metric data in the windows: holding",
    "kpa.windows": (
        "{metric} stable {stable:.2f} over {stable_window_s:g}s, panic {panic:.2f} over "
        "{panic_window_s:g}s; target {target:g}×{target_utilization:g}={target_value:g} per "
        "replica; capacity {capacity:.2f} replicas"
    ),
    "kpa.panic_entered": (
        "panic: {want_panic} wanted over the panic window >= {threshold:g}× capacity {capacity:g}"
    ),
    "kpa.panic_over": "panic over: {stable_window_s:g}s since the last tick over the threshold",
    "kpa.panic_hold": "panic: not scaling down from {replicas}",
    "kpa.panic": "panic: ceil({panic:.2f}/{target_value:g}) = {want}",
    "kpa.surge": (
        "panic at once: this tick's {metric} wants {want} replicas, >= {threshold:g}× capacity "
        "{capacity:g}, {woke_s:.1f}s into a burst after {panic_window_s:g}s without load"
    ),
    "kpa.stable": "stable: ceil({stable:.2f}/{target_value:g}) = {want}",
    "kpa.stable_gated": (
        "adds none of the {want} the stable window wants: the last {panic_window_s:g}s need "
        "only {panic_want} (a replica is added only when the panic window wants it too)"
    ),
    "kpa.to_zero": (
        "scale to zero: idle {idle_s:.0f}s >= stable window {stable_window_s:g}s + grace "
        "{grace_s:g}s"
    ),
    "kpa.idle_grace": (
        "idle, holding 1 replica until idle for {zero_after_s:g}s "
        "(stable window + scale_to_zero_grace_s)"
    ),
    "kpa.instant": (
        "CPU follows this tick's {metric}: {want} replicas' worth (more than the windows' "
        "{windows})"
    ),
    "hpa.inputs": (
        "hpa: {metric} {average:.2f} over {window_s:g}s, target {target:g} per replica, "
        "{replicas} replicas ({ready} ready)"
    ),
    "hpa.no_metric": "no metric data",
    "hpa.from_zero": "hpa: from zero: ceil({total:g}/{target:g})",
    "hpa.tolerance": (
        "hpa: ratio {ratio:.3f} within tolerance (-{tolerance_down:g}, +{tolerance_up:g})"
    ),
    "hpa.utilization": (
        "hpa: cpu utilisation {utilization}% of request, target {target:g}%: ceil({ratio:.3f} × "
        "{pods} pods)"
    ),
    "hpa.ratio": "hpa: ceil({ratio:.3f} × {pods} pods)",
    "hpa.filled_keep": (
        "hpa: ratio {ratio:.3f} -> {new_ratio:.3f} with {missing} missing / {unready} unready "
        "pods filled in: within tolerance or direction flips, keeping current"
    ),
    "hpa.flip_keep": "hpa: pod count change would flip the direction, keeping current",
    "hpa.filled": (
        "hpa: ceil({new_ratio:.3f} × {pods} pods) with {missing} missing / {unready} unready "
        "filled in"
    ),
    "hpa.no_ready_pods": "hpa: did not receive metrics for any ready pods, holding",
    "metrics.answer": "metric {name} ({type}) = {value}: {replicas} replicas ({note})",
    "metrics.won": "metrics: {name} wins with {replicas} replicas (the largest answer)",
    "metrics.held": (
        "metrics: holding {replicas} replicas: {missing} has no data (a metric without data "
        "never scales down)"
    ),
    "signals_refused": "signals refused (not finite or negative): {fields}",
    "frozen": ("{reason}: keeping {replicas}×{cpu:.2f} cores, never scaling down on missing data"),
    "independent.pending": (
        "pending: {replicas} more replicas of {cpu_ref:g} cores do not fit the budget "
        "(first come first served, nothing reclaimed)"
    ),
    "independent": (
        "independent: wants {wanted} replicas of {cpu_ref:g} cores -> {replicas}×{cpu:.2f} = "
        "{cores:.2f} cores"
    ),
    "split.in_place": (
        "squeezed in place: keeps its {replicas} replicas at {cpu:.3f} cores each, below "
        "cpu.min {cpu_min:g}: under share the decided CPU is a weight, the kernel takes the "
        "CPU back by weight and no replica is removed to restart later"
    ),
    "enforcement.capped": (
        "decided as under limit: the platform holds its replicas at their decided CPU (pods "
        "of Guaranteed QoS: requests = limits), so they cannot use idle CPU"
    ),
    "split.resize_blocked": "resize blocked: CPU stays {cpu:.2f}, scaling replicas instead",
    "split.resize_blocked_cut": (
        "resize blocked, but {replicas} replicas need CPU cut to {cpu:.2f} to fit"
    ),
    "split.starting": (
        "keeps {replicas} replicas while some are starting: a replica is not removed before "
        "it is ready"
    ),
    "split.delay": (
        "keeps {replicas} replicas, the most it wanted in the last {delay_s:g} s "
        "(scale_down_delay_s): idle, each holds only what it is given, down to cpu.min"
    ),
    "split.cpu_floor": (
        "keeps {replicas} replicas: the {used:.2f} cores it used over the panic window need "
        "them at the target utilisation ({utilization:g}); fewer would bring the concurrency "
        "back"
    ),
    "split.held_back": (
        "starts only {replicas} of {wanted} replicas: the cores it gets fill no more at full size"
    ),
    "split.one_more": (
        "runs {replicas} replicas (it wants {wanted}), one more than its cores fill at full "
        "size: under share the one more adds no weight, it only uses CPU the others leave idle"
    ),
    "split.into_idle": (
        "starts replicas into idle CPU ({replicas} of the {wanted} it wants): its ready "
        "replicas have been full for {full_s:.1f} s (it used {used:.2f} cores), with work in "
        "the system they take {drain_s:.1f} s to drain at the rate they complete it (panic "
        "window {window_s:g} s); a starting replica holds a weight, not CPU (share)"
    ),
    "soft_hold": (
        "its replicas could use {held:.2f} cores; the {spare:.2f} beyond what the load needs "
        "now is served only from spare CPU"
    ),
    "budget": (
        "budget: demand {demand:.2f} cores (floor {floor:.2f}, fair share {fair:.2f} of "
        "{total:g} from {source}) -> {replicas}×{cpu:.2f} = {cores:.2f} cores"
    ),
}

_CLAMPS: dict[str, str] = {
    "max_replicas": "clamped replicas {value:g} -> {bound:g} by max_replicas",
    "min_replicas": "clamped replicas {value:g} -> {bound:g} by min_replicas",
    "max_scale_up_rate": "rate-limited {value:g} -> {bound:g} by max_scale_up_rate",
    "max_scale_down_rate": "rate-limited {value:g} -> {bound:g} by max_scale_down_rate",
    "behavior.scale_up": "hpa: rate-limited {value:g} -> {bound:g} by behavior.scale_up policies",
    "behavior.scale_down": (
        "hpa: rate-limited {value:g} -> {bound:g} by behavior.scale_down policies"
    ),
    "stabilization": "hpa: stabilized {value:g} -> {bound:g} (stabilization windows)",
    "hysteresis": "hysteresis: keeping {bound:.2f} cores (ideal {value:.2f} is within the band)",
    "budget": "wants {value:.2f} cores, budget gives {bound:.2f}",
    "cpu.min": "only {bound:g} replicas fit at cpu.min (of {value:g})",
}

_FLOWS: dict[str, str] = {
    "lent": "lends {cores:.2f} cores of its fair share to: {peers}",
    "borrowed": "borrows {cores:.2f} cores beyond its fair share from: {peers}",
    "held": (
        "holds {cores:.2f} cores beyond its fair share (its floor, or cpu.min for each "
        "replica it keeps serving) while short of theirs: {peers}"
    ),
    "held_from": (
        "gets {cores:.2f} cores of its fair share less than it wants: held by {peers} "
        "(floors, or cpu.min for each replica kept serving)"
    ),
    "reclaimed": "reclaimed {cores:.2f} cores from: {peers}",
    "gave_back": "gave back {cores:.2f} borrowed cores to: {peers}",
    "taken_for_floors": "frozen, but {cores:.2f} cores taken back for others' floors",
}


def _peers(peers: tuple[str, ...]) -> str:
    return ", ".join(peers) if peers else "others"


def render_part(part: Part) -> str:
    """One reason line for one part."""
    if isinstance(part, Step):
        return TEMPLATES[part.kind].format(**part.values)
    if isinstance(part, Clamp):
        template = _CLAMPS.get(part.name, "clamped {quantity} {value:g} -> {bound:g} by {name}")
        return template.format(
            quantity=part.quantity, value=part.value, bound=part.bound, name=part.name
        )
    return _FLOWS[part.kind].format(cores=part.cores, peers=_peers(part.peers))


def render(explanation: Explanation) -> tuple[str, ...]:
    """The reason lines of ``explanation``, in order: the only place they become text."""
    return tuple(render_part(p) for p in explanation.parts)
