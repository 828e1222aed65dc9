"""The scaler's output and what it is told of the world: ``Decision`` and ``ServiceState``.

A decision's ``reasons`` (and ``inputs``) may be handed over unrendered — an
:class:`Explanation` (format strings and their arguments) or any :class:`ReasonSource`: the
text is rendered the first time someone reads ``decision.reasons`` and cached, so a tick over
thousands of services does not pay for prose nobody reads.  Reading ``reasons`` always gives
a ``tuple[str, ...]``, reading ``inputs`` a ``dict[str, float]``.
"""

from __future__ import annotations

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
    """CPU limit currently in force per replica."""
    resize_blocked: bool = False
    """True when an in-place CPU change cannot be applied now (e.g. PodResizePending Infeasible)."""
    cpu_limits_applied: bool = True
    """False when the platform cannot enforce CPU limits at all (e.g. no writable cgroup): CPU per
    replica is then what was decided, not what is enforced."""


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
    """Something that can produce a decision's reasons and inputs when first asked."""

    def render(self) -> tuple[str, ...]: ...

    def inputs(self) -> dict[str, float]: ...


class _LazyReasons:
    """Data descriptor behind ``Decision.reasons``: stores a tuple, an Explanation or a
    ReasonSource; always reads as a tuple of strings."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._key = "_" + name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> tuple[str, ...]: ...
    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> tuple[str, ...]: ...
    def __get__(self, obj: object | None, objtype: type | None = None) -> tuple[str, ...]:
        if obj is None:
            return ()
        value = obj.__dict__.get(self._key, ())
        if not isinstance(value, tuple):
            value = value.render()
            obj.__dict__[self._key] = value
        return value  # type: ignore[no-any-return]

    def __set__(self, obj: object, value: tuple[str, ...] | Explanation | ReasonSource) -> None:
        obj.__dict__[self._key] = value if not isinstance(value, list) else tuple(value)


class _LazyInputs:
    """Data descriptor behind ``Decision.inputs``: a dict, or a ReasonSource asked once."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._key = "_" + name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> None: ...
    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> dict[str, float]: ...
    def __get__(self, obj: object | None, objtype: type | None = None) -> dict[str, float] | None:
        if obj is None:
            return None  # the dataclass default: no inputs
        value = obj.__dict__.get(self._key)
        if value is None:
            value = {}
            obj.__dict__[self._key] = value
        elif not isinstance(value, dict):
            value = value.inputs()
            obj.__dict__[self._key] = value
        return value

    def __set__(self, obj: object, value: dict[str, float] | ReasonSource | None) -> None:
        obj.__dict__[self._key] = value


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
    ) -> Decision:
        """Build a decision whose reasons and inputs come from ``source`` on first use
        (the engine's fast path: no per-field frozen-dataclass ``__setattr__``)."""
        decision: Any = object.__new__(cls)
        decision.__dict__.update(
            service=service,
            at=at,
            replicas=replicas,
            cpu_per_replica_cores=cpu_per_replica_cores,
            allocated_cores=allocated_cores,
            rule=rule,
            frozen=frozen,
            _reasons=source,
            _inputs=source,
        )
        return decision  # type: ignore[no-any-return]

    def summary(self) -> str:
        return (
            f"{self.service}: {self.replicas}×{self.cpu_per_replica_cores:.2f} cores ({self.rule})"
        )
