"""The seed scenario in the simulator: Sluice vs `independent` vs `static`, with the goals.

    python benchmarks/shared_budget_sim.py [--duration S] [--out DIR] [--speed]
                                           [--early-ticks on|off|both] [--enforcement share|limit|both]

Runs benchmarks/workloads/long_short.yaml (api: long-lived, reports: bursts of 10 s every
60 s) on the 2-CPU config benchmarks/workloads/long_short.config.yaml through the queueing
model and the real engine, three times on the very same arrivals, and prints:
reports' p99 latency (goal: independent ÷ Sluice >= 10), api's throughput (goal: Sluice ÷
independent >= 0.95) and budget utilisation during contention (goal: >= 90 %), with
``budget.early_ticks`` on and off (``--early-ticks on|off|both``), under
``budget.enforcement: limit`` (this script's default; ``--enforcement share|both``; the config's ``auto`` is
share under ``sluice simulate``, with the baselines on limit).  Every run of one
table (Sluice and the baselines) uses the same node model, so the comparison isolates the
controller (under limit, Sluice's run lends an idle service's quota to busy ones between
ticks, ``budget.lending``, as the local platform does; an HPA per service and a static split
cannot); ``--enforcement both`` adds a table of the goals under share vs limit.
`--speed` also times one hour of ten services at 1 s ticks (wall and CPU time).
Writes DIR/shared_budget_sim.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from gateway.settings import load_settings  # noqa: E402
from scaler.policy import BudgetConfig, ScalingPolicy  # noqa: E402
from scaler.simulate.cli import simulate_runs  # noqa: E402
from scaler.simulate.report import build_report, json_ready  # noqa: E402
from scaler.simulate.runner import Enforcement, build_scenario, run  # noqa: E402
from scaler.simulate.workload import Workload, load_workload, parse_workload  # noqa: E402

CONFIG = ROOT / "benchmarks" / "workloads" / "long_short.config.yaml"
WORKLOAD = ROOT / "benchmarks" / "workloads" / "long_short.yaml"


def seed_config() -> tuple[Workload, dict[str, ScalingPolicy], BudgetConfig]:
    """The seed scenario: its workload, the services' policies and the budget."""
    settings = load_settings(CONFIG)
    policies = {n: s.scaling for n, s in settings.services.items()}
    return load_workload(WORKLOAD), policies, settings.budget


def seed_scenario(
    duration_s: float | None,
    console: Console,
    early_ticks: bool = True,
    enforcement: Enforcement = "limit",
) -> dict[str, object]:
    workload, policies, budget = seed_config()
    budget = budget.model_copy(update={"early_ticks": early_ticks, "enforcement": enforcement})
    scenario = build_scenario(workload, policies, duration_s=duration_s)
    started = time.perf_counter()
    cpu_started = time.process_time()
    results = simulate_runs(scenario, policies, budget, ["sluice", "independent", "static"])
    wall_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    report = build_report(
        scenario,
        results,
        budget.cpu,
        {"config": str(CONFIG), "workload": str(WORKLOAD)},
        enforcement=enforcement,
    )
    runs = report["runs"]
    table = Table(
        title=f"seed scenario: {scenario.duration_s:g} s, budget {budget.cpu:g} cores, "
        f"{enforcement} enforcement (every run), early ticks {'on' if early_ticks else 'off'}"
    )
    table.add_column("figure")
    for name in runs:
        table.add_column(name, justify="right")
    rows = [
        ("reports p50 latency (s)", "reports", "latency_p50_s", "{:.3f}"),
        ("reports p99 latency (s)", "reports", "latency_p99_s", "{:.3f}"),
        ("reports time over SLO (s)", "reports", "time_over_slo_s", "{:.0f}"),
        ("api p99 latency (s)", "api", "latency_p99_s", "{:.3f}"),
        ("api throughput (req/s)", "api", "throughput_rps", "{:.2f}"),
        ("api unfinished at end", "api", "unfinished", "{:.0f}"),
    ]
    for label, service, key, fmt in rows:
        table.add_row(label, *[fmt.format(runs[n]["services"][service][key]) for n in runs])
    for label, key in (
        ("utilisation", "utilisation"),
        ("utilisation in contention", "utilisation_during_contention"),
    ):
        table.add_row(label, *[f"{runs[n]['budget'][key]:.1%}" for n in runs])
    table.add_row("early ticks", *[f"{runs[n]['ticks']['early']}" for n in runs])
    console.print(table)
    goals = goals_of(runs["sluice"], runs["independent"])
    targets = TARGETS
    for key, value in goals.items():
        ok = value >= targets[key]
        console.print(f"{key}: {value:.3g} (goal >= {targets[key]:g}) {'met' if ok else 'NOT met'}")
    console.print(f"simulated 3 runs in {wall_s:.1f} s wall, {cpu_s:.1f} s CPU")
    return {
        "enforcement": enforcement,
        "early_ticks": early_ticks,
        "goals": goals,
        "targets": targets,
        "wall_s": wall_s,
        "cpu_s": cpu_s,
        "runs": runs,
    }


TARGETS = {
    "reports_p99_independent_over_sluice": 10.0,
    "api_throughput_sluice_over_independent": 0.95,
    "utilisation_during_contention_sluice": 0.90,
}


def goals_of(s: dict[str, Any], i: dict[str, Any]) -> dict[str, float]:
    """The seed scenario's three figures from a Sluice run and an independent run."""
    return {
        "reports_p99_independent_over_sluice": i["services"]["reports"]["latency_p99_s"]
        / s["services"]["reports"]["latency_p99_s"],
        "api_throughput_sluice_over_independent": s["services"]["api"]["throughput_rps"]
        / i["services"]["api"]["throughput_rps"],
        "utilisation_during_contention_sluice": s["budget"]["utilisation_during_contention"],
    }


def speed_scenario() -> tuple[Workload, dict[str, ScalingPolicy], BudgetConfig]:
    """One hour of ten services (steady load doubling every 5 min, 10 s bursts), budget 8."""
    services = {
        f"svc{i}": {
            "slo_s": 0.5,
            "cpu_cv": 0.5,
            "load": [{"at_s": 0, "rps": 4, "cpu_s": 0.05}, {"at_s": 300, "rps": 8, "cpu_s": 0.05}],
            "repeat_s": 600,
            "bursts": [{"every_s": 120, "for_s": 10, "start_s": 7 * i, "rps": 10, "cpu_s": 0.05}],
        }
        for i in range(10)
    }
    workload = parse_workload({"duration_s": 3600, "services": services})
    policies = {
        s: ScalingPolicy(target=2, max_replicas=8, cpu={"min": 0.1, "max": 1.0, "request": 0.25})
        for s in services
    }
    return workload, policies, BudgetConfig(cpu=8)


def speed(
    console: Console, early_ticks: bool = True, enforcement: Enforcement = "limit"
) -> dict[str, object]:
    """One hour of ten services at 1 s ticks (Sluice run only), timed."""
    workload, policies, budget = speed_scenario()
    budget = budget.model_copy(update={"early_ticks": early_ticks, "enforcement": enforcement})
    started = time.perf_counter()
    cpu_started = time.process_time()
    scenario = build_scenario(workload, policies)
    result = run(scenario, "sluice", policies, budget)
    wall_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    requests = sum(result.arrivals.values())
    console.print(
        f"speed: 1 h of 10 services at 1 s ticks, {enforcement} enforcement, "
        f"early ticks {'on' if early_ticks else 'off'} "
        f"({requests} requests, {scenario.ticks} regular + {result.early_ticks} early ticks): "
        f"{wall_s:.1f} s wall, {cpu_s:.1f} s CPU"
    )
    return {
        "enforcement": enforcement,
        "early_ticks": early_ticks,
        "wall_s": wall_s,
        "cpu_s": cpu_s,
        "requests": requests,
        "regular_ticks": scenario.ticks,
        "early_tick_count": result.early_ticks,
    }


def _suffix(enforcement: Enforcement, early_ticks: bool) -> str:
    """JSON key suffix: none for the defaults (limit, early ticks on)."""
    return ("" if enforcement == "limit" else f"_{enforcement}") + (
        "" if early_ticks else "_early_ticks_off"
    )


GOAL_LABELS = {
    "reports_p99_independent_over_sluice": "reports p99, independent ÷ Sluice",
    "api_throughput_sluice_over_independent": "api throughput, Sluice ÷ independent",
    "utilisation_during_contention_sluice": "Sluice utilisation in contention",
}


def side_by_side(
    seeds: dict[tuple[Enforcement, bool], dict[str, object]], console: Console
) -> None:
    """The goals under share vs limit enforcement, one column per run of the seed scenario."""
    table = Table(title="seed scenario goals: share vs limit enforcement (early ticks on/off)")
    table.add_column("goal")
    for enforcement, early in seeds:
        table.add_column(f"{enforcement} {'on' if early else 'off'}", justify="right")
    first = next(iter(seeds.values()))
    targets = first["targets"]
    assert isinstance(targets, dict)
    for key, target in targets.items():
        cells = []
        for result in seeds.values():
            goals = result["goals"]
            assert isinstance(goals, dict)
            cells.append(f"{goals[key]:.3g}{'' if goals[key] >= target else ' ✗'}")
        table.add_row(f"{GOAL_LABELS.get(key, key)} (≥ {target:g})", *cells)
    console.print(table)
    console.print("✗: goal not met")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--duration", type=float, default=None, help="simulated seconds (default: the workload's)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--speed", action="store_true", help="also time 1 h of 10 services")
    parser.add_argument(
        "--early-ticks",
        choices=["on", "off", "both"],
        default="both",
        help="budget.early_ticks for the runs (default: both, on first)",
    )
    parser.add_argument(
        "--enforcement",
        choices=["share", "limit", "both"],
        default="limit",
        help="budget.enforcement for every run (default: limit; both: limit, then share)",
    )
    args = parser.parse_args()
    console = Console()
    modes = {"on": [True], "off": [False], "both": [True, False]}[args.early_ticks]
    enforcements: list[Enforcement] = (
        ["limit", "share"] if args.enforcement == "both" else [args.enforcement]
    )
    out: dict[str, object] = {
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_avg": os.getloadavg(),
        }
    }
    seeds: dict[tuple[Enforcement, bool], dict[str, object]] = {}
    for enforcement in enforcements:
        for early in modes:
            key = "seed_scenario" + _suffix(enforcement, early)
            out[key] = seeds[enforcement, early] = seed_scenario(
                args.duration, console, early, enforcement
            )
    if len(enforcements) > 1:
        side_by_side(seeds, console)
        if True in modes:
            # Same arrivals: Sluice under share against the baseline under limit (pods with
            # limits = requests), stated as its own comparison, not as the like-for-like one.
            runs_share = seeds["share", True]["runs"]
            runs_limit = seeds["limit", True]["runs"]
            assert isinstance(runs_share, dict) and isinstance(runs_limit, dict)
            mixed = goals_of(runs_share["sluice"], runs_limit["independent"])
            out["seed_scenario_share_vs_limit_baseline"] = {"goals": mixed, "targets": TARGETS}
            console.print("Sluice under share vs independent under limit (early ticks on):")
            for key, value in mixed.items():
                ok = "met" if value >= TARGETS[key] else "NOT met"
                console.print(f"  {key}: {value:.3g} (goal >= {TARGETS[key]:g}) {ok}")
    if args.speed:
        for enforcement in enforcements:
            for early in modes:
                out["speed" + _suffix(enforcement, early)] = speed(console, early, enforcement)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "shared_budget_sim.json"
    path.write_text(json.dumps(json_ready(out), indent=1, allow_nan=False) + "\n")
    console.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
