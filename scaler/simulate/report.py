"""Figures from simulated runs: per-service summaries, budget use, comparison, JSON and tables."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from scaler.policy import Enforcement
from scaler.simulate.runner import CGROUP_FIGURES, RunResult, Scenario

NODE_MODELS: dict[Enforcement, str] = {
    "share": (
        "share enforcement: busy replicas share the node's CPU by weight, each up to its "
        "cpu.max (work-conserving); Sluice weighs each service by its entitlement (its fair "
        "share of the budget, its replicas equally), a baseline each replica by its decided "
        "CPU (pods' requests)"
    ),
    "limit": (
        "limit enforcement: a replica's decided CPU is a hard cap (CFS quota / limits); "
        "CPU a replica leaves unused is idle until the next decision"
    ),
}

LOWER_IS_BETTER = {
    "latency_p50_s",
    "latency_p99_s",
    "latency_max_s",
    "requests_over_slo",
    "time_over_slo_s",
    "unfinished",
    "rejected",
}


def _quantile(values: np.ndarray, q: float) -> float | None:
    if values.size == 0:
        return None
    return float(np.quantile(values, q, method="inverted_cdf"))


CDF_LEVELS = tuple(
    sorted({round(q, 4) for q in [*np.linspace(0.0, 0.9, 19), 0.95, 0.98, 0.99, 0.995, 0.999, 1.0]})
)
"""Levels at which ``latency_cdf_s`` holds each run's latency quantiles (the tail resolved)."""


def latency_cdf(values: np.ndarray) -> list[float] | None:
    """The latency at each of :data:`CDF_LEVELS` (None without requests)."""
    if values.size == 0:
        return None
    return [float(x) for x in np.quantile(values, CDF_LEVELS, method="inverted_cdf")]


def direction_changes(values: np.ndarray) -> int:
    """How often a series changes direction: a rise after a fall or a fall after a rise."""
    steps = np.diff(np.asarray(values, dtype=np.float64))
    signs = np.sign(steps[np.abs(steps) > 1e-9])
    return int(np.count_nonzero(signs[1:] != signs[:-1])) if signs.size > 1 else 0


def offered_direction_changes(offered_rps: np.ndarray) -> int:
    """How often the offered load changes direction, counted from the idle system a run
    starts from (no load before its first tick), as the replicas' direction changes are
    counted from the replicas it starts with: a load that starts high and then falls has
    risen once and fallen once, as replicas that start at ``min_replicas`` must."""
    return direction_changes(np.concatenate(([0.0], np.asarray(offered_rps, dtype=np.float64))))


def service_summary(
    scenario: Scenario, result: RunResult, service: str, budget_cores: float
) -> dict[str, Any]:
    """The figures one run gives one service (latencies count unfinished requests by their
    age; requests the gateway's admission rejected count as over the SLO and, in the latency
    quantiles, as never served: ``inf``, written ``null`` in JSON)."""
    s = result.series[service]
    lat = result.latencies_s[service]
    outcomes = result.outcomes_s(service)
    slo = scenario.loads[service].slo_s
    ready = s["ready_replicas"]
    running = s["cpu_per_replica_cores"][s["cpu_per_replica_cores"] > 0]
    hours = scenario.duration_s / 3600
    contention = scenario.contention(budget_cores)
    return {
        "requests": result.arrivals[service],
        "completed": result.completed[service],
        "unfinished": result.unfinished[service],
        "rejected": result.rejected.get(service, 0),
        "throughput_rps": result.completed[service] / scenario.duration_s,
        "latency_p50_s": _quantile(outcomes, 0.5),
        "latency_p99_s": _quantile(outcomes, 0.99),
        "latency_max_s": float(outcomes.max()) if outcomes.size else None,
        "latency_cdf_s": latency_cdf(outcomes),
        "slo_s": slo,
        "requests_over_slo": int((lat > slo).sum()) + result.rejected.get(service, 0),
        "time_over_slo_s": float(s["over_slo"].sum() * scenario.tick_s),
        "cpu_seconds": result.cpu_seconds[service],
        "allocated_core_seconds": float(s["allocated_cores"].sum() * scenario.tick_s),
        "replicas_min": int(ready.min()),
        "replicas_max": int(ready.max()),
        "pending_replicas_max": int(s["pending_replicas"].max()),
        "cpu_per_replica_min_cores": float(running.min()) if running.size else 0.0,
        "cpu_per_replica_max_cores": float(running.max()) if running.size else 0.0,
        "cpu_used_in_contention_cores": (
            float(s["used_cores"][contention].mean()) if contention.any() else None
        ),
        "replicas_removed_while_starting": result.removed_while_starting.get(service, 0),
        "replica_direction_changes_per_hour": result.replica_reversals.get(service, 0) / hours,
        "offered_direction_changes_per_hour": offered_direction_changes(
            scenario.offered_rps[service]
        )
        / hours,
        "rules": result.rules.get(service, {}),
    }


def budget_summary(scenario: Scenario, result: RunResult, budget_cores: float) -> dict[str, Any]:
    """How much of the budget the run used, overall and while services contend for it."""
    used = np.sum([result.series[s]["used_cores"] for s in scenario.services], axis=0)
    allocated = np.sum([result.series[s]["allocated_cores"] for s in scenario.services], axis=0)
    contention = scenario.contention(budget_cores)
    n = int(contention.sum())
    return {
        "budget_cores": budget_cores,
        "utilisation": float(used.mean() / budget_cores),
        "allocated_fraction": float(allocated.mean() / budget_cores),
        "allocated_max_cores": float(allocated.max()),
        "contention_s": n * scenario.tick_s,
        "utilisation_during_contention": float(used[contention].mean() / budget_cores)
        if n
        else None,
        "allocated_fraction_during_contention": (
            float(allocated[contention].mean() / budget_cores) if n else None
        ),
    }


def _ratio(a: Any, b: Any) -> float | None:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or b == 0:
        return None
    return float(a) / float(b)


def compare(sluice: Mapping[str, Any], baseline: Mapping[str, Any]) -> dict[str, float | None]:
    """Sluice ÷ baseline for every numeric figure."""
    return {
        k: _ratio(v, baseline.get(k))
        for k, v in sluice.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def build_report(
    scenario: Scenario,
    runs: list[RunResult],
    budget_cores: float,
    meta: Mapping[str, Any],
    *,
    enforcement: Enforcement | None = None,
) -> dict[str, Any]:
    """The whole report (what ``report.json`` holds): figures, comparison and per-tick series.

    ``enforcement``: the node model of the first run (Sluice's), checked against it when given.
    Every run normally uses the same one; when a run used another (``--baseline-enforcement``),
    ``node`` says so and ``node_models`` gives each run's."""
    if not runs:
        raise ValueError("no runs to report")
    own = runs[0].enforcement
    if enforcement is None:
        enforcement = own
    elif own != enforcement:
        raise ValueError(f"the first run used {own}, not {enforcement}")
    models = {r.name: r.enforcement for r in runs}
    if set(models.values()) == {enforcement}:
        node = f"{NODE_MODELS[enforcement]}; every run on this node model"
    else:
        node = "; ".join(f"{name}: {NODE_MODELS[e]}" for name, e in models.items())
        node = f"runs on different node models -- {node}"
    lending = {r.name: r.lend_after_idle_s for r in runs}
    for name, after_s in lending.items():
        if after_s is not None:
            node += (
                f"; {name} lends the quota of a service idle for {after_s:g} s to the busy ones "
                "between ticks and takes it back at its next request (budget.lending)"
            )
    out: dict[str, Any] = {
        "meta": dict(meta),
        "enforcement": enforcement,
        "node": node,
        "node_models": models,
        "lend_after_idle_s": lending,
        "scenario": {
            "latency_cdf_levels": list(CDF_LEVELS),
            "duration_s": scenario.duration_s,
            "tick_s": scenario.tick_s,
            "seed": scenario.seed,
            "budget_cores": budget_cores,
            "services": {
                s: {
                    "slo_s": scenario.loads[s].slo_s,
                    "startup_s": scenario.loads[s].startup_s,
                    "requests": len(scenario.arrivals[s]),
                    "offered_cores_mean": float(scenario.offered_cores[s].mean()),
                    "offered_cores_max": float(scenario.offered_cores[s].max()),
                }
                for s in scenario.services
            },
        },
        "runs": {},
        "series": {
            "time_s": (np.arange(scenario.ticks) * scenario.tick_s).tolist(),
            "contention": scenario.contention(budget_cores).astype(int).tolist(),
            "offered_rps": {s: scenario.offered_rps[s].tolist() for s in scenario.services},
            "offered_cores": {s: scenario.offered_cores[s].tolist() for s in scenario.services},
        },
    }
    for r in runs:
        out["runs"][r.name] = {
            "services": {
                s: service_summary(scenario, r, s, budget_cores) for s in scenario.services
            },
            "budget": budget_summary(scenario, r, budget_cores),
            "ticks": {"regular": scenario.ticks, "early": r.early_ticks},
        }
        out["series"][r.name] = {
            s: {
                k: [None if math.isnan(x) else round(float(x), 6) for x in v]
                for k, v in series.items()
            }
            for s, series in r.series.items()
        }
    if len(runs) == 2:
        first, second = runs
        a, b = out["runs"][first.name], out["runs"][second.name]
        out["comparison"] = {
            "of": first.name,
            "to": second.name,
            "services": {s: compare(a["services"][s], b["services"][s]) for s in scenario.services},
            "budget": compare(a["budget"], b["budget"]),
        }
    return out


def json_ready(value: Any) -> Any:
    """``value`` with every non-finite float as ``None`` (JSON has no infinity: a latency
    quantile that falls among rejected requests is written ``null``, as is one without
    requests; the ``rejected`` count next to it tells the two apart)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    return value


def write_json(report: Mapping[str, Any], path: Path) -> None:
    path.write_text(
        json.dumps(json_ready(report), indent=1, allow_nan=False) + "\n", encoding="utf-8"
    )


_ROWS: list[tuple[str, str, str]] = [
    ("requests", "requests", "{:.0f}"),
    ("completed", "completed", "{:.0f}"),
    ("unfinished", "unfinished at end", "{:.0f}"),
    ("rejected", "rejected (503, admission)", "{:.0f}"),
    ("throughput_rps", "throughput (req/s)", "{:.2f}"),
    ("latency_p50_s", "p50 latency (s)", "{:.3f}"),
    ("latency_p99_s", "p99 latency (s)", "{:.3f}"),
    ("requests_over_slo", "requests over SLO", "{:.0f}"),
    ("time_over_slo_s", "time over SLO (s)", "{:.0f}"),
    ("cpu_seconds", "CPU-seconds used", "{:.0f}"),
    ("replicas_min", "replicas min", "{:.0f}"),
    ("replicas_max", "replicas max", "{:.0f}"),
    ("cpu_per_replica_max_cores", "CPU/replica max", "{:.2f}"),
    ("replica_direction_changes_per_hour", "replica direction changes /h", "{:.0f}"),
    ("offered_direction_changes_per_hour", "… of the offered load /h", "{:.0f}"),
    ("replicas_removed_while_starting", "replicas removed while starting", "{:.0f}"),
]


def _fmt(value: Any, pattern: str) -> str:
    if value is None:
        return "-"
    return pattern.format(value)


def print_tables(report: Mapping[str, Any], console: Console) -> None:
    """One table per service (figures side by side, Sluice ÷ baseline), then one for the budget."""
    names = list(report["runs"])
    if "node" in report:
        console.print(f"node model: {report['node']}")
    cpu = report.get("meta", {}).get("cpu_figures", CGROUP_FIGURES)
    if cpu != CGROUP_FIGURES:
        console.print(f"CPU use as the scaler sees it: {cpu}")
    comparison = report.get("comparison", {})
    for service, info in report["scenario"]["services"].items():
        table = Table(title=f"{service}  (SLO {info['slo_s']:g} s)", title_justify="left")
        table.add_column("figure")
        for name in names:
            table.add_column(name, justify="right")
        if comparison:
            table.add_column(f"{comparison['of']} ÷ {comparison['to']}", justify="right")
        for key, label, pattern in _ROWS:
            cells = [_fmt(report["runs"][n]["services"][service].get(key), pattern) for n in names]
            if comparison:
                ratio = comparison["services"][service].get(key)
                cells.append("-" if ratio is None else f"{ratio:.3g}")
            table.add_row(label, *cells)
        console.print(table)
    table = Table(
        title=f"budget ({report['scenario']['budget_cores']:g} cores)", title_justify="left"
    )
    table.add_column("figure")
    for name in names:
        table.add_column(name, justify="right")
    rows = [
        ("utilisation", "CPU used / budget", "{:.1%}"),
        ("utilisation_during_contention", "… during contention", "{:.1%}"),
        ("allocated_fraction", "CPU allocated / budget", "{:.1%}"),
        ("contention_s", "contention (s)", "{:.0f}"),
    ]
    for key, label, pattern in rows:
        table.add_row(label, *[_fmt(report["runs"][n]["budget"].get(key), pattern) for n in names])
    console.print(table)
    for name in names:
        ticks = report["runs"][name]["ticks"]
        console.print(f"{name}: {ticks['regular']} regular ticks, early ticks: {ticks['early']}")
