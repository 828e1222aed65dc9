"""The workload a simulation replays: per service, arrival rate and CPU-seconds per request over time.

Two file formats, one model (:class:`Workload`):

* **YAML** — per service, piecewise-constant ``load`` steps (optionally repeating every
  ``repeat_s``) plus periodic ``bursts`` added on top, the latency SLO and the replica
  start-up delay::

      duration_s: 3600
      seed: 1
      services:
        api:
          slo_s: 1.0
          load: [{at_s: 0, rps: 16, cpu_s: 0.1}]
        reports:
          slo_s: 0.5
          load: [{at_s: 0, rps: 0, cpu_s: 0.05}]
          bursts: [{every_s: 60, for_s: 10, start_s: 30, rps: 20, cpu_s: 0.05}]
          app:                      # app metrics the service reports (scaling.metrics)
            active_users: [{at_s: 0, value: 500}, {at_s: 120, value: 15000}]

* **CSV** — piecewise constant only, one row per step: ``service,at_s,rps,cpu_s,slo_s``
  (optional columns ``startup_s``, ``cpu_cv``, ``request_cores_max``, each constant per service).

Problems are reported one per line as ``file: key.path: problem`` (:class:`WorkloadError`).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from scaler.policy import KeyedValueError
from scaler.validation import format_error

_SERVICE_NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?(/[a-z0-9]([a-z0-9._-]*[a-z0-9])?)?$")


class WorkloadError(Exception):
    """A workload could not be loaded; ``problems`` holds one ``file: key.path: problem`` line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LoadStep(_Model):
    """From ``at_s`` until the next step: Poisson arrivals at ``rps``, each needing ``cpu_s``."""

    at_s: float = Field(ge=0, description="When this step starts (seconds from the start).")
    rps: float = Field(ge=0, description="Mean arrival rate (requests per second, Poisson).")
    cpu_s: float = Field(gt=0, description="Mean CPU-seconds one request needs.")


class Burst(_Model):
    """Extra arrivals for ``for_s`` seconds every ``every_s`` seconds, from ``start_s`` on."""

    every_s: float = Field(gt=0, description="Period of the bursts (seconds).")
    for_s: float = Field(gt=0, description="Length of each burst (seconds); <= every_s.")
    start_s: float = Field(default=0.0, ge=0, description="Start of the first burst (seconds).")
    rps: float = Field(gt=0, description="Arrival rate during a burst, added to the load steps.")
    cpu_s: float = Field(gt=0, description="Mean CPU-seconds one burst request needs.")

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.for_s > self.every_s:
            raise KeyedValueError(
                "for_s", f"must be <= every_s ({self.every_s:g}), got {self.for_s:g}"
            )
        return self


class AppValue(_Model):
    """From ``at_s`` until the next entry, the service reports ``value`` for an app metric."""

    at_s: float = Field(ge=0, description="When this value starts (seconds from the start).")
    value: float = Field(ge=0, description="The value the service reports (e.g. active users).")


class ServiceLoad(_Model):
    """One service's offered load, latency objective and replica behaviour."""

    slo_s: float = Field(gt=0, description="Latency objective (seconds) for one request.")
    load: list[LoadStep] = Field(
        min_length=1,
        description="Piecewise-constant steps; the first at at_s 0, strictly increasing.",
    )
    repeat_s: float | None = Field(
        default=None, gt=0, description="Repeat the load steps with this period (seconds)."
    )
    bursts: list[Burst] = Field(default_factory=list, description="Periodic bursts on top of load.")
    startup_s: float = Field(
        default=5.0, ge=0, description="A new replica serves this long after it is scheduled."
    )
    cpu_cv: float = Field(
        default=0.0,
        ge=0,
        le=4,
        description="Coefficient of variation of CPU-seconds per request (0: all equal; gamma-distributed).",
    )
    request_cores_max: float = Field(
        default=1.0,
        gt=0,
        description="Most cores one request can use at once (1 = single-threaded).",
    )
    app: dict[str, list[AppValue]] = Field(
        default_factory=dict,
        description=(
            "App metrics (scaling.metrics type: app) the service reports, by name: "
            "piecewise-constant values over time, the first at at_s 0."
        ),
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        for name, values in self.app.items():
            if not values or values[0].at_s != 0:
                raise KeyedValueError(f"app.{name}", "needs values, the first at at_s 0")
            for i in range(1, len(values)):
                if values[i].at_s <= values[i - 1].at_s:
                    raise KeyedValueError(
                        f"app.{name}.{i}.at_s",
                        f"must be > the previous value's at_s ({values[i - 1].at_s:g}), "
                        f"got {values[i].at_s:g}",
                    )
        if self.load[0].at_s != 0:
            raise KeyedValueError(
                "load[0].at_s", f"the first step must start at 0, got {self.load[0].at_s:g}"
            )
        for i in range(1, len(self.load)):
            if self.load[i].at_s <= self.load[i - 1].at_s:
                raise KeyedValueError(
                    f"load[{i}].at_s",
                    f"must be > the previous step's at_s ({self.load[i - 1].at_s:g}), got {self.load[i].at_s:g}",
                )
        if self.repeat_s is not None and self.repeat_s <= self.load[-1].at_s:
            raise KeyedValueError(
                "repeat_s",
                f"must be > the last step's at_s ({self.load[-1].at_s:g}), got {self.repeat_s:g}",
            )
        return self

    def pieces(self, duration_s: float) -> list[Piece]:
        """Every constant-rate piece of arrivals in ``[0, duration_s)`` (bursts overlap the steps)."""
        out: list[Piece] = []
        period = self.repeat_s
        base = 0.0
        while base < duration_s:
            for i, step in enumerate(self.load):
                start = base + step.at_s
                if i + 1 < len(self.load):
                    end = base + self.load[i + 1].at_s
                else:
                    end = base + period if period is not None else duration_s
                end = min(end, duration_s)
                if end > start and step.rps > 0:
                    out.append(Piece(start, end, step.rps, step.cpu_s))
            if period is None:
                break
            base += period
        for burst in self.bursts:
            start = burst.start_s
            while start < duration_s:
                end = min(start + burst.for_s, duration_s)
                out.append(Piece(start, end, burst.rps, burst.cpu_s))
                start += burst.every_s
        return out


@dataclass(frozen=True, slots=True)
class Piece:
    """Poisson arrivals at ``rps`` during ``[start_s, end_s)``, each needing ``cpu_s`` on average."""

    start_s: float
    end_s: float
    rps: float
    cpu_s: float


class Workload(_Model):
    """A whole workload file."""

    duration_s: float = Field(default=600.0, gt=0, description="Default simulated time (seconds).")
    seed: int = Field(default=0, ge=0, description="Default seed of the random arrivals.")
    services: dict[str, ServiceLoad] = Field(min_length=1, description="Load per service, by name.")

    @model_validator(mode="after")
    def _check(self) -> Self:
        for name in self.services:
            if not _SERVICE_NAME.match(name):
                raise KeyedValueError(
                    f"services.{name}",
                    "a service name must be lowercase letters, digits, '.', '_' or '-'",
                )
        return self


def parse_workload(data: Any, source: str = "<workload>") -> Workload:
    """Validate parsed YAML data; raise :class:`WorkloadError` with one line per problem."""
    if not isinstance(data, dict):
        kind = "nothing" if data is None else type(data).__name__
        raise WorkloadError([f"{source}: the top level must be a mapping, got {kind}"])
    try:
        return Workload.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors(include_url=False):
            path, problem = format_error(dict(err))
            problems.append(f"{source}: {path}: {problem}" if path else f"{source}: {problem}")
        raise WorkloadError(problems) from None


_CSV_REQUIRED = ("service", "at_s", "rps", "cpu_s", "slo_s")
_CSV_PER_SERVICE = ("slo_s", "startup_s", "cpu_cv", "request_cores_max")


def _csv_to_data(text: str, source: str) -> dict[str, Any]:
    reader = csv.DictReader(text.splitlines())
    columns = [c.strip() for c in reader.fieldnames or []]
    missing = [c for c in _CSV_REQUIRED if c not in columns]
    if missing:
        raise WorkloadError(
            [
                f"{source}: line 1: missing column(s) {', '.join(missing)} (have: {', '.join(columns) or 'none'})"
            ]
        )
    unknown = [c for c in columns if c not in (*_CSV_REQUIRED, *_CSV_PER_SERVICE)]
    if unknown:
        raise WorkloadError([f"{source}: line 1: unknown column(s) {', '.join(unknown)}"])
    services: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for line_no, raw in enumerate(reader, start=2):
        row = {(k or "").strip(): (v or "").strip() for k, v in raw.items()}
        name = row["service"]
        if not name:
            problems.append(f"{source}: line {line_no}: service: is required")
            continue
        values: dict[str, float] = {}
        for column in columns:
            if column == "service" or row.get(column, "") == "":
                continue
            try:
                values[column] = float(row[column])
            except ValueError:
                problems.append(
                    f"{source}: line {line_no}: {column}: must be a number, got {row[column]!r}"
                )
        service = services.setdefault(name, {"load": []})
        for column in _CSV_PER_SERVICE:
            if column not in values:
                continue
            if column in service and service[column] != values[column]:
                problems.append(
                    f"{source}: line {line_no}: {column}: must be the same on every row of service {name!r} "
                    f"({service[column]:g}), got {values[column]:g}"
                )
            service[column] = values[column]
        service["load"].append({k: values[k] for k in ("at_s", "rps", "cpu_s") if k in values})
    if problems:
        raise WorkloadError(problems)
    if not services:
        raise WorkloadError([f"{source}: no rows"])
    return {"services": services}


def load_workload(path: str | Path) -> Workload:
    """Read a ``.yaml``/``.yml`` or ``.csv`` workload; raise :class:`WorkloadError` naming the file."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise WorkloadError([f"{source}: cannot read: {e.strerror or e}"]) from None
    if source.lower().endswith(".csv"):
        return parse_workload(_csv_to_data(text, source), source)
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise WorkloadError([f"{where}: invalid YAML: {e.problem or e.context}"]) from None
    except yaml.YAMLError as e:
        raise WorkloadError([f"{source}: invalid YAML: {e}"]) from None
    return parse_workload(data, source)
