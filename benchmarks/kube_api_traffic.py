"""Kubernetes API traffic of the scaling leader with 10 / 100 / 1,000 scaled services.

    python benchmarks/kube_api_traffic.py [--sizes 10,100,1000] [--steady-s 10]
                                          [--out /tmp/sluice-bench]

Against the fake API server of the tests (``tests/support/fake_kube.py``: real HTTP, the
real ``kubernetes`` client), each size puts N Deployments with 2 pods each, then measures:

* ``polling`` — the actuator without watch caches (what Sluice did before): requests per
  1 s tick, counted over 2 ticks (``current()`` + ``apply()`` of unchanged decisions);
* ``sluice`` — the platform's actuator with watch caches of Deployments, StatefulSets and
  Pods, plus the Lease elector renewing every 2 s: requests per second over ``--steady-s``
  seconds of wall time with one tick per second, nothing changing;
* ``informer budget`` — what a client-go controller with three informers and a Lease costs in
  the same steady state: one watch per informer per 5-10 min (client-go's random watch
  timeout, 450 s on average) and one Lease update per 2 s retry period (the renewal fast
  path): ~0.507 requests/s, whatever N;
* ``tick ms`` — the CPU time of one steady tick (``current()`` + ``apply()``) read from the
  caches (median);
* ``writes per change`` — after the steady window, 10 % of the services get a new replica
  count; the ``/scale`` patches and all writes (patches and their Events) made over 3 ticks,
  per change;
* ``pod metrics`` — reported apart from the informer budget: the ``metrics.k8s.io``
  PodMetrics lists the leader makes per 15 s poll for every managed service's CPU use (one
  per namespace: here all services share one), against what the HPA controller makes for
  the same services each with a CPU-utilisation HPA (one PodMetrics list per HPA object per
  15 s sync period: N / 15 s). PodMetrics cannot be watched (metrics-server serves no watch), so both
  poll; ``poll ms`` is the wall time of one poll (list + parse), ``fill ms 1st`` the CPU
  time of filling N services' signals right after a poll and ``fill ms`` on the other ticks
  (the figures are reused until the next poll or a pod change).

It prints a table with the ratios and writes JSON to ``--out`` (outside the tracked files).
A benchmark, not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.platforms.kubernetes.actuator import KubernetesActuator  # noqa: E402
from gateway.platforms.kubernetes.api import KubeApi  # noqa: E402
from gateway.platforms.kubernetes.cache import WorkloadCache  # noqa: E402
from gateway.platforms.kubernetes.leader import LeaderElector  # noqa: E402
from gateway.platforms.kubernetes.model import Workload  # noqa: E402
from gateway.platforms.kubernetes.pod_metrics import PodMetricsSource  # noqa: E402
from scaler.decision import Decision  # noqa: E402
from scaler.signals import ServiceSignals  # noqa: E402
from tests.support.fake_kube import FakeKube  # noqa: E402
from tests.support.kube_objects import deployment, pod  # noqa: E402

INFORMERS = 3
INFORMER_WATCH_S = 450.0  # client-go: a random watch timeout between 5 and 10 minutes
LEASE_RETRY_S = 2.0
INFORMER_BUDGET = INFORMERS / INFORMER_WATCH_S + 1 / LEASE_RETRY_S
RES = {"requests": {"cpu": "500m"}, "limits": {"cpu": "500m"}}
POD_METRICS_INTERVAL_S = 15.0  # metrics-server's resolution, the HPA controller's sync period
POD_METRICS_POLLS = 3


def decisions(targets: dict[str, Workload], replicas: dict[str, int]) -> dict[str, Decision]:
    return {s: Decision(s, 0.0, replicas[s], 0.5, 0.5 * replicas[s], "stable") for s in targets}


def api_requests(fake: FakeKube, since: int) -> int:
    return len(fake.requests) - since


async def measure(n: int, steady_s: float) -> dict[str, float]:
    with FakeKube(bookmark_interval_s=60.0) as fake:
        targets = {}
        for i in range(n):
            name = f"svc{i}"
            fake.put(deployment(name, 2))
            for r in range(2):
                fake.put(pod(f"{name}-{r}", name, RES))
            targets[f"shop/{name}"] = Workload("Deployment", "shop", name)
        replicas = dict.fromkeys(targets, 2)
        api = KubeApi.connect(host=fake.url, max_concurrency=4)
        try:
            # before: polling the API every tick
            polling = KubernetesActuator(api, lambda: targets)
            start = len(fake.requests)
            for _ in range(2):
                await polling.current()
                await polling.apply(decisions(targets, replicas))
            polling_per_tick = api_requests(fake, start) / 2

            # now: watch caches + Lease renewals, one tick per second
            elector = LeaderElector(api, "sluice", "sluice-scaler", "gw-a")
            cache = WorkloadCache(api)
            cache.start()
            while not cache.synced():
                await asyncio.sleep(0.05)
            act = KubernetesActuator(api, lambda: targets, leader=elector, cache=cache)
            elect = asyncio.create_task(elector.run())
            while not elector.is_leader():
                await asyncio.sleep(0.05)
            await act.current()
            await act.apply(decisions(targets, replicas))
            start, t0 = len(fake.requests), time.monotonic()
            ticks = 0
            tick_ms = []
            while time.monotonic() - t0 < steady_s:
                c0 = time.thread_time()
                await act.current()
                await act.apply(decisions(targets, replicas))
                tick_ms.append((time.thread_time() - c0) * 1000)
                ticks += 1
                await asyncio.sleep(max(0.0, t0 + ticks - time.monotonic()))
            elapsed = time.monotonic() - t0
            steady_rps = api_requests(fake, start) / elapsed

            # changes: 10 % of the services get one more replica; 3 ticks
            changed = list(targets)[::10] or list(targets)[:1]
            for s in changed:
                replicas[s] = 3
            idx = len(fake.requests)
            for _ in range(3):
                await act.current()
                await act.apply(decisions(targets, replicas))
                await asyncio.sleep(0.2)
            made = [
                c
                for c in fake.requests[idx:]
                if c.verb in ("patch", "create", "update") and c.resource != "leases"
            ]
            writes = len(made)
            scale_patches = sum(1 for c in made if c.resource == "deployments/scale")
            # every service's CPU use: metrics.k8s.io PodMetrics, one list per namespace per poll
            fake.metrics_server = "up"
            fake.pod_cpu = {
                ("shop", f"{w.name}-{r}"): {"app": "100m"}
                for w in targets.values()
                for r in range(2)
            }
            source = PodMetricsSource(
                api,
                cache,
                lambda: targets,
                lambda: list(targets),
                interval_s=POD_METRICS_INTERVAL_S,
                is_leader=elector.is_leader,
            )
            idx, poll_ms = len(fake.requests), []
            for _ in range(POD_METRICS_POLLS):
                w0 = time.monotonic()
                assert await source.poll()
                poll_ms.append((time.monotonic() - w0) * 1000)
            metrics_lists = sum(1 for c in fake.requests[idx:] if c.api_group == "metrics.k8s.io")
            per_poll = metrics_lists / POD_METRICS_POLLS
            fill_ms = []  # the first right after a poll (recomputed), then steady (reused)
            for t in range(5):
                sigs = {s: ServiceSignals(s, float(t)) for s in targets}
                c0 = time.thread_time()
                filled = source.add_cpu_signals(sigs)
                fill_ms.append((time.thread_time() - c0) * 1000)
            assert all(f.cpu_seconds_total is not None for f in filled.values())
            lost = not elector.is_leader()
            elect.cancel()
            await asyncio.gather(elect, return_exceptions=True)
        finally:
            await api.close()
    return {
        "services": n,
        "polling_requests_per_s": polling_per_tick,
        "sluice_requests_per_s": steady_rps,
        "informer_budget_requests_per_s": INFORMER_BUDGET,
        "steady_window_s": elapsed,
        "changes": len(changed),
        "writes_per_change": writes / len(changed),
        "scale_patches_per_change": scale_patches / len(changed),
        "scale_patches": scale_patches,
        "leadership_lost": lost,
        "tick_ms_median": statistics.median(tick_ms),
        "pod_metrics_lists_per_poll": per_poll,
        "pod_metrics_requests_per_s": per_poll / POD_METRICS_INTERVAL_S,
        "hpa_controller_pod_metrics_requests_per_s": n / POD_METRICS_INTERVAL_S,
        "pod_metrics_poll_ms_median": statistics.median(poll_ms),
        "pod_metrics_fill_ms_after_poll": fill_ms[0],
        "pod_metrics_fill_ms_median": statistics.median(fill_ms[1:]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10,100,1000")
    ap.add_argument("--steady-s", type=float, default=10.0)
    ap.add_argument("--out", default="/tmp/sluice-bench")
    args = ap.parse_args()
    rows = [asyncio.run(measure(int(n), args.steady_s)) for n in args.sizes.split(",")]
    print(
        f"{'services':>8} {'polling req/s':>14} {'sluice req/s':>13} {'budget req/s':>13} "
        f"{'sluice/budget':>14} {'polling/sluice':>15} {'patches/change':>15} "
        f"{'writes/change':>14} {'tick ms':>8} {'lead lost':>9}"
    )
    for r in rows:
        print(
            f"{r['services']:>8} {r['polling_requests_per_s']:>14.1f} "
            f"{r['sluice_requests_per_s']:>13.3f} {r['informer_budget_requests_per_s']:>13.3f} "
            f"{r['sluice_requests_per_s'] / r['informer_budget_requests_per_s']:>14.2f} "
            f"{r['polling_requests_per_s'] / max(r['sluice_requests_per_s'], 1e-9):>15.0f} "
            f"{r['scale_patches_per_change']:>15.2f} {r['writes_per_change']:>14.2f} "
            f"{r['tick_ms_median']:>8.1f} {r['leadership_lost']!s:>9}"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"kube-api-traffic-{time.strftime('%Y-%m-%dT%H%MZ', time.gmtime())}.json"
    path.write_text(
        json.dumps(
            {
                "machine": platform.platform(),
                "cpus": os.cpu_count(),
                "load": os.getloadavg(),
                "rows": rows,
            },
            indent=2,
        )
    )
    print()
    print(
        f"{'services':>8} {'podmetrics req/s':>17} {'hpa ctrl req/s':>15} {'hpa/sluice':>11} "
        f"{'poll ms':>8} {'fill ms 1st':>12} {'fill ms':>8}   (metrics.k8s.io, apart from "
        "the informer budget)"
    )
    for r in rows:
        print(
            f"{r['services']:>8} {r['pod_metrics_requests_per_s']:>17.3f} "
            f"{r['hpa_controller_pod_metrics_requests_per_s']:>15.3f} "
            f"{r['hpa_controller_pod_metrics_requests_per_s'] / r['pod_metrics_requests_per_s']:>11.0f} "
            f"{r['pod_metrics_poll_ms_median']:>8.1f} {r['pod_metrics_fill_ms_after_poll']:>12.2f} "
            f"{r['pod_metrics_fill_ms_median']:>8.2f}"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
