"""Check that the engine decides exactly as another revision's engine on the same inputs.

    python benchmarks/engine_equivalence.py [--against REV] [--quick]

For performance work on ``scaler/engine.py``, ``kpa_batch.py``, ``budget.py``, ``explain.py``:
such changes must not change a single decision.  This records the engine's inputs (``now``,
signals, states, tick after tick) from

* the seed scenario in the simulator, Sluice (early ticks on) and ``independent``;
* the simulator's speed scenario (10 services, early ticks on);
* random closed loops: 1 to 60 services with random policies (KPA/HPA, concurrency/rps,
  vertical/horizontal, scale to zero, weights, floors), irregular tick times (early ticks),
  missing and stale signals, blocked resizes, with and without measured CPU;

then replays them through this tree's ``scaler`` and ``REV``'s (``git archive``, default
``main``) in separate processes and compares every decision: replicas, CPU, allocation, rule,
frozen, wake level (floats bit for bit), and the rendered reasons and inputs.  Exit 1 on the
first difference (printed).
"""

from __future__ import annotations

import argparse
import pickle
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

Stream = dict[str, Any]
"""name, policies (dumped), budget (dumped), steps: [(now, [signal tuples], [state tuples])]."""

_SIGNAL_FIELDS = (
    "service",
    "at",
    "in_flight",
    "queued",
    "arrivals_total",
    "completions_total",
    "errors_total",
    "rps",
    "latency_p50_s",
    "latency_p99_s",
    "ready_replicas",
    "cpu_seconds_total",
    "cpu_throttled_seconds_total",
)
_STATE_FIELDS = ("service", "replicas", "ready_replicas", "cpu_per_replica_cores", "resize_blocked")


# ---- recording (this tree) ------------------------------------------------------------------


def _dump_step(now: float, signals: Any, states: Any) -> tuple[float, list[Any], list[Any]]:
    sig = [tuple(getattr(s, f) for f in _SIGNAL_FIELDS) for s in signals.values()]
    st = [tuple(getattr(s, f) for f in _STATE_FIELDS) for s in states.values()]
    return now, sig, st


def _simulated(name: str, run_name: str, duration_s: float, speed: bool) -> Stream:
    sys.path.insert(0, str(ROOT))
    from scaler.simulate.baselines import EngineController
    from scaler.simulate.runner import build_scenario, run

    if speed:
        from benchmarks.shared_budget_sim import speed_scenario

        workload, policies, budget = speed_scenario()
    else:
        from benchmarks.shared_budget_sim import seed_config

        workload, policies, budget = seed_config()
    scenario = build_scenario(workload, policies, duration_s=duration_s)
    arbitration = "independent" if run_name == "independent" else "shared"
    budget = budget.model_copy(update={"arbitration": arbitration})
    ctl = EngineController(run_name, policies, budget)  # type: ignore[arg-type]
    steps: list[Any] = []
    tick = ctl.engine.tick

    def recording_tick(now: float, signals: Any, states: Any) -> Any:
        steps.append(_dump_step(now, signals, states))
        return tick(now, signals, states)

    ctl.engine.tick = recording_tick  # type: ignore[method-assign]
    run(scenario, run_name, policies, budget, controller=ctl)  # type: ignore[arg-type]
    return {
        "name": name,
        "policies": {s: p.model_dump() for s, p in policies.items()},
        "budget": budget.model_dump(),
        "steps": steps,
    }


def _random_stream(seed: int, services: int, ticks: int) -> Stream:
    import random

    from scaler.engine import Engine
    from tests.support.random_loops import RandomLoad, random_budget, random_policy

    rnd = random.Random(seed)
    pols = {f"s{i}": random_policy(rnd) for i in range(services)}
    budget = random_budget(rnd, pols)
    load = RandomLoad(rnd, pols, measured=rnd.random() < 0.6)
    engine = Engine(pols, budget)
    steps: list[Any] = []
    now = 0.0
    for _ in range(ticks):
        # regular ticks with early ones between them, as the gateway's loop runs them
        now = round(now + rnd.choice([1.0, 1.0, 1.0, 0.1, 0.25, 0.7]), 6)
        signals, states = load.tick(now)
        steps.append(_dump_step(now, signals, states))
        load.applied(engine.tick(now, signals, states))
    return {
        "name": f"random-{seed}-{services}svc",
        "policies": {s: p.model_dump() for s, p in pols.items()},
        "budget": budget.model_dump(),
        "steps": steps,
    }


def record(quick: bool) -> list[Stream]:
    sys.path.insert(0, str(ROOT))
    duration = 600.0 if quick else 3600.0
    streams = [
        _simulated("seed-sluice", "sluice", duration, speed=False),
        _simulated("seed-independent", "independent", duration, speed=False),
        _simulated("speed-10svc", "sluice", 300.0 if quick else 900.0, speed=True),
    ]
    sizes = [1, 2, 3, 5, 8, 10, 13, 20, 40, 60]
    for seed, n in enumerate(sizes[::3] if quick else sizes):
        streams.append(_random_stream(seed, n, 150 if quick else 400))
    return streams


# ---- replaying (any tree: imports only ``scaler``) ----------------------------------------------


def _f(x: Any) -> Any:
    return float(x).hex() if isinstance(x, float) else x


def replay(streams_path: Path, out_path: Path) -> None:
    from scaler.decision import ServiceState
    from scaler.engine import Engine
    from scaler.policy import BudgetConfig, ScalingPolicy
    from scaler.signals import ServiceSignals

    streams: list[Stream] = pickle.loads(streams_path.read_bytes())
    out: dict[str, list[Any]] = {}
    for stream in streams:
        pols = {s: ScalingPolicy.model_validate(p) for s, p in stream["policies"].items()}
        engine = Engine(pols, BudgetConfig.model_validate(stream["budget"]))
        rows: list[Any] = []
        for now, sigs, sts in stream["steps"]:
            signals = {x[0]: ServiceSignals(*x) for x in sigs}
            states = {x[0]: ServiceState(*x) for x in sts}
            for d in engine.tick(now, signals, states).values():
                rows.append(
                    (
                        d.service,
                        _f(d.at),
                        d.replicas,
                        _f(d.cpu_per_replica_cores),
                        _f(d.allocated_cores),
                        d.rule,
                        d.frozen,
                        _f(d.wake_concurrency),
                        tuple(d.reasons),
                        tuple(sorted((k, _f(v)) for k, v in d.inputs.items())),
                    )
                )
        out[stream["name"]] = rows
    out_path.write_bytes(pickle.dumps(out))


# ---- driving ----------------------------------------------------------------------------------


def _tree_of(rev: str, into: Path) -> Path:
    """``rev``'s ``scaler`` package, extracted under ``into``."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", rev, "scaler"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def _replay_in(tree: Path, streams: Path, out: Path) -> dict[str, list[Any]]:
    subprocess.run(
        [sys.executable, __file__, "--replay", str(tree), str(streams), str(out)],
        check=True,
        cwd=tree,
    )
    result: dict[str, list[Any]] = pickle.loads(out.read_bytes())
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="main", help="git revision to compare with")
    parser.add_argument("--quick", action="store_true", help="shorter streams")
    parser.add_argument(
        "--replay", nargs=3, metavar=("TREE", "STREAMS", "OUT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.replay:
        tree, streams, out = (Path(x) for x in args.replay)
        sys.path.insert(0, str(tree))
        replay(streams, out)
        return 0
    started = time.perf_counter()
    streams = record(args.quick)
    ticks = sum(len(s["steps"]) for s in streams)
    print(
        f"recorded {len(streams)} input streams, {ticks} ticks, in {time.perf_counter() - started:.1f} s"
    )
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        path = work / "streams.pickle"
        path.write_bytes(pickle.dumps(streams))
        old_tree = _tree_of(args.against, work / "old")
        old = _replay_in(old_tree, path, work / "old.pickle")
        new = _replay_in(ROOT, path, work / "new.pickle")
    decisions = 0
    for stream in streams:
        name = stream["name"]
        a, b = old[name], new[name]
        decisions += len(a)
        if a != b:
            first = (
                next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
                if len(a) == len(b)
                else min(len(a), len(b))
            )
            print(f"{name}: DIFFERENT from {args.against} at decision {first}")
            if first < min(len(a), len(b)):
                print(f"  {args.against}: {a[first]}")
                print(f"  this tree: {b[first]}")
            return 1
        print(f"{name}: {len(a)} decisions identical")
    print(f"all {decisions} decisions identical to {args.against}'s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
