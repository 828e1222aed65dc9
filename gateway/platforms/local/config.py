"""The ``replicas:`` config of one service on the local platform (owned here, composed by the gateway).

How Sluice starts a replica: the command (``{port}`` substituted, ``PORT`` in the
environment), which ports it may take, how readiness is probed and how long a replica
gets to stop.  Cross-field rules raise :class:`~scaler.policy.KeyedValueError` so the
error names the exact key.
"""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.platforms.local.cgroups import parse_bytes
from scaler.policy import KeyedValueError


def group_name(service: str) -> str:
    """The cgroup name of a service (a replica's is ``<group_name>-<n>``): one path element.
    Two services whose names differ only by '/' and '_' would share it: the config refuses
    them (``gateway.settings``)."""
    return service.replace("/", "_")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReadinessConfig(_Model):
    """An HTTP GET probe on the replica's port: any 2xx or 3xx answer means ready."""

    path: str = Field(default="/healthz", description="Path probed with GET on 127.0.0.1:<port>.")
    timeout_s: float = Field(default=1.0, gt=0, le=60, description="One probe's deadline.")
    period_s: float = Field(
        default=1.0, gt=0, le=300, description="Time between probes once the replica is ready."
    )
    startup_period_s: float = Field(
        default=0.05,
        gt=0,
        le=60,
        description="Time between probes while the replica is starting (short, so it is routable soon).",
    )
    startup_timeout_s: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="A replica not ready this long after starting is stopped and started again.",
    )
    failure_threshold: int = Field(
        default=3,
        ge=1,
        le=100,
        description="Consecutive failed probes after which a ready replica stops getting new requests.",
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if not self.path.startswith("/"):
            raise KeyedValueError("path", f"must start with '/', got {self.path!r}")
        return self


class ReplicasConfig(_Model):
    """How the local platform runs one service's replicas as child processes."""

    command: list[str] = Field(
        description="Program and arguments; '{port}' in any argument is replaced by the replica's port "
        "(also given as the PORT environment variable), '{python}' by the interpreter running Sluice.",
    )
    port_range: tuple[int, int] = Field(
        description="[start, end], inclusive: the loopback ports this service's replicas may listen on.",
    )
    readiness: ReadinessConfig = Field(
        default_factory=ReadinessConfig, description="How a replica is found ready for requests."
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment variables for every replica."
    )
    user: str | int | None = Field(
        default=None,
        description="User (name or uid) the replicas run as when Sluice runs as root. Unset: "
        "'nobody' if it can run the command, otherwise root with a warning. Ignored (with a "
        "warning) when Sluice does not run as root.",
    )
    group: str | int | None = Field(
        default=None,
        description="Group (name or gid) the replicas run as; unset: the user's primary group "
        "('nogroup' for the default user).",
    )
    workdir: str | None = Field(
        default=None,
        description="Working directory of the replicas (must exist). Unset: a directory of the "
        "service's own that Sluice creates, owned by the replica user "
        "(/var/lib/sluice/replicas/<service> as root, ~/.local/state/sluice/replicas/<service> "
        "otherwise).",
    )
    memory_max: str | int | None = Field(
        default=None,
        description="Hard memory limit per replica (bytes, or with a unit: 256Mi, 1G): the "
        "kernel OOM-kills a replica past it and Sluice restarts it. Unset: unlimited.",
    )
    memory_high: str | int | None = Field(
        default=None,
        description="Memory above which a replica is throttled and reclaimed (cgroup v2 "
        "memory.high; v1 soft limit). Must be <= memory_max. Unset: none.",
    )
    grace_s: float = Field(
        default=10.0,
        ge=0,
        le=3600,
        description="After SIGTERM, how long a replica may take to exit before SIGKILL.",
    )
    drain_timeout_s: float = Field(
        default=60.0,
        ge=0,
        le=3600,
        description="On scale-down, the longest wait for in-flight requests to finish before SIGTERM.",
    )
    restart_backoff_s: float = Field(
        default=0.5, gt=0, le=60, description="First delay before restarting a crashed replica."
    )
    restart_backoff_max_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Longest delay between restarts (the delay doubles after each crash).",
    )

    @field_validator("command")
    @classmethod
    def _check_command(cls, command: list[str]) -> list[str]:
        if not command or not command[0].strip():
            raise ValueError("must name a program to run, got an empty command")
        return command

    @field_validator("memory_max", "memory_high")
    @classmethod
    def _check_bytes(cls, value: str | int | None) -> str | int | None:
        if value is not None:
            parse_bytes(value)
        return value

    @field_validator("user", "group")
    @classmethod
    def _check_id(cls, value: str | int | None) -> str | int | None:
        if isinstance(value, int) and value < 0:
            raise ValueError(f"must be a name or an id >= 0, got {value}")
        if isinstance(value, str) and (not value.strip() or ":" in value):
            raise ValueError(f"must be a user or group name or id, got {value!r}")
        return value

    @field_validator("port_range")
    @classmethod
    def _check_port_range(cls, port_range: tuple[int, int]) -> tuple[int, int]:
        start, end = port_range
        if not 1 <= start <= 65535:
            raise ValueError(f"start must be in 1..65535, got {start}")
        if not 1 <= end <= 65535:
            raise ValueError(f"end must be in 1..65535, got {end}")
        if end < start:
            raise ValueError(f"end must be >= start ({start}), got {end}")
        return port_range

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.restart_backoff_max_s < self.restart_backoff_s:
            raise KeyedValueError(
                "restart_backoff_max_s",
                f"must be >= restart_backoff_s ({self.restart_backoff_s:g}), got {self.restart_backoff_max_s:g}",
            )
        high, top = self.memory_high_bytes, self.memory_max_bytes
        if high is not None and top is not None and high > top:
            raise KeyedValueError(
                "memory_high", f"must be <= memory_max ({self.memory_max}), got {self.memory_high}"
            )
        if self.workdir is not None and not self.workdir.startswith("/"):
            raise KeyedValueError("workdir", f"must be an absolute path, got {self.workdir!r}")
        for key in self.env:
            if not key or "=" in key or "\0" in key:
                raise KeyedValueError(f"env.{key}", "is not a valid environment variable name")
        return self

    @property
    def memory_max_bytes(self) -> int | None:
        return None if self.memory_max is None else parse_bytes(self.memory_max)

    @property
    def memory_high_bytes(self) -> int | None:
        return None if self.memory_high is None else parse_bytes(self.memory_high)

    @property
    def port_count(self) -> int:
        return self.port_range[1] - self.port_range[0] + 1

    def overlaps(self, other: ReplicasConfig) -> bool:
        return not (
            self.port_range[1] < other.port_range[0] or other.port_range[1] < self.port_range[0]
        )
