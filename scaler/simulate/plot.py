"""The report's figures, read at a glance.

* ``report.png`` (summary): per service, the latency CDF of every run (Sluice and the
  baseline on the same arrivals); per run, the CPU each service used, stacked against the
  budget, smoothed over windows of about 1/150 of the run (a raw 1 s series over an hour is
  noise), with the ticks in contention shaded.
* ``zoom.png``: one or two cycles around the first contention, raw per-tick series: CPU used
  stacked against the budget, ready replicas and p99 latency against the SLO, per run.

matplotlib is an optional extra (``pip install 'sluice[sim]'``); :func:`missing` says whether
it is installed and how to install it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

INSTALL_HINT = "pip install 'sluice[sim]'"

_RUN_STYLE = {0: ("tab:blue", "-"), 1: ("tab:orange", "--"), 2: ("tab:green", ":")}


def missing() -> str | None:
    """None when the figures can be drawn, else what to do about it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return f"the figures need matplotlib, which is not installed: {INSTALL_HINT}"
    return None


def write_plots(report: Mapping[str, Any], out: Path) -> list[Path]:
    """Draw ``report`` (:func:`scaler.simulate.report.build_report`) into ``out``; the paths."""
    import matplotlib

    matplotlib.use("Agg")
    paths = [out / "report.png", out / "zoom.png"]
    _summary(report, paths[0])
    _zoom(report, paths[1])
    return paths


def _num(values: Sequence[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Centred moving average over ``window`` points (NaNs ignored; the edges use what exists)."""
    if window <= 1 or values.size == 0:
        return values
    ok = ~np.isnan(values)
    kernel = np.ones(window)
    total = np.convolve(np.where(ok, values, 0.0), kernel, mode="same")
    count = np.convolve(ok.astype(float), kernel, mode="same")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def zoom_window(contention: np.ndarray, ticks: int) -> tuple[int, int]:
    """Tick range of one or two cycles around the first contention (the first 120 ticks without)."""
    starts = np.flatnonzero(np.diff(np.concatenate([[0], contention.astype(int)])) == 1)
    if starts.size == 0:
        return 0, min(ticks, 120)
    first = int(starts[0])
    cycle = int(starts[1] - starts[0]) if starts.size > 1 else 60
    cycle = max(20, min(cycle, 300))
    lo = max(0, first - cycle // 4)
    return lo, min(ticks, lo + 2 * cycle)


def _services_colours(services: Sequence[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(services) <= 10 else "tab20"]
    return {s: cmap(i % cmap.N) for i, s in enumerate(services)}


def _shade(ax: Any, time_s: np.ndarray, contention: np.ndarray) -> None:
    if contention.any():
        ax.fill_between(
            time_s,
            0,
            1,
            where=contention,
            transform=ax.get_xaxis_transform(),
            color="grey",
            alpha=0.12,
            step="post",
            linewidth=0,
        )


def _summary(report: Mapping[str, Any], path: Path) -> None:
    from matplotlib import pyplot as plt

    series = report["series"]
    scenario = report["scenario"]
    services = list(scenario["services"])
    runs = list(report["runs"])
    budget = float(scenario["budget_cores"])
    time_s = np.asarray(series["time_s"], dtype=float)
    contention = np.asarray(series["contention"], dtype=bool)
    levels = np.asarray(scenario.get("latency_cdf_levels", []), dtype=float)
    window = max(1, time_s.size // 150)
    colours = _services_colours(services)
    cols = max(min(len(services), 5), len(runs))
    cdf_rows = -(-len(services) // cols)
    fig = plt.figure(figsize=(4.2 * cols, 3.2 * (cdf_rows + 1.4)))
    grid = fig.add_gridspec(cdf_rows + 1, cols, height_ratios=[1.0] * cdf_rows + [1.4])
    for i, service in enumerate(services):
        ax = fig.add_subplot(grid[i // cols, i % cols])
        slo = scenario["services"][service]["slo_s"]
        for k, run in enumerate(runs):
            figures = report["runs"][run]["services"][service]
            cdf = figures.get("latency_cdf_s")
            colour, style = _RUN_STYLE[min(k, 2)]
            rejected = figures.get("rejected", 0)
            shed = f", {rejected} rejected" if rejected else ""
            # rejected requests are never served (inf): the curve stops short of 1 at their share
            x = np.asarray([np.nan if v is None else v for v in cdf or []], dtype=float)
            x[~np.isfinite(x)] = np.nan
            if np.isnan(x).all():  # nothing served: say so rather than leave the run out
                if figures.get("requests"):
                    ax.plot(
                        [], [], color=colour, linestyle=style, label=f"{run}: none served{shed}"
                    )
                continue
            p99 = figures["latency_p99_s"]
            p99_text = (
                f"p99 {p99:.3g} s" if p99 is not None and math.isfinite(p99) else "p99 rejected"
            )
            ax.plot(
                np.maximum(x, 1e-4),
                levels,
                color=colour,
                linestyle=style,
                label=f"{run} ({p99_text}{shed})",
                drawstyle="steps-post",
            )
        ax.axvline(slo, color="red", linewidth=0.8, label=f"SLO {slo:g} s")
        ax.set_xscale("log")
        ax.set_ylim(0, 1.01)
        ax.set_title(f"{service}: latency CDF", fontsize=9)
        ax.set_xlabel("latency (s)", fontsize=8)
        ax.set_ylabel("share of requests <= latency", fontsize=8)
        ax.legend(fontsize=7, loc="lower right")
    cpu_row = grid[cdf_rows, :].subgridspec(1, len(runs))  # equal widths, the whole row
    for k, run in enumerate(runs):
        ax = fig.add_subplot(cpu_row[0, k])
        used = [smooth(_num(series[run][s]["used_cores"]), window) for s in services]
        ax.stackplot(time_s, used, labels=services, colors=[colours[s] for s in services])
        ax.axhline(budget, color="black", linewidth=1.0, label=f"budget {budget:g}")
        _shade(ax, time_s, contention)
        util = report["runs"][run]["budget"].get("utilisation_during_contention")
        note = f"{util:.0%} of the budget used in contention (shaded)" if util is not None else ""
        smooth_note = f"{window * float(scenario['tick_s']):g} s means" if window > 1 else ""
        detail = "; ".join(x for x in (note, smooth_note) if x)
        ax.set_title(f"{run}: CPU used by service\n{detail}", fontsize=9)
        ax.set_ylim(0, budget * 1.15)
        ax.set_xlabel("time (s)", fontsize=8)
        ax.set_ylabel("cores", fontsize=8)
        if k == 0:
            ax.legend(fontsize=7, loc="upper left", ncol=min(len(services) + 1, 6))
    fig.suptitle(f"sluice simulate: {' vs '.join(runs)}, budget {budget:g} cores")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _zoom(report: Mapping[str, Any], path: Path) -> None:
    from matplotlib import pyplot as plt

    series = report["series"]
    scenario = report["scenario"]
    services = list(scenario["services"])
    runs = list(report["runs"])
    budget = float(scenario["budget_cores"])
    time_all = np.asarray(series["time_s"], dtype=float)
    contention_all = np.asarray(series["contention"], dtype=bool)
    lo, hi = zoom_window(contention_all, time_all.size)
    time_s, contention = time_all[lo:hi], contention_all[lo:hi]
    colours = _services_colours(services)
    fig, axes = plt.subplots(
        3, len(runs), figsize=(7 * len(runs), 8), squeeze=False, sharex=True, sharey="row"
    )
    for k, run in enumerate(runs):
        ax_cpu, ax_rep, ax_lat = axes[:, k]
        used = [_num(series[run][s]["used_cores"])[lo:hi] for s in services]
        ax_cpu.stackplot(time_s, used, labels=services, colors=[colours[s] for s in services])
        ax_cpu.axhline(budget, color="black", linewidth=1.0, label="budget")
        ax_cpu.set_title(f"{run}: CPU used by service (cores)", fontsize=9)
        for s in services:
            ax_rep.step(
                time_s,
                _num(series[run][s]["ready_replicas"])[lo:hi],
                where="post",
                color=colours[s],
                label=s,
            )
            ax_lat.plot(time_s, _num(series[run][s]["latency_p99_s"])[lo:hi], color=colours[s])
            ax_lat.axhline(
                scenario["services"][s]["slo_s"], color=colours[s], linewidth=0.6, linestyle=":"
            )
        ax_rep.set_title(f"{run}: ready replicas", fontsize=9)
        ax_lat.set_title(f"{run}: p99 latency per tick (s; dotted: SLOs)", fontsize=9)
        ax_lat.set_yscale("log")
        ax_lat.set_xlabel("time (s)", fontsize=8)
        for ax in (ax_cpu, ax_rep, ax_lat):
            _shade(ax, time_s, contention)
        if k == 0:
            ax_cpu.legend(fontsize=7, loc="upper left", ncol=min(len(services) + 1, 6))
    fig.suptitle(
        f"zoom: {time_s[0]:g}-{time_s[-1]:g} s (contention shaded), budget {budget:g} cores"
        if time_s.size
        else "zoom"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
