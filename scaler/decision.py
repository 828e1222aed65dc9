"""The scaler's output and what it is told of the world: ``Decision`` and ``ServiceState``.

A decision's ``reasons`` (and ``inputs``) may be handed over unrendered — an
:class:`Explanation` (format strings and their arguments) or any :class:`ReasonSource`: the
text is rendered the first time someone reads ``decision.reasons`` and cached, so a tick over
thousands of services does not pay for prose nobody reads.  Reading ``reasons`` always gives
a ``tuple[str, ...]``, reading ``inputs`` a ``dict[str, float]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, overload


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


class Explanation:
    """Reason lines kept as ``(printf-style format, args)``, rendered on demand."""

    __slots__ = ("_parts",)

    def __init__(self) -> None:
        self._parts: list[tuple[str, tuple[object, ...]]] = []

    def __repr__(self) -> str:
        return f"Explanation({len(self._parts)} lines)"

    def __len__(self) -> int:
        return len(self._parts)

    def add(self, fmt: str, *args: object) -> None:
        """Add one line: ``fmt % args`` (or ``fmt`` as is without args)."""
        self._parts.append((fmt, args))

    def render(self) -> tuple[str, ...]:
        return tuple(fmt % args if args else fmt for fmt, args in self._parts)


class ReasonSource(Protocol):
    """Produces the reasons and inputs of decision number ``index`` when first asked
    (the engine's view of one tick)."""

    def render(self, index: int) -> tuple[str, ...]: ...

    def inputs(self, index: int) -> dict[str, float]: ...


def _from_source(obj: object, key: str) -> Any:
    """Render ``key`` ('reasons' or 'inputs') from the decision's source, and cache it."""
    state = obj.__dict__
    source = state.get("_source")
    if source is None:
        value: Any = () if key == "_reasons" else {}
    elif key == "_reasons":
        value = source.render(state["_index"])
    else:
        value = source.inputs(state["_index"])
    state[key] = value
    return value


class _LazyReasons:
    """Data descriptor behind ``Decision.reasons``: stores a tuple or an Explanation (or
    nothing, with a source to ask); always reads as a tuple of strings."""

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> tuple[str, ...]: ...
    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> tuple[str, ...]: ...
    def __get__(self, obj: object | None, objtype: type | None = None) -> tuple[str, ...]:
        if obj is None:
            return ()
        value = obj.__dict__.get("_reasons")
        if value is None:
            value = _from_source(obj, "_reasons")
        elif isinstance(value, Explanation):
            value = value.render()
            obj.__dict__["_reasons"] = value
        return value

    def __set__(self, obj: object, value: tuple[str, ...] | list[str] | Explanation) -> None:
        obj.__dict__["_reasons"] = value if isinstance(value, Explanation) else tuple(value)


class _LazyInputs:
    """Data descriptor behind ``Decision.inputs``: a dict (or nothing, with a source)."""

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> None: ...
    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> dict[str, float]: ...
    def __get__(self, obj: object | None, objtype: type | None = None) -> dict[str, float] | None:
        if obj is None:
            return None  # the dataclass default: no inputs
        value = obj.__dict__.get("_inputs")
        if value is None:
            value = _from_source(obj, "_inputs")
        return value  # type: ignore[no-any-return]

    def __set__(self, obj: object, value: dict[str, float] | None) -> None:
        obj.__dict__["_inputs"] = {} if value is None else value


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
    """Human-readable lines: inputs, clamps (which bound), lent/reclaimed CPU to/from whom.
    Pass a tuple of strings or an :class:`Explanation`; reads as ``tuple[str, ...]``."""
    inputs: _LazyInputs = _LazyInputs()
    """The figures the decision was made from (a dict; pass a dict or a ReasonSource)."""
    frozen: bool = False
    """True when the service's signals were stale or missing: nothing changed."""
    wake_concurrency: float = math.inf
    """Wake the scaler before the next tick when the service's concurrency (in flight +
    queued) reaches this: the load this decision cannot absorb (inf: never)."""

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
        source: ReasonSource,
        index: int,
        wake_concurrency: float = math.inf,
    ) -> Decision:
        """Build a decision whose reasons and inputs ``source`` renders on first use (the
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
        """Pickle/deepcopy the rendered reasons and inputs, not the tick they came from."""
        state = dict(self.__dict__)
        state["_reasons"] = self.reasons
        state["_inputs"] = self.inputs
        state.pop("_source", None)
        state.pop("_index", None)
        return state

    def summary(self) -> str:
        return (
            f"{self.service}: {self.replicas}×{self.cpu_per_replica_cores:.2f} cores ({self.rule})"
        )
