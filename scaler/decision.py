"""The scaler's output and what it is told of the world: ``Decision`` and ``ServiceState``.

A decision's ``reasons`` may be handed over as an :class:`Explanation` (format strings and
their arguments): the text is rendered the first time someone reads ``decision.reasons``
and cached, so a tick over thousands of services does not pay for prose nobody reads.
Reading ``reasons`` always gives a ``tuple[str, ...]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import overload


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


class _LazyReasons:
    """Data descriptor behind ``Decision.reasons``: stores a tuple or an Explanation,
    always reads as a tuple of strings."""

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
        if isinstance(value, Explanation):
            value = value.render()
            obj.__dict__[self._key] = value
        return tuple(value)

    def __set__(self, obj: object, value: tuple[str, ...] | Explanation) -> None:
        obj.__dict__[self._key] = value if isinstance(value, Explanation) else tuple(value)


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
    inputs: dict[str, float] = field(default_factory=dict)
    frozen: bool = False
    """True when the service's signals were stale or missing: nothing changed."""

    def summary(self) -> str:
        return (
            f"{self.service}: {self.replicas}×{self.cpu_per_replica_cores:.2f} cores ({self.rule})"
        )
