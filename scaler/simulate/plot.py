"""The report's PNG: per service, load, replicas, CPU and latency over time, both runs overlaid."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

_STYLE = {
    0: {"linestyle": "-", "linewidth": 1.2, "color": "tab:blue"},
    1: {"linestyle": "--", "linewidth": 1.0, "color": "tab:orange"},
    2: {"linestyle": ":", "linewidth": 1.0, "color": "tab:green"},
}


def write_png(report: Mapping[str, Any], path: Path) -> None:
    """Draw ``report`` (as :func:`scaler.simulate.report.build_report` makes it) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    series = report["series"]
    time_s = np.asarray(series["time_s"])
    services = list(report["scenario"]["services"])
    runs = list(report["runs"])
    budget = report["scenario"]["budget_cores"]
    contention = np.asarray(series["contention"], dtype=bool)
    fig, axes = plt.subplots(
        len(services) + 1, 5, figsize=(22, 3.0 * (len(services) + 1)), squeeze=False, sharex=True
    )
    tick_s = float(report["scenario"]["tick_s"])
    for row, service in enumerate(services):
        ax_load, ax_sys, ax_rep, ax_cpu, ax_lat = axes[row]
        ax_load.plot(time_s, series["offered_rps"][service], color="grey", label="offered")
        slo = report["scenario"]["services"][service]["slo_s"]
        for i, run in enumerate(runs):
            s = series[run][service]
            style = _STYLE[min(i, 2)]
            ax_load.plot(
                time_s, _num(s["completions"]) / tick_s, label=f"{run}: completed", **style
            )
            ax_sys.plot(time_s, _num(s["in_system"]), label=run, **style)
            ax_rep.plot(time_s, _num(s["ready_replicas"]), label=run, **style)
            ax_cpu.plot(time_s, _num(s["allocated_cores"]), label=f"{run}: allocated", **style)
            ax_cpu.fill_between(
                time_s,
                _num(s["used_cores"]),
                alpha=0.25,
                color=style["color"],
                label=f"{run}: used",
            )
            ax_lat.plot(time_s, _num(s["latency_p99_s"]), label=run, **style)
        ax_lat.axhline(slo, color="red", linewidth=0.8, label="SLO")
        ax_lat.set_yscale("log")
        ax_load.set_ylabel(service)
        for ax, title in zip(
            (ax_load, ax_sys, ax_rep, ax_cpu, ax_lat),
            (
                "requests/s: offered, completed",
                "requests in system (queued + in flight)",
                "ready replicas",
                "CPU (cores): allocated (line), used (area)",
                "p99 latency of the tick's completions (s)",
            ),
            strict=True,
        ):
            ax.set_title(title, fontsize=9)
            ax.legend(fontsize=7, loc="upper right")
    ax_used, ax_alloc, ax_cont, *rest = axes[-1]
    for ax in rest:
        ax.axis("off")
    for i, run in enumerate(runs):
        style = _STYLE[min(i, 2)]
        used = np.sum([_num(series[run][s]["used_cores"]) for s in services], axis=0)
        alloc = np.sum([_num(series[run][s]["allocated_cores"]) for s in services], axis=0)
        ax_used.plot(time_s, used, label=run, **style)
        ax_alloc.plot(time_s, alloc, label=run, **style)
    for ax, title in (
        (ax_used, "CPU used, all services"),
        (ax_alloc, "CPU allocated, all services"),
    ):
        ax.axhline(budget, color="red", linewidth=0.8, label="budget")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    ax_cont.fill_between(time_s, contention.astype(float), step="post", alpha=0.4)
    ax_cont.set_title("contention (offered > budget, 2+ services)", fontsize=9)
    for ax in axes[-1]:
        ax.set_xlabel("time (s)")
    fig.suptitle(f"sluice simulate: {' vs '.join(runs)}, budget {budget:g} cores")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _num(values: list[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=float)
