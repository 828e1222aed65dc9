"""Early ticks: a burst reaching a decision's wake level ticks the scaler at once."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import httpx

from tests.support.processes import gateway, upstreams
from tests.support.procs import wait_until


def config(endpoints: list[str], early_ticks: bool) -> dict[str, object]:
    return {
        "platform": "static",
        "budget": {"cpu": 2, "early_ticks": early_ticks},
        "services": {
            "api": {
                "routes": [{"path": "/"}],
                "endpoints": endpoints,
                # idle at cpu.min 0.1 = 0.4 replicas' worth of target 2 × 0.7: the wake level
                # is ceil(2 × 1.4 × 0.4) = 2 requests in flight
                "scaling": {
                    "target": 2,
                    "min_replicas": 1,
                    "max_replicas": 4,
                    "cpu": {"min": 0.1, "max": 1, "request": 0.25},
                },
            }
        },
    }


def burst(url: str, n: int) -> list[int]:
    """``n`` requests at once, each held 0.5 s by the upstream."""
    with (
        httpx.Client(base_url=url, timeout=10) as client,
        concurrent.futures.ThreadPoolExecutor(n) as pool,
    ):
        return list(pool.map(lambda _: client.get("/hold?s=0.5").status_code, range(n)))


def test_a_burst_over_the_wake_level_ticks_early_and_the_switch_turns_it_off(
    tmp_path: Path,
) -> None:
    with upstreams("e1") as ups:
        for early in (True, False):
            cfg = config([ups[0].address], early)
            with gateway(cfg, tmp_path / f"early-{early}.yaml") as g:
                admin = httpx.Client(base_url=g.admin_url, timeout=10)
                assert wait_until(lambda c=admin: c.get("/api/decisions").json()["ticks"] >= 2)
                if early:
                    latest = admin.get("/api/decisions").json()["latest"]["api"]
                    assert latest["wake_concurrency"] == 2
                assert burst(g.url, 6) == [200] * 6
                body = admin.get("/api/decisions").json()
                if early:
                    assert body["early_ticks"] >= 1
                    # the early tick saw the burst: its decision raised api's CPU in place
                    assert any(d["cpu_per_replica_cores"] > 0.1 for d in body["recent"])
                else:
                    assert body["early_ticks"] == 0
                admin.close()
