"""The seed experiment on real processes: shared-budget arbitration vs independent autoscaling.

Runs the long-lived + periodic scenario on the local platform (real replicas of the demo
app, real cgroup CPU limits) twice with the same code and the same load, once with
``budget.arbitration: shared`` and once with ``independent`` (one autoscaler per service,
first come first served on the budget, nothing reclaimed), and prints side by side.
``--enforcement share|limit|both`` picks ``budget.enforcement`` (``both``: the pair of runs
for each, so four runs): ``share`` weights a cgroup per service by its entitlement (its fair
share of the budget) over replicas capped at ``cpu.max``, ``limit`` makes a replica's decided
CPU a hard quota.  Under ``limit`` the shared run
lends an idle service's quota to the busy one between ticks (``budget.lending``; ``--lending
off`` to compare); the independent run never does.  The figures:

* short-lived (``reports``) p50/p99 latency and requests over the SLO;
* long-lived (``api``) throughput (answers per second);
* CPU utilisation of the budget (the replicas' parent cgroup usage / budget x time), over
  the whole run and during the ``reports`` bursts (contention: both services want more
  than the budget);
* lost requests (any answer but 2xx, or none) and requests killed in flight (502/reset:
  what a replica killed or restarted while CPU is reclaimed would produce);
* how many decisions reclaimed CPU.

Load (open loop for ``reports``, closed loop for ``api``, both from ``gateway.tools.loadgen``):
``api`` is a throughput job, ``--api-clients`` clients back to back, 40 ms of CPU each,
which alone would take the whole budget; ``reports`` gets bursts of ``--burst-rps`` for
``--burst-s`` every ``--period-s`` (40 ms of CPU each).

Writes ``OUT/shared_budget_live.json`` (``--out``, default ``live-out``), one
``shared_budget_live.<enforcement>.png`` per enforcement and each run's decision log.  Needs writable CPU cgroups (root) for the
limits to mean anything; it says so when they are not applied.

    python benchmarks/shared_budget_live.py            # ~2 x 150 s (share)
    python benchmarks/shared_budget_live.py --enforcement both --duration 60 --period-s 20
    python benchmarks/shared_budget_live.py --fixed-size   # replicas of one size, no floors
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.platforms.local.cgroup_parent import CgroupParent, parent_name_for  # noqa: E402
from gateway.platforms.local.cgroups import CgroupUnavailable, detect_layout  # noqa: E402
from gateway.platforms.local.identity import default_identity, preflight  # noqa: E402
from gateway.tools.loadgen import LoadReport, Stream, percentile, run_load  # noqa: E402

LINE = re.compile(r"sluice listening data=http://(\S+):(\d+) admin=(\S+)")


def replica_user() -> dict[str, str]:
    """``user: root``, written, when this runs as root and ``nobody`` cannot run this
    interpreter (Sluice starts no replica as root unless told so); else nothing (nobody)."""
    if os.geteuid() != 0:
        return {}
    who = default_identity()
    command = ["{python}", "-m", "gateway.tools.demo"]
    if who is not None and preflight(command, os.environ.get("PATH"), who) is None:
        return {}
    return {"user": "root"}


def scenario_config(
    args: argparse.Namespace, arbitration: str, enforcement: str = "limit"
) -> dict[str, Any]:
    demo = ["{python}", "-m", "gateway.tools.demo", "--port", "{port}"]
    env = {"PYTHONPATH": str(ROOT), "DEMO_CPU_MS": "40"}
    # the floors (0.5 and 0.75 cores: a third and a half of the default 1.5-core budget),
    # scaled down to fit a smaller budget
    scale = min(1.0, args.budget_cpu / 1.5)
    api_scaling: dict[str, Any] = {
        "cpu": {"min": 0.1, "max": 0.5, "request": 0.5},
        "guaranteed_cpu": round(0.5 * scale, 3),
    }
    reports_scaling: dict[str, Any] = {
        "cpu": {"min": 0.1, "max": 1.0, "request": 0.25},
        "guaranteed_cpu": round(0.75 * scale, 3),
    }
    if getattr(args, "fixed_size", False):
        # replicas of one size (cpu.min = cpu.max) and no floor but min_replicas × cpu.min:
        # CPU moves between the services only by replicas (or, under share, weights)
        api_scaling = {"cpu": {"min": 0.5, "max": 0.5, "request": 0.5}}
        reports_scaling = {"cpu": {"min": 0.25, "max": 0.25, "request": 0.25}}
    return {
        "listen": {"host": "127.0.0.1", "port": 0},
        "admin": {"host": "127.0.0.1", "port": 0},
        "platform": "local",
        "budget": {
            "cpu": args.budget_cpu,
            "arbitration": arbitration,
            "enforcement": enforcement,
            "lending": getattr(args, "lending", "on") == "on",
            "lend_after_idle_s": getattr(args, "lend_after_idle_s", 0.02),
        },
        "services": {
            "api": {  # long-lived: first in config order (first come, first served)
                "routes": [{"path": "/api", "path_type": "Prefix"}],
                "replicas": {
                    "command": demo,
                    "port_range": [31100, 31119],
                    "env": env,
                    **replica_user(),
                },
                "limits": {"queue": {"max": 1000, "timeout_s": 60}},
                "scaling": {
                    "target": 2,
                    "min_replicas": 1,
                    "max_replicas": 3,
                    **api_scaling,
                    "weight": 1,
                },
            },
            "reports": {  # periodic, short-lived requests with a latency SLO
                "routes": [{"path": "/reports", "path_type": "Prefix"}],
                "replicas": {
                    "command": demo,
                    "port_range": [31200, 31219],
                    "env": env,
                    **replica_user(),
                },
                "limits": {"queue": {"max": 1000, "timeout_s": 60}},
                "scaling": {
                    "target": 2,
                    "min_replicas": 1,
                    "max_replicas": 4,
                    **reports_scaling,
                    "weight": 2,
                },
            },
        },
    }


class Gateway:
    """``python -m gateway run --config FILE`` (stopped with SIGTERM, output kept)."""

    def __init__(self, config: dict[str, Any], path: Path) -> None:
        path.write_text(yaml.safe_dump(config))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "run", "--config", str(path)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[str] = []
        ready = threading.Event()
        self.match: re.Match[str] | None = None

        def pump() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line.rstrip("\n"))
                if self.match is None and (m := LINE.search(line)):
                    self.match = m
                    ready.set()
            ready.set()

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        if not ready.wait(60) or self.match is None:
            self.stop()
            raise RuntimeError("the gateway did not start:\n" + "\n".join(self.lines[-40:]))
        self.host, self.port, self.admin = (
            self.match.group(1),
            int(self.match.group(2)),
            self.match.group(3),
        )

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._pump.join(5)
        return self.proc.returncode


ISOLATE_SHARES_V1 = 65536
ISOLATE_WEIGHT_V2 = 5000


class Isolation:
    """Shield the experiment from other tenants of a shared machine: the benchmark (so the
    gateway and load generator it starts) runs in a cgroup with a large CPU weight, and so
    does each gateway's replica parent.  Limits are unchanged: only the weight against
    *other* processes grows, so both modes are measured, not the neighbours' test suites."""

    def __init__(self) -> None:
        self.layout = detect_layout(Path("/proc/self/mountinfo").read_text())
        self.dir = self.layout.cpu_root / f"sluice-bench-{os.getpid()}"
        self.enabled = False

    def _weight_file(self, d: Path) -> tuple[Path, int]:
        if self.layout.version == 2:
            return d / "cpu.weight", ISOLATE_WEIGHT_V2
        return d / "cpu.shares", ISOLATE_SHARES_V1

    def weigh(self, d: Path) -> None:
        path, value = self._weight_file(d)
        path.write_text(str(value))

    def __enter__(self) -> Isolation:
        try:
            self.dir.mkdir(exist_ok=True)
            self.weigh(self.dir)
            (self.dir / "cgroup.procs").write_text(str(os.getpid()))
            self.enabled = True
        except OSError as e:
            print(f"  (no isolation from other processes: {e})", flush=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
        with contextlib.suppress(OSError):
            (self.layout.cpu_root / "cgroup.procs").write_text(str(os.getpid()))
        with contextlib.suppress(OSError):
            self.dir.rmdir()


def cpu_usage_s(gw: Gateway) -> float | None:
    layout = detect_layout(Path("/proc/self/mountinfo").read_text())
    try:
        return CgroupParent(layout, parent_name_for(gw.proc.pid)).group.read_usage().usage_s
    except (OSError, CgroupUnavailable):
        return None


async def wait_ready(gw: Gateway, services: list[str], timeout_s: float = 60) -> None:
    """Until every service has a routable endpoint (bounded)."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=gw.admin, timeout=5) as client:
        while time.monotonic() < deadline:
            body = (await client.get("/api/services")).json()["services"]
            if all(any(ep["routable"] for ep in body[s]["endpoints"]) for s in services):
                return
            await asyncio.sleep(0.2)
    raise RuntimeError("replicas did not become ready")


async def sample_decisions(gw: Gateway, stop: asyncio.Event, t0: float) -> dict[str, Any]:
    """Every second: the latest decision per service (for the plot), the parent cgroup's CPU
    usage; every decision seen."""
    timeline: list[dict[str, Any]] = []
    cpu_samples: list[tuple[float, float]] = []
    seen: dict[tuple[str, float], dict[str, Any]] = {}
    early_ticks = 0
    async with httpx.AsyncClient(base_url=gw.admin, timeout=5) as client:
        while not stop.is_set():
            used = cpu_usage_s(gw)
            if used is not None:
                cpu_samples.append((time.monotonic() - t0, used))
            try:
                body = (await client.get("/api/decisions", params={"limit": "256"})).json()
            except httpx.HTTPError:
                body = None
            if body is not None:
                early_ticks = body.get("early_ticks", 0)
                timeline.append(
                    {
                        "t_s": time.monotonic() - t0,
                        **{
                            name: {
                                "replicas": d["replicas"],
                                "cpu": d["cpu_per_replica_cores"],
                                "allocated": d["allocated_cores"],
                            }
                            for name, d in body["latest"].items()
                        },
                    }
                )
                for d in body["recent"]:
                    seen[(d["service"], d["at"])] = d
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
    return {
        "timeline": timeline,
        "decisions": list(seen.values()),
        "early_ticks": early_ticks,
        "cpu_samples": cpu_samples,
    }


def burst_windows(args: argparse.Namespace) -> list[tuple[float, float]]:
    """When ``reports`` bursts (seconds since the load started): both services then want
    more than the budget (``api`` alone would take it all)."""
    out = []
    start = args.first_burst_s
    while start < args.duration:
        out.append((start, min(start + args.burst_s, args.duration)))
        start += args.period_s
    return out


def contention_utilisation(
    samples: list[tuple[float, float]], windows: list[tuple[float, float]], budget_cpu: float
) -> float | None:
    """CPU used / (budget x time) over the sample intervals that lie inside a burst window."""
    used = elapsed = 0.0
    for (t0, u0), (t1, u1) in itertools.pairwise(samples):
        if any(lo <= t0 and t1 <= hi for lo, hi in windows):
            used += u1 - u0
            elapsed += t1 - t0
    return used / (budget_cpu * elapsed) if elapsed > 0 else None


def summarize(
    report: LoadReport, sampled: dict[str, Any], cpu_s: float | None, args: argparse.Namespace
) -> dict[str, Any]:
    rs = [r for r in report.results if r.service == "reports"]
    ok = sorted(r.latency_s for r in rs if 200 <= r.status < 300)
    api_ok = [r for r in report.results if r.service == "api" and 200 <= r.status < 300]
    lost = [r for r in report.results if not 200 <= r.status < 300]
    killed = [r for r in report.results if r.status in (0, 502)]
    reclaims = [
        d for d in sampled["decisions"] if any("reclaimed" in line for line in d["reasons"])
    ]
    return {
        "reports_requests": len(rs),
        "reports_p50_s": percentile(ok, 0.5),
        "reports_p99_s": percentile(ok, 0.99),
        "reports_over_slo": sum(
            1 for r in rs if not 200 <= r.status < 300 or r.latency_s > args.slo_s
        ),
        "api_requests": sum(1 for r in report.results if r.service == "api"),
        "api_throughput_rps": len(api_ok) / report.duration_s,
        "cpu_utilisation": None if cpu_s is None else cpu_s / (args.budget_cpu * report.duration_s),
        "cpu_utilisation_in_bursts": contention_utilisation(
            sampled["cpu_samples"], burst_windows(args), args.budget_cpu
        ),
        "lost_requests": len(lost),
        "lost_by_status": {
            str(s): sum(1 for r in lost if r.status == s) for s in sorted({r.status for r in lost})
        },
        "killed_in_flight": len(killed),
        "reclaim_decisions": len(reclaims),
        "early_ticks": sampled["early_ticks"],
        "max_replicas": {
            name: max((p[name]["replicas"] for p in sampled["timeline"] if name in p), default=0)
            for name in ("api", "reports")
        },
    }


async def run_mode(
    arbitration: str,
    enforcement: str,
    args: argparse.Namespace,
    workdir: Path,
    iso: Isolation | None,
) -> dict[str, Any]:
    gw = Gateway(
        scenario_config(args, arbitration, enforcement),
        workdir / f"{enforcement}-{arbitration}.yaml",
    )
    try:
        await wait_ready(gw, ["api", "reports"])
        if iso is not None and iso.enabled:
            with contextlib.suppress(OSError):
                iso.weigh(iso.layout.cpu_root / parent_name_for(gw.proc.pid))
        if not any("CPU limits are NOT applied" in line for line in gw.lines):
            applied = True
        else:
            applied = False
            print("  warning: CPU limits are NOT applied on this machine", flush=True)
        streams = [
            Stream("api", "/api/work", concurrency=args.api_clients),
            Stream(
                "reports",
                "/reports/work",
                rps=args.burst_rps,
                burst_s=args.burst_s,
                period_s=args.period_s,
                offset_s=args.first_burst_s,
            ),
        ]
        stop = asyncio.Event()
        t0 = time.monotonic()
        sampler = asyncio.create_task(sample_decisions(gw, stop, t0))
        cpu0 = cpu_usage_s(gw)
        report = await run_load(streams, gw.host, gw.port, args.duration, timeout_s=120)
        cpu1 = cpu_usage_s(gw)
        stop.set()
        sampled = await sampler
    finally:
        code = gw.stop()
        # The scaler's decision lines (one per service whose decision changed, with reasons).
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"shared_budget_live.{enforcement}.{arbitration}.log").write_text(
            "\n".join(line for line in gw.lines if "scaler decision" in line) + "\n"
        )
    cpu_s = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
    summary = summarize(report, sampled, cpu_s, args)
    summary["cpu_limits_applied"] = applied
    summary["gateway_exit_code"] = code
    return {
        "summary": summary,
        "timeline": sampled["timeline"],
        "reports_latency": [
            (r.sent_at_s, r.latency_s, r.status) for r in report.results if r.service == "reports"
        ],
        "api_completions": sorted(
            r.sent_at_s + r.latency_s for r in report.results if r.service == "api"
        ),
    }


def _fmt(value: Any, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "ms":
        return f"{value * 1000:.0f} ms"
    if kind == "pct":
        return f"{value * 100:.0f} %"
    if kind == "f":
        return f"{value:.1f}"
    return str(value)


def table(results: dict[str, dict[str, Any]]) -> str:
    """One enforcement's pair of runs, shared vs independent."""
    shared, indep = results["shared"]["summary"], results["independent"]["summary"]
    rows = [
        ("short-lived p50", "reports_p50_s", "ms"),
        ("short-lived p99", "reports_p99_s", "ms"),
        ("short-lived requests", "reports_requests", ""),
        ("short-lived over SLO", "reports_over_slo", ""),
        ("long-lived throughput (req/s)", "api_throughput_rps", "f"),
        ("CPU used / budget (whole run)", "cpu_utilisation", "pct"),
        ("CPU used / budget (in bursts)", "cpu_utilisation_in_bursts", "pct"),
        ("lost requests", "lost_requests", ""),
        ("killed in flight (502/reset)", "killed_in_flight", ""),
        ("decisions that reclaimed CPU", "reclaim_decisions", ""),
        ("early ticks", "early_ticks", ""),
    ]
    out = _columns(("", "shared", "independent"), rows, shared, indep)
    p_s, p_i = shared["reports_p99_s"], indep["reports_p99_s"]
    lost = shared["lost_requests"] + indep["lost_requests"]
    if p_s and p_i:
        out.append(f"short-lived p99: independent / shared = {p_i / p_s:.1f}x  (goal >= 10x)")
    if indep["api_throughput_rps"]:
        ratio = shared["api_throughput_rps"] / indep["api_throughput_rps"]
        out.append(
            f"long-lived throughput: shared / independent = {ratio * 100:.0f} %  (goal >= 95 %)"
        )
    out.append(f"lost requests, both runs: {lost}  (goal 0)")
    return "\n".join(out)


def enforcement_table(by_enforcement: dict[str, dict[str, dict[str, Any]]]) -> str:
    """Shared arbitration under each enforcement, side by side."""
    share, limit = (by_enforcement[e]["shared"]["summary"] for e in ("share", "limit"))
    rows = [
        ("short-lived p99", "reports_p99_s", "ms"),
        ("short-lived over SLO", "reports_over_slo", ""),
        ("long-lived throughput (req/s)", "api_throughput_rps", "f"),
        ("CPU used / budget (whole run)", "cpu_utilisation", "pct"),
        ("CPU used / budget (in bursts)", "cpu_utilisation_in_bursts", "pct"),
        ("lost requests", "lost_requests", ""),
    ]
    return "\n".join(_columns(("shared arbitration", "share", "limit"), rows, share, limit))


def _columns(
    titles: tuple[str, str, str],
    rows: list[tuple[str, str, str]],
    left: dict[str, Any],
    right: dict[str, Any],
) -> list[str]:
    """Two summaries side by side, one line per (label, key, format) row."""
    first, a, b = titles
    out = [f"{first:<32} {a:>12} {b:>12}"]
    for label, key, kind in rows:
        out.append(f"{label:<32} {_fmt(left[key], kind):>12} {_fmt(right[key], kind):>12}")
    return out


def plot(
    results: dict[str, dict[str, Any]], path: Path, args: argparse.Namespace, enforcement: str
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 2, figsize=(13, 9), sharex=True)
    for col, mode in enumerate(("shared", "independent")):
        data = results[mode]
        tl = data["timeline"]
        ax = axes[0][col]
        for name in ("api", "reports"):
            ax.step(
                [p["t_s"] for p in tl if name in p],
                [p[name]["allocated"] for p in tl if name in p],
                where="post",
                label=f"{name} cores",
            )
        ax.axhline(args.budget_cpu, color="grey", linestyle=":", label="budget")
        ax.set_title(f"{mode}, {enforcement}: CPU allocated (replicas x CPU per replica)")
        ax.legend(loc="upper right", fontsize=8)
        ax = axes[1][col]
        lat = data["reports_latency"]
        ax.scatter([t for t, _, _ in lat], [latency for _, latency, _ in lat], s=3)
        ax.axhline(args.slo_s, color="red", linestyle=":", label="SLO")
        ax.set_yscale("log")
        ax.set_title(f"{mode}: reports latency (s) by send time")
        ax.legend(loc="upper right", fontsize=8)
        ax = axes[2][col]
        done = data["api_completions"]
        bins = list(range(0, int(args.duration) + 6, 5))
        ax.hist(done, bins=bins, weights=[1 / 5] * len(done))
        ax.set_title(f"{mode}: api throughput (req/s, 5 s bins)")
        ax.set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


async def main_async(args: argparse.Namespace) -> int:
    enforcements = ["share", "limit"] if args.enforcement == "both" else [args.enforcement]
    results: dict[str, dict[str, dict[str, Any]]] = {}
    iso = Isolation() if args.isolate else None
    with tempfile.TemporaryDirectory(prefix="sluice-live-") as tmp, iso or contextlib.nullcontext():
        for enforcement in enforcements:
            results[enforcement] = {}
            for mode in ("shared", "independent"):
                print(f"running {mode} ({enforcement}) for {args.duration:g}s ...", flush=True)
                results[enforcement][mode] = await run_mode(mode, enforcement, args, Path(tmp), iso)
    for enforcement in enforcements:
        print(f"budget.enforcement: {enforcement}")
        print(table(results[enforcement]))
    if len(enforcements) == 2:
        print(enforcement_table(results))
    out = {
        "scenario": {
            "budget_cpu": args.budget_cpu,
            "duration_s": args.duration,
            "api_clients": args.api_clients,
            "burst_rps": args.burst_rps,
            "burst_s": args.burst_s,
            "period_s": args.period_s,
            "slo_s": args.slo_s,
            "cpu_ms_per_request": 40,
            "isolated_from_other_processes": bool(iso and iso.enabled),
            "first_burst_s": args.first_burst_s,
            "fixed_size": bool(args.fixed_size),
        },
        "machine": machine(),
        "results": {
            enf: {mode: r["summary"] for mode, r in by_mode.items()}
            for enf, by_mode in results.items()
        },
        "timelines": {
            enf: {mode: r["timeline"] for mode, r in by_mode.items()}
            for enf, by_mode in results.items()
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "shared_budget_live.json").write_text(json.dumps(out, indent=2) + "\n")
    for enforcement in enforcements:
        plot(
            results[enforcement],
            args.out / f"shared_budget_live.{enforcement}.png",
            args,
            enforcement,
        )
    print(f"wrote {args.out / 'shared_budget_live.json'} and the plots")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=150.0, help="seconds of load per mode")
    p.add_argument("--budget-cpu", type=float, default=1.5, help="the shared budget (cores)")
    p.add_argument("--api-clients", type=int, default=8, help="closed-loop clients on api")
    p.add_argument("--burst-rps", type=float, default=20.0, help="reports rate in a burst")
    p.add_argument("--burst-s", type=float, default=10.0, help="length of a burst")
    p.add_argument("--period-s", type=float, default=45.0, help="a burst starts every")
    p.add_argument("--first-burst-s", type=float, default=30.0, help="first burst at")
    p.add_argument("--slo-s", type=float, default=0.5, help="reports latency SLO")
    p.add_argument(
        "--enforcement",
        choices=("share", "limit", "both"),
        default="limit",
        help="budget.enforcement: entitlements as cgroup weights, decided CPU as hard limits, or both",
    )
    p.add_argument(
        "--lending",
        choices=("on", "off"),
        default="on",
        help="budget.lending (limit enforcement, shared run): lend idle quota between ticks",
    )
    p.add_argument(
        "--lend-after-idle-s",
        type=float,
        default=0.02,
        help="budget.lend_after_idle_s: how long a service is idle before its quota is lent",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("live-out"),
        help="directory for the JSON, the plots and the decision logs (default: live-out)",
    )
    p.add_argument(
        "--fixed-size",
        action="store_true",
        help="replicas of one size (cpu.min = cpu.max: api 0.5, reports 0.25 cores) and no "
        "guaranteed_cpu beyond min_replicas x cpu.min",
    )
    p.add_argument(
        "--no-isolate",
        dest="isolate",
        action="store_false",
        help="do not raise the experiment's CPU weight against other processes",
    )
    return asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
