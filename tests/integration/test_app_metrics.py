"""``scaling.metrics`` app metrics end to end on the static platform: a real upstream's
``X-Active-Users`` header drives the decided replicas through the issue's steps table, and
``POST /api/metrics/<service>`` feeds a pushed metric (token-protected, 400 on a bad body);
on the local platform the same header starts and stops real replicas."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gateway.tools.top import fetch, last_reason
from tests.support.localpool import REPLICA_USER_FIELDS, ROOT, needs_cgroups
from tests.support.processes import gateway, upstreams
from tests.support.procs import wait_until

TOKEN = "t" * 40
AUTH = {"Authorization": f"Bearer {TOKEN}"}
STEPS = {
    "type": "app",
    "name": "active_users",
    "source": {"header": "X-Active-Users", "aggregate": "max"},
    "steps": [{"below": 1000, "replicas": 2}, {"below": 10000, "replicas": 3}],
    "then": {"every": 20000, "add": 1},
    "window_s": 1,
    "stabilization_window_s": 0,
}
SCALING: dict[str, Any] = {
    "prefer": "horizontal",
    "min_replicas": 1,
    "max_replicas": 10,
    "cpu": {"min": 0.1, "max": 0.1},
    # The metrics' answers are under test, down too: no warm replicas kept after a peak.
    "scale_down_delay_s": 0,
}


def latest(admin: httpx.Client, service: str) -> dict[str, Any]:
    body = admin.get("/api/decisions", params={"service": service}).json()
    return body["latest"].get(service) or {}


def send(client: httpx.Client, users: str, n: int = 4) -> None:
    for _ in range(n):  # bounded: a few requests, each answered at once
        assert client.get("/headers", params={"h": f"X-Active-Users:{users}"}).status_code == 200


def decided(admin: httpx.Client, client: httpx.Client, users: str, replicas: int) -> bool:
    """Keep the value fresh until the decision reaches ``replicas`` (bounded by the caller)."""
    send(client, users, 1)
    d = latest(admin, "api")
    return d.get("replicas") == replicas and (d.get("metrics") or {}).get("winner") == (
        "active_users"
    )


def test_an_upstreams_header_and_a_push_drive_the_decided_replicas(tmp_path: Path) -> None:
    with upstreams("a1", "a2") as ups:
        cfg = {
            "platform": "static",
            "admin": {"host": "127.0.0.1", "port": 0, "token": TOKEN},
            "budget": {"cpu": 4},
            "services": {
                "api": {
                    "routes": [{"path": "/"}],
                    "endpoints": [u.address for u in ups],
                    "scaling": {**SCALING, "metrics": [STEPS]},
                },
                "worker": {
                    "routes": [{"path": "/worker"}],
                    "endpoints": [ups[0].address],
                    "scaling": {
                        **SCALING,
                        "metrics": [
                            {"type": "concurrency", "target": 10},
                            {
                                "type": "app",
                                "name": "queue_length",
                                "source": {"push": True},
                                "target": 100,
                                "window_s": 1,
                                "stabilization_window_s": 0,
                            },
                        ],
                    },
                },
            },
        }
        with gateway(cfg, tmp_path / "metrics.yaml") as g:
            admin = httpx.Client(base_url=g.admin_url, timeout=10, headers=AUTH)
            client = httpx.Client(base_url=g.url, timeout=10)

            # 15,000 active users: the table's 10,000-29,999 row -> 3 replicas
            assert wait_until(lambda: decided(admin, client, "15000", 3), timeout_s=30)
            d = latest(admin, "api")
            answers = {a["name"]: a for a in d["metrics"]["answers"]}
            assert answers["active_users"]["value"] == 15000
            assert answers["active_users"]["replicas"] == 3
            assert "concurrency" not in answers  # not listed: only the app metric decides
            assert any("active_users wins with 3 replicas" in r for r in d["reasons"])
            # 30,000: one more step -> 4
            assert wait_until(lambda: decided(admin, client, "30000", 4), timeout_s=30)
            # 999: the first row -> 2
            assert wait_until(lambda: decided(admin, client, "999", 2), timeout_s=30)

            # a malformed value is ignored and counted; the last good one still counts
            send(client, "lots")
            metrics = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(admin.get("/metrics").text)
                for s in f.samples
            }
            key = (("metric", "active_users"), ("service", "api"))
            assert metrics[("sluice_app_metric_malformed_total", key)] >= 1
            assert metrics[("sluice_scaler_metric_replicas", key)] == 2
            assert metrics[("sluice_scaler_metric_won", key)] == 1

            # sluice top names the winner and each metric's answer
            snapshot = fetch(g.admin_url, TOKEN)
            cell = last_reason(snapshot["decisions"]["latest"]["api"])
            assert "active_users won: 2 (active_users 2)" in cell

            # the push endpoint: token-protected, 400 on a bad body, then it drives 'worker'
            push = "/api/metrics/worker"
            anon = httpx.post(g.admin_url + push, json={"name": "queue_length", "value": 1})
            assert anon.status_code == 401
            for body, problem in [
                (b"not json", "must be JSON"),
                (b"[1]", "must be a JSON object"),
                (b'{"name": "queue_length"}', "value: must be a number"),
                (b'{"name": "queue_length", "value": -1}', "value: must be finite and >= 0"),
                (b'{"name": "queue_length", "value": 1, "x": 2}', "x: unknown key"),
                (b'{"name": "nope", "value": 1}', "(it takes: queue_length)"),
            ]:
                bad = admin.post(push, content=body)
                assert bad.status_code == 400, (body, bad.text)
                assert problem in bad.json()["error"], (body, bad.json())
            assert (
                admin.post("/api/metrics/ghost", json={"name": "q", "value": 1}).status_code == 404
            )
            ok = admin.post(push, json={"name": "queue_length", "value": 450})
            assert ok.status_code == 200 and ok.json()["value"] == 450

            def worker_at(replicas: int) -> bool:
                admin.post(push, json={"name": "queue_length", "value": 450})
                d = latest(admin, "worker")
                return d.get("replicas") == replicas

            # 450 queued at 100 per replica -> 5; concurrency (idle) asks 1: the push wins
            assert wait_until(lambda: worker_at(5), timeout_s=30)
            d = latest(admin, "worker")
            assert d["metrics"]["winner"] == "queue_length"
            answers = {a["name"]: a["replicas"] for a in d["metrics"]["answers"]}
            assert answers == {"concurrency": 1, "queue_length": 5}
            admin.close()
            client.close()


@needs_cgroups
def test_on_the_local_platform_the_header_starts_the_replicas_the_table_asks_for(
    tmp_path: Path,
) -> None:
    start = random.randrange(20000, 60000, 100)
    cfg = {
        "platform": "local",
        "admin": {"host": "127.0.0.1", "port": 0, "token": TOKEN},
        "budget": {"cpu": 2},
        "services": {
            "api": {
                "routes": [{"path": "/"}],
                "replicas": {
                    "command": [
                        "{python}",
                        "-m",
                        "tests.support.upstream",
                        "--name",
                        "r",
                        "--port",
                        "{port}",
                    ],
                    "port_range": [start, start + 10],
                    "env": {"PYTHONPATH": str(ROOT)},
                    "grace_s": 5,
                    **REPLICA_USER_FIELDS,
                },
                "scaling": {**SCALING, "max_replicas": 5, "metrics": [STEPS]},
            }
        },
    }
    with gateway(cfg, tmp_path / "local.yaml") as g:
        admin = httpx.Client(base_url=g.admin_url, timeout=10, headers=AUTH)
        client = httpx.Client(base_url=g.url, timeout=10)

        def routable() -> int:
            view = admin.get("/api/services").json()["services"]["api"]
            return sum(1 for ep in view["endpoints"] if ep["routable"])

        assert wait_until(lambda: routable() >= 1, timeout_s=30)
        # 15,000 active users: 3 replicas decided, started and routable
        assert wait_until(lambda: decided(admin, client, "15000", 3), timeout_s=30)
        assert wait_until(
            lambda: routable() == 3 and decided(admin, client, "15000", 3), timeout_s=40
        )
        # 500: back down to the first row's 2
        assert wait_until(
            lambda: decided(admin, client, "500", 2) and routable() == 2, timeout_s=40
        )
        admin.close()
        client.close()


def test_a_slow_upstreams_latency_asks_for_more_replicas(tmp_path: Path) -> None:
    with upstreams("s1") as ups:
        cfg = {
            "platform": "static",
            "budget": {"cpu": 4},
            "services": {
                "slow": {
                    "routes": [{"path": "/"}],
                    "endpoints": [ups[0].address],
                    "scaling": {
                        **SCALING,
                        "metrics": [
                            {"type": "concurrency", "target": 10},
                            {"type": "latency", "percentile": 95, "target_s": 0.1, "window_s": 5},
                        ],
                    },
                }
            },
        }
        with gateway(cfg, tmp_path / "latency.yaml") as g:
            admin = httpx.Client(base_url=g.admin_url, timeout=10)
            client = httpx.Client(base_url=g.url, timeout=10)

            def slow_decided() -> bool:
                # one 0.3 s request per poll (bounded by wait_until): p95 ~0.3-0.5 s > 0.1 s
                assert client.get("/delay", params={"s": "0.3"}).status_code == 200
                d = latest(admin, "slow")
                return (d.get("metrics") or {}).get("winner") == "latency"

            assert wait_until(slow_decided, timeout_s=60, pause_s=0)
            d = latest(admin, "slow")
            answers = {a["name"]: a for a in d["metrics"]["answers"]}
            # one replica ready: at most twice that per step, never below concurrency's answer
            assert d["replicas"] == answers["latency"]["replicas"] == 2
            assert answers["latency"]["value"] > 0.1
            assert answers["concurrency"]["replicas"] == 1
            signals = admin.get("/api/signals").json()["signals"]["slow"]
            assert sum(signals["latency_counts"]) >= 10
            assert len(signals["latency_counts"]) == len(signals["latency_bounds_s"]) + 1
            admin.close()
            client.close()


def test_with_two_workers_the_header_reaches_the_scaler_in_the_main_process(
    tmp_path: Path,
) -> None:
    with upstreams("w1", "w2") as ups:
        cfg = {
            "platform": "static",
            "workers": 2,
            "budget": {"cpu": 4},
            "services": {
                "api": {
                    "routes": [{"path": "/"}],
                    "endpoints": [u.address for u in ups],
                    "scaling": {**SCALING, "metrics": [STEPS]},
                }
            },
        }
        with gateway(cfg, tmp_path / "workers.yaml") as g:
            admin = httpx.Client(base_url=g.admin_url, timeout=10)

            def at(users: str, replicas: int) -> bool:
                # a new connection each time, so the kernel spreads them over the workers
                answer = httpx.get(
                    g.url + "/headers", params={"h": f"X-Active-Users:{users}"}, timeout=10
                )
                assert answer.status_code == 200
                return latest(admin, "api").get("replicas") == replicas

            assert wait_until(lambda: at("35000", 4), timeout_s=30)
            assert wait_until(lambda: at("1500", 3), timeout_s=30)
            d = latest(admin, "api")
            assert d["metrics"]["winner"] == "active_users"
            assert d["metrics"]["answers"][0]["value"] == 1500
            admin.close()
