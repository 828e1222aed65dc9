"""How long one scaler tick takes for 100 / 1,000 / 10,000 services (goal: <= 5 ms for 1,000).

    python benchmarks/scaler_tick.py [--repeats 40] [--sizes 100,1000,10000] [--out FILE]
                                     [--hpa-percent 20] [--enforcement limit|share]

Each size runs a closed loop (the decisions are fed back as the platform's state) with a
realistic mix: 20 % of the services in HPA mode (``--hpa-percent``), CPU measured (usage and throttling
counters) on half of them, and each tick 5 % of the services with missing or stale signals;
loads drift, jump and burst.  After a warm-up that fills the windows it times, per tick
(median over the repeats):

* ``sluice shared``      — ``Engine.tick`` with shared-budget arbitration (the default), on
  ``--enforcement`` (default ``limit``; ``share`` adds the rules that apply when the budget is
  the whole machine, what ``auto`` resolves to on a local machine);
* ``sluice independent`` — the same engine with ``arbitration: independent``;
* ``+ read reasons``     — a shared tick plus rendering every decision's reasons (they are
  rendered lazily, so this is the cost when something reads them all);
* ``naive peer``         — a straightforward per-service implementation written here for
  comparison: one object per service, windows as lists summed every tick, a KPA-style
  decision and first-come-first-served budget, the way one would write it first.

Both CPU time (``time.thread_time``, what the tick costs; robust to other processes on a
shared machine) and wall time are reported; the ratio and the goal use CPU time.  It prints a
table with the ratio peer / sluice and writes JSON (with the machine and its load) to
``--out`` (default ``/tmp/sluice-bench/scaler_tick.json``, outside the repository; it never
writes a tracked results file unless told to).  A benchmark, not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from scaler.decision import Decision, ServiceState  # noqa: E402
from scaler.engine import Engine  # noqa: E402
from scaler.policy import BudgetConfig, ScalingPolicy  # noqa: E402
from scaler.signals import ServiceSignals  # noqa: E402

WARMUP_TICKS = 70


def make_policies(n: int, seed: int, hpa_percent: int = 20) -> dict[str, ScalingPolicy]:
    rnd = random.Random(seed)
    every = round(100 / hpa_percent) if hpa_percent else 0
    return {
        f"svc-{i}": ScalingPolicy(
            target=rnd.choice([5.0, 10.0, 20.0]),
            min_replicas=rnd.choice([0, 1, 1, 2]),
            max_replicas=rnd.choice([4, 8, 16]),
            cpu={"min": 0.05, "max": 1.0, "request": 0.1},
            weight=rnd.choice([1.0, 1.0, 2.0]),
            metric=rnd.choice(["concurrency", "concurrency", "rps"]),
            mode="hpa" if every and i % every == 0 else "kpa",
        )
        for i in range(n)
    }


class Workload:
    """Per-service load levels that drift, jump now and then, and burst."""

    def __init__(self, names: list[str], seed: int) -> None:
        self.rnd = random.Random(seed)
        self.names = names
        self.level = {name: self.rnd.uniform(0, 60) for name in names}
        self.arrivals = dict.fromkeys(names, 0)
        self.measured = {name: i % 2 == 1 for i, name in enumerate(names)}
        self.cpu_s = dict.fromkeys(names, 0.0)
        self.throttled_s = dict.fromkeys(names, 0.0)

    def signals(self, now: float) -> dict[str, ServiceSignals]:
        out = {}
        rnd = self.rnd
        for name in self.names:
            if rnd.random() < 0.05:
                self.level[name] = rnd.choice([0.0, rnd.uniform(0, 20), rnd.uniform(20, 150)])
            load = self.level[name] * rnd.uniform(0.9, 1.1)
            self.arrivals[name] += int(load * 3)
            cpu = throttled = None
            if self.measured[name]:
                self.cpu_s[name] += load * 0.01
                self.throttled_s[name] += max(0.0, load - 100) * 0.001
                cpu, throttled = self.cpu_s[name], self.throttled_s[name]
            roll = rnd.random()
            if roll < 0.025:
                continue  # missing this tick
            at = now - 10.0 if roll < 0.05 else now  # stale
            out[name] = ServiceSignals(
                name,
                at,
                in_flight=int(load),
                queued=0,
                arrivals_total=self.arrivals[name],
                cpu_seconds_total=cpu,
                cpu_throttled_seconds_total=throttled,
            )
        return out


def applied(decisions: dict[str, Decision]) -> dict[str, ServiceState]:
    return {
        n: ServiceState(n, d.replicas, d.replicas, d.cpu_per_replica_cores)
        for n, d in decisions.items()
    }


class NaiveService:
    """The peer: the obvious per-service code (lists for windows, summed each tick)."""

    def __init__(self, policy: ScalingPolicy) -> None:
        self.policy = policy
        self.stable: deque[tuple[float, float]] = deque()
        self.panic: deque[tuple[float, float]] = deque()
        self.panic_until = -math.inf
        self.max_panic = 0
        self.prev_arrivals: tuple[float, int] | None = None

    def desired(self, now: float, sig: ServiceSignals, ready: int) -> int:
        p = self.policy
        if p.metric == "rps":
            prev = self.prev_arrivals
            value = (
                (sig.arrivals_total - prev[1]) / (now - prev[0]) if prev and now > prev[0] else 0.0
            )
            self.prev_arrivals = (now, sig.arrivals_total)
        else:
            value = float(sig.in_flight + sig.queued)
        for window, length in ((self.stable, p.stable_window_s), (self.panic, p.panic_window_s)):
            window.append((now, value))
            while window and window[0][0] <= now - length:
                window.popleft()
        stable = sum(v for _, v in self.stable) / len(self.stable)
        panic = sum(v for _, v in self.panic) / len(self.panic)
        tv = p.target * p.target_utilization
        ready_f = max(1, ready)
        want_s = math.ceil(stable / tv)
        want_p = math.ceil(panic / tv)
        up = math.ceil(p.max_scale_up_rate * ready_f)
        down = math.floor(ready_f / p.max_scale_down_rate)
        want_s = min(max(want_s, down), up)
        want_p = min(max(want_p, down), up)
        if want_p / ready_f >= p.panic_threshold:
            self.panic_until = now + p.stable_window_s
        if now <= self.panic_until:
            self.max_panic = max(self.max_panic, want_s, want_p)
            want = self.max_panic
        else:
            self.max_panic = 0
            want = want_s
        return min(max(want, p.min_replicas), p.max_replicas)


class NaivePeer:
    def __init__(self, policies: dict[str, ScalingPolicy], budget_cpu: float) -> None:
        self.services = {name: NaiveService(p) for name, p in policies.items()}
        self.budget = budget_cpu

    def tick(
        self, now: float, signals: dict[str, ServiceSignals], states: dict[str, ServiceState]
    ) -> dict[str, Decision]:
        free = self.budget
        out = {}
        for name, svc in self.services.items():
            state = states.get(name)
            ready = state.ready_replicas if state else 0
            sig = signals.get(name)
            if sig is None:
                want = state.replicas if state else svc.policy.min_replicas
            else:
                want = svc.desired(now, sig, ready)
            cpu = svc.policy.cpu.initial_cores
            fit = min(want, int(free / cpu))
            replicas = max(fit, svc.policy.min_replicas)
            free -= replicas * cpu
            out[name] = Decision(
                name, now, replicas, cpu, replicas * cpu, "naive", (f"wanted {want}, got {fit}",)
            )
        return out


def time_loop(
    tick, n: int, seed: int, repeats: int, read_reasons: bool = False
) -> tuple[float, float]:
    """Median (wall ms, CPU ms) per tick after the warm-up."""
    names = [f"svc-{i}" for i in range(n)]
    load = Workload(names, seed)
    states: dict[str, ServiceState] = {}
    wall = []
    cpu = []
    for t in range(WARMUP_TICKS + repeats):
        signals = load.signals(float(t))
        start_cpu = time.thread_time()
        start = time.perf_counter()
        decisions = tick(float(t), signals, states)
        if read_reasons:
            for d in decisions.values():
                _ = d.reasons
        elapsed = time.perf_counter() - start
        elapsed_cpu = time.thread_time() - start_cpu
        if t >= WARMUP_TICKS:
            wall.append(elapsed)
            cpu.append(elapsed_cpu)
        states = applied(decisions)
    return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3


def machine() -> dict[str, object]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": model or platform.processor(),
        "cores": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--sizes", default="100,1000,10000")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--hpa-percent",
        type=int,
        default=20,
        choices=[0, 10, 20, 50, 100],
        help="share of the services in HPA mode (default 20, the issue's mix; 0: KPA only)",
    )
    ap.add_argument(
        "--enforcement",
        default="limit",
        choices=["limit", "share"],
        help="budget.enforcement of the shared engines (default limit)",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=Path("/tmp/sluice-bench/scaler_tick.json"),
        help="JSON results file (default outside the repository)",
    )
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for n in sizes:
        policies = make_policies(n, args.seed, args.hpa_percent)
        budget_cpu = 0.5 * n

        shared_budget = BudgetConfig(
            cpu=budget_cpu, arbitration="shared", enforcement=args.enforcement
        )
        shared = Engine(policies, shared_budget)
        independent = Engine(policies, BudgetConfig(cpu=budget_cpu, arbitration="independent"))
        reading = Engine(policies, shared_budget)
        peer = NaivePeer(policies, budget_cpu)
        row: dict[str, float] = {"services": n}
        for key, tick, read in (
            ("sluice_shared", shared.tick, False),
            ("sluice_independent", independent.tick, False),
            ("sluice_shared_read_reasons", reading.tick, True),
            ("naive_peer", peer.tick, False),
        ):
            wall_ms, cpu_ms = time_loop(tick, n, args.seed, args.repeats, read_reasons=read)
            row[f"{key}_ms"] = wall_ms
            row[f"{key}_cpu_ms"] = cpu_ms
        row["peer_over_sluice"] = row["naive_peer_cpu_ms"] / row["sluice_shared_cpu_ms"]
        rows.append(row)
    header = (
        f"{'services':>8} | {'sluice shared':>15} | {'independent':>15} | {'+ read reasons':>15} | "
        f"{'naive peer':>15} | {'peer/sluice':>11}"
    )
    print("scaler tick, median per tick: CPU ms (wall ms)")
    print(header)
    print("-" * len(header))

    def cell(r: dict[str, float], key: str) -> str:
        return f"{r[key + '_cpu_ms']:7.2f} ({r[key + '_ms']:5.2f})"

    for r in rows:
        print(
            f"{int(r['services']):>8} | {cell(r, 'sluice_shared'):>15} | "
            f"{cell(r, 'sluice_independent'):>15} | {cell(r, 'sluice_shared_read_reasons'):>15} | "
            f"{cell(r, 'naive_peer'):>15} | {r['peer_over_sluice']:>10.1f}×"
        )
    goal = next((r for r in rows if r["services"] == 1000), None)
    if goal is not None:
        verdict = "met" if goal["sluice_shared_cpu_ms"] <= 5.0 else "NOT met"
        if args.hpa_percent != 20:
            verdict += f" (with {args.hpa_percent} % HPA mode, not the issue's 20 %)"
        print(
            f"goal <= 5 ms for 1,000 services: {verdict} ({goal['sluice_shared_cpu_ms']:.2f} ms CPU, "
            f"{goal['sluice_shared_ms']:.2f} ms wall)"
        )
    info = machine()
    print(
        f"machine: {info['cpu']}, {info['cores']} cores, load {info['load_average_1m']}, "
        f"Python {info['python']}, numpy {info['numpy']}"
    )
    path = args.out
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "benchmark": "scaler_tick",
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "repeats": args.repeats,
                "mix": f"{args.hpa_percent} % HPA mode, CPU measured on half, 5 % missing or stale per tick",
                "warmup_ticks": WARMUP_TICKS,
                "enforcement": args.enforcement,
                "machine": info,
                "results": rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
