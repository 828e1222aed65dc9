"""The ``replicas:`` config of one service on the local platform (owned here, composed by the gateway).

How Sluice starts a replica: the command (``{port}`` substituted, ``PORT`` in the
environment), which ports it may take, how readiness is probed and how long a replica
gets to stop.  Cross-field rules raise :class:`~scaler.policy.KeyedValueError` so the
error names the exact key.
"""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from scaler.policy import KeyedValueError


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
        for key in self.env:
            if not key or "=" in key or "\0" in key:
                raise KeyedValueError(f"env.{key}", "is not a valid environment variable name")
        return self

    @property
    def port_count(self) -> int:
        return self.port_range[1] - self.port_range[0] + 1

    def overlaps(self, other: ReplicasConfig) -> bool:
        return not (
            self.port_range[1] < other.port_range[0] or other.port_range[1] < self.port_range[0]
        )
