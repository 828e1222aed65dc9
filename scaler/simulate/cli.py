"""``sluice simulate``: replay a workload through the model under Sluice and a baseline.

The gateway's CLI loads the Sluice config (``gateway.settings``) and hands the policies and
the budget here; the scaler never imports the gateway.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the heavy imports wait until a simulation really runs
    from rich.console import Console

    from scaler.policy import BudgetConfig, ScalingPolicy
    from scaler.simulate.baselines import RunName
    from scaler.simulate.model import Admission
    from scaler.simulate.runner import RunResult, Scenario


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The simulate options (``--config`` is added by the caller, which loads it)."""
    parser.add_argument(
        "--workload", "-w", type=Path, required=True, help="workload file (.yaml or .csv)"
    )
    parser.add_argument(
        "--baseline",
        choices=["independent", "static"],
        default="independent",
        help="what to compare Sluice with (default: independent)",
    )
    parser.add_argument(
        "--enforcement",
        choices=["share", "limit"],
        default=None,
        help="node model for Sluice's run: share (decided CPU = guaranteed share, idle CPU used "
        "up to cpu.max) or limit (decided CPU = hard cap) (default: the config's "
        "budget.enforcement; auto is share here: the node is the budget)",
    )
    parser.add_argument(
        "--baseline-enforcement",
        choices=["share", "limit"],
        default=None,
        help="node model for the baseline's run (default: limit, one autoscaler per service on "
        "replicas whose CPU limit is their request, as Kubernetes pods of Guaranteed QoS; "
        "share: replicas without a CPU limit, which use idle CPU by weight)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("simulate-out"),
        help="directory for report.json, report.png and zoom.png",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        help="simulated seconds (default: the workload's duration_s)",
    )
    parser.add_argument(
        "--tick", type=float, default=1.0, help="scaler tick and model step, seconds (default: 1)"
    )
    parser.add_argument(
        "--seed", type=int, default=None, help="random seed (default: the workload's seed)"
    )
    parser.add_argument(
        "--plot",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="draw report.png and zoom.png (needs matplotlib: pip install 'sluice[sim]'); "
        "--plot fails at once without it, --no-plot skips them (default: draw them when "
        "matplotlib is installed, else say how to install it)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def simulate_runs(
    scenario: Scenario,
    policies: Mapping[str, ScalingPolicy],
    budget: BudgetConfig,
    names: Sequence[RunName],
    *,
    console: Console | None = None,
    progress: bool = True,
    budgets: Mapping[str, BudgetConfig] | None = None,
) -> list[RunResult]:
    """Run each of ``names`` on the same scenario, with a rich progress bar on ``console``.

    ``budgets``: a different budget (e.g. node model) for some runs, by name."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from scaler.simulate.runner import run

    console = console or Console(stderr=True)
    results: list[RunResult] = []
    with Progress(
        TextColumn("{task.description:>12}"),
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.total:.0f} ticks"),
        TimeElapsedColumn(),
        console=console,
        disable=not progress,
        transient=False,
    ) as bar:
        for name in names:
            task = bar.add_task(name, total=scenario.ticks)

            def advance(done: int, task_id: Any = task) -> None:
                bar.update(task_id, completed=done)

            own = (budgets or {}).get(name, budget)
            results.append(run(scenario, name, policies, own, progress=advance))
    return results


def _unwritable(out: Path) -> str | None:
    """Why the results cannot be written to directory ``out`` (created if missing), or None."""
    if out.exists() and not out.is_dir():
        return "exists and is not a directory"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"cannot create the directory: {e.strerror or e}"
    if not os.access(out, os.W_OK):
        return "the directory is not writable"
    return None


def timeout_notes(results: Sequence[RunResult], timeouts_s: Mapping[str, float]) -> list[str]:
    """The gateway answers 504 when an upstream has not answered within the service's
    ``timeouts.response_header_s``; the model lets every request run to its end.  One line
    per service where some run had requests that took longer (from their arrival, so a
    wait in the gateway's queue counts too; unfinished ones by their age at the end)."""
    lines: list[str] = []
    for service, timeout in timeouts_s.items():
        over = [
            (r.name, int((r.latencies_s[service] > timeout).sum()))
            for r in results
            if service in r.latencies_s
        ]
        if not any(n for _, n in over):
            continue
        said = " and ".join(
            f"{n:,} of {'Sluice' if name == 'sluice' else name}'s" for name, n in over
        )
        lines.append(
            f"services.{service}.timeouts.response_header_s: {timeout:g} s: {said} requests "
            f"took longer; the gateway answers such a request 504 at {timeout:g} s (the model "
            "lets every request run to its end)"
        )
    return lines


def run_command(
    args: argparse.Namespace,
    policies: Mapping[str, ScalingPolicy],
    budget: BudgetConfig,
    config_label: str,
    admission: Mapping[str, Admission] | None = None,
    *,
    cpu_window_s: float = 0.0,
    response_timeouts_s: Mapping[str, float] | None = None,
) -> int:
    """Run ``sluice simulate`` with a loaded config (``admission``: the gateway's admission
    control per service, from its ``limits``; ``cpu_window_s``: > 0, CPU use measured as
    metrics.k8s.io serves it, polled that often, see :class:`MetricsServerCpu`;
    ``response_timeouts_s``: each service's ``timeouts.response_header_s``, for
    :func:`timeout_notes`); returns the exit code."""
    from rich.console import Console

    from scaler.simulate.baselines import BASELINE_ENFORCEMENT as baseline_enforcement
    from scaler.simulate.plot import missing, write_plots
    from scaler.simulate.report import build_report, print_tables, write_json
    from scaler.simulate.runner import SimulationError, build_scenario
    from scaler.simulate.workload import WorkloadError, load_workload

    out: Path = args.out
    problem = _unwritable(out)
    if problem is not None:
        print(f"sluice simulate: --out {out}: {problem}", file=sys.stderr)
        return 2
    plot: bool | None = getattr(args, "plot", None)
    cannot_draw = missing() if plot is not False else None
    if plot and cannot_draw is not None:
        print(f"sluice simulate: --plot: {cannot_draw}", file=sys.stderr)
        return 2

    err = Console(stderr=True)
    if budget.cpu == "auto":
        print(
            "sluice simulate: budget.cpu: auto is measured by a platform; the simulator needs "
            "a number of cores (set budget.cpu)",
            file=sys.stderr,
        )
        return 2
    if args.enforcement is not None:
        budget = budget.model_copy(update={"enforcement": args.enforcement})
    budget = budget.resolved(None)
    try:
        workload = load_workload(args.workload)
        scenario = build_scenario(
            workload,
            policies,
            duration_s=args.duration,
            tick_s=args.tick,
            seed=args.seed,
            admission=admission,
        )
        if cpu_window_s > 0:
            scenario = dataclasses.replace(scenario, cpu_window_s=cpu_window_s)
    except WorkloadError as e:
        for line in e.problems:
            print(line, file=sys.stderr)
        return 2
    except SimulationError as e:
        print(f"{args.workload}: {e}", file=sys.stderr)
        return 2
    names: list[RunName] = ["sluice", args.baseline]
    budgets: dict[str, BudgetConfig] = {
        args.baseline: budget.model_copy(
            update={"enforcement": args.baseline_enforcement or baseline_enforcement}
        )
    }
    try:
        results = simulate_runs(
            scenario,
            policies,
            budget,
            names,
            console=err,
            progress=not args.no_progress,
            budgets=budgets,
        )
    except NotImplementedError as e:
        print(f"sluice simulate: the scaler engine cannot run: {e}", file=sys.stderr)
        return 1
    meta = {
        "command": "sluice simulate",
        "config": config_label,
        "workload": str(args.workload),
        "baseline": args.baseline,
        "model": "processor sharing per replica, least-request dispatch, Poisson arrivals",
        "enforcement": budget.enforcement,
        "cpu_figures": scenario.cpu_figures,
    }
    report = build_report(scenario, results, budget.fixed_cores(), meta)
    try:
        write_json(report, out / "report.json")
        written = [out / "report.json"]
        if plot is not False and cannot_draw is None:
            written += write_plots(report, out)
    except OSError as e:
        print(f"sluice simulate: --out {out}: cannot write: {e.strerror or e}", file=sys.stderr)
        return 1
    print_tables(report, Console())
    for line in timeout_notes(results, response_timeouts_s or {}):
        print(f"sluice simulate: note: {config_label}: {line}", file=sys.stderr)
    if cannot_draw is not None:
        print(f"sluice simulate: no report.png/zoom.png: {cannot_draw}", file=sys.stderr)
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0
