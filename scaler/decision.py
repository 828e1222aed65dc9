"""The scaler's output and what it is told of the world: ``Decision`` and ``ServiceState``.

A decision's ``explanation`` (``scaler.explanation``: rule, inputs, steps, clamps, flows) is
built the first time someone reads it, from the tick that made it, so a tick over thousands
of services does not pay for explanations nobody reads; ``reasons`` is its text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, overload

from scaler.explanation import Explanation, Step, render


@dataclass(frozen=True, slots=True)
class ServiceState:
    """What the platform reports about one service right now."""

    service: str
    replicas: int
    """Replicas asked for (desired)."""
    ready_replicas: int
    cpu_per_replica_cores: float
    """CPU currently in force per replica: the hard limit with ``budget.enforcement: limit``,
    the guaranteed share (cgroup weight; Kubernetes requests) with ``share``."""
    resize_blocked: bool = False
    """True when an in-place CPU change cannot be applied now (e.g. PodResizePending Infeasible)."""
    cpu_limits_applied: bool = True
    """False when the platform cannot enforce CPU limits at all (e.g. no writable cgroup): CPU per
    replica is then what was decided, not what is enforced."""
    cpu_cap_per_replica_cores: float | None = None
    """The hard cap per replica in force (cgroup quota; Kubernetes limits), when the platform
    reports it: equal to ``cpu_per_replica_cores`` with ``limit`` enforcement, the service's
    ``cpu.max`` (at most the budget) with ``share``.  None = not reported, or unlimited."""
    cpu_capped: bool = False
    """True when the platform holds this service's replicas at their decided CPU although
    ``budget.enforcement`` is ``share`` (Kubernetes pods of Guaranteed QoS: their CPU request
    must stay equal to their limit): they cannot use idle CPU, so the engine decides for this
    service as under ``limit``."""


class ExplanationSource(Protocol):
    """Builds the explanation of decision number ``index`` when first asked (the engine's
    view of one tick)."""

    def explanation(self, index: int) -> Explanation: ...


class _LazyExplanation:
    """Data descriptor behind ``Decision.explanation``: built from the decision's source the
    first time it is read (or from the ``reasons``/``inputs`` a decision was made with)."""

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> None: ...
    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> Explanation: ...
    def __get__(self, obj: object | None, objtype: type | None = None) -> Explanation | None:
        if obj is None:
            return None  # the dataclass default: built from reasons and inputs
        state = obj.__dict__
        value = state.get("_explanation")
        if value is None:
            source = state.get("_source")
            if source is not None:
                value = source.explanation(state["_index"])
            else:
                value = Explanation(
                    state["rule"],
                    dict(state.get("_inputs") or {}),
                    tuple(Step("text", {"text": line}) for line in state.get("_reasons", ())),
                )
            state["_explanation"] = value
        return value

    def __set__(self, obj: object, value: Explanation | None) -> None:
        if value is not None:
            obj.__dict__["_explanation"] = value


class _LazyReasons:
    """Data descriptor behind ``Decision.reasons``: the explanation rendered (once)."""

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> tuple[str, ...]: ...
    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> tuple[str, ...]: ...
    def __get__(self, obj: object | None, objtype: type | None = None) -> tuple[str, ...]:
        if obj is None:
            return ()
        state = obj.__dict__
        value = state.get("_reasons")
        if value is None:
            value = render(obj.explanation)  # type: ignore[attr-defined]
            state["_reasons"] = value
        return value

    def __set__(self, obj: object, value: tuple[str, ...] | list[str]) -> None:
        if value:
            obj.__dict__["_reasons"] = tuple(value)


class _LazyInputs:
    """Data descriptor behind ``Decision.inputs``: the explanation's inputs."""

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> None: ...
    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> dict[str, float]: ...
    def __get__(self, obj: object | None, objtype: type | None = None) -> dict[str, float] | None:
        if obj is None:
            return None  # the dataclass default: no inputs
        state = obj.__dict__
        value = state.get("_inputs")
        if value is None:
            value = dict(obj.explanation.inputs)  # type: ignore[attr-defined]
            state["_inputs"] = value
        return value

    def __set__(self, obj: object, value: dict[str, float] | None) -> None:
        if value:
            obj.__dict__["_inputs"] = dict(value)


_new = object.__new__
_set = object.__setattr__


@dataclass(frozen=True)
class Decision:
    """One service's decision for one tick, with the reasons a person needs to trust it."""

    service: str
    at: float
    replicas: int
    cpu_per_replica_cores: float
    allocated_cores: float
    """replicas × cpu_per_replica_cores: this service's share of the budget."""
    rule: str
    """The rule that fired: 'stable', 'panic', 'scale-to-zero', 'idle-grace', 'hpa',
    'frozen: stale signals', 'frozen: missing signals', ..."""
    reasons: _LazyReasons = _LazyReasons()
    """Human-readable lines, rendered from ``explanation`` (``scaler.explanation.render``);
    a decision made by hand may pass its own lines."""
    inputs: _LazyInputs = _LazyInputs()
    """The figures the decision was made from (``explanation.inputs``)."""
    frozen: bool = False
    """True when the service's signals were stale or missing: nothing changed."""
    wake_concurrency: float = math.inf
    """Wake the scaler before the next tick when the service's concurrency (in flight +
    queued) reaches this: the load this decision cannot absorb (inf: never)."""
    explanation: _LazyExplanation = _LazyExplanation()
    """Why, as data: rule, inputs, steps, clamps (value, bound, bound's name) and flows
    (lent / borrowed / reclaimed / given back, with whom).  Built on first read."""

    @classmethod
    def explained(  # noqa: PLR0917 - positional on purpose: called once per service per tick
        cls,
        service: str,
        at: float,
        replicas: int,
        cpu_per_replica_cores: float,
        allocated_cores: float,
        rule: str,
        frozen: bool,
        source: ExplanationSource,
        index: int,
        wake_concurrency: float = math.inf,
    ) -> Decision:
        """Build a decision whose explanation ``source`` builds on first use (the
        engine's fast path: one dict, no per-field frozen-dataclass ``__setattr__``)."""
        decision: Decision = _new(cls)
        _set(
            decision,
            "__dict__",
            {
                "service": service,
                "at": at,
                "replicas": replicas,
                "cpu_per_replica_cores": cpu_per_replica_cores,
                "allocated_cores": allocated_cores,
                "rule": rule,
                "frozen": frozen,
                "wake_concurrency": wake_concurrency,
                "_source": source,
                "_index": index,
            },
        )
        return decision

    def __getstate__(self) -> dict[str, Any]:
        """Pickle/deepcopy the explanation, not the tick it came from."""
        state = dict(self.__dict__)
        state["_explanation"] = self.explanation
        state.pop("_source", None)
        state.pop("_index", None)
        return state

    def summary(self) -> str:
        return (
            f"{self.service}: {self.replicas}×{self.cpu_per_replica_cores:.2f} cores ({self.rule})"
        )
