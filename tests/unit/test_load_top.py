"""`sluice load` schedules and summaries, `sluice top` cells: the pure parts."""

from __future__ import annotations

import copy

import pytest
from rich.console import Console

from gateway.settings import Settings
from gateway.tools.loadgen import (
    Client,
    LoadReport,
    Result,
    Stream,
    percentile,
    streams_from_settings,
)
from gateway.tools.top import last_reason, render


def test_steady_stream_sends_evenly_for_the_duration() -> None:
    times = Stream("api", "/api/load", rps=4).send_times(2.0)
    assert times == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75]


def test_bursts_repeat_every_period_and_stop_at_the_end() -> None:
    s = Stream("reports", "/r", rps=2, burst_s=1, period_s=3, offset_s=1)
    assert s.send_times(8) == [1.0, 1.5, 4.0, 4.5, 7.0, 7.5]
    assert Stream("x", "/", concurrency=3).send_times(10) == []  # closed loop: no schedule


def test_streams_follow_the_policy_steady_for_long_lived_bursts_for_scale_to_zero() -> None:
    settings = Settings.model_validate(
        {
            "platform": "static",
            "services": {
                "api": {"routes": [{"host": "api.test", "path": "/api/"}], "endpoints": []},
                "reports": {
                    "routes": [{"path": "/reports"}],
                    "endpoints": [],
                    "scaling": {"min_replicas": 0},
                },
                "hidden": {"endpoints": []},
            },
        }
    )
    api, reports = streams_from_settings(
        settings, rps=5, burst_rps=9, burst_s=2, period_s=10, first_burst_s=3
    )
    assert api == Stream("api", "/api/load", "api.test", rps=5)
    assert reports == Stream("reports", "/reports/load", None, 9, 2, 10, 3)


def test_summary_counts_lost_and_percentiles_over_successes() -> None:
    report = LoadReport(duration_s=2.0)
    report.results = [Result("api", 0, i / 100, 200) for i in range(1, 101)]
    report.results += [
        Result("api", 0, 5.0, 503, "queue-full"),
        Result("api", 0, 1.0, 0, "EOFError"),
    ]
    report.skipped["api"] = 2
    s = report.summary("api")
    assert s["requests"] == 102 and s["ok"] == 100 and s["lost"] == 2 and s["skipped"] == 2
    assert s["statuses"] == {"200": 100, "503": 1, "none": 1}
    assert s["p50_s"] == pytest.approx(0.5) and s["p99_s"] == pytest.approx(0.99)
    assert s["ok_per_s"] == 50
    assert percentile([], 0.5) is None


def test_the_client_refuses_anything_but_loopback() -> None:
    with pytest.raises(ValueError, match=r"only sends to 127\.0\.0\.1"):
        Client("10.0.0.1", 80)


def test_top_cell_shows_the_rule_and_what_the_budget_did() -> None:
    d = {
        "rule": "panic",
        "reasons": ["concurrency stable 1.0", "reclaimed 0.90 cores from: api 0.90", "budget: x"],
    }
    assert last_reason(d) == "panic; reclaimed 0.90 cores from: api 0.90"
    assert last_reason({"rule": "stable", "reasons": ["a", "budget: y"]}) == "stable; budget: y"
    assert last_reason(None) == "-"


def test_top_frame_has_a_row_per_service() -> None:
    snapshot = {
        "services": {
            "api": {
                "signals": {
                    "rps": 12.5,
                    "in_flight": 3,
                    "queued": 1,
                    "latency_p99_s": 0.25,
                    "completions_total": 200,
                    "errors_total": 5,
                },
                "endpoints": [{"routable": True}, {"routable": False}],
            }
        },
        "decisions": {
            "latest": {
                "api": {
                    "replicas": 2,
                    "cpu_per_replica_cores": 0.5,
                    "allocated_cores": 1.0,
                    "rule": "stable",
                    "reasons": ["budget: demand 1.00 cores"],
                }
            },
            "budget": {"cpu": 2, "allocated_cores": 1.0, "arbitration": "shared"},
            "applied": True,
            "ticks": 7,
        },
    }
    console = Console(width=200, record=True)
    console.print(render(snapshot, "http://127.0.0.1:9901"))
    text = console.export_text()
    assert "budget 1.00 of 2 CPU allocated (shared, applied), 7 ticks" in text
    row = next(line for line in text.splitlines() if "│ api" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells == [
        "api",
        "12.5",
        "2.5",  # err%: 5 of 200 completions since start (no previous frame)
        "3",
        "1",
        "250 ms",
        "1/2",
        "0.50",
        "1.00 (50%)",
        "stable; budget: demand 1.00 cores",
    ]
    # At 80 columns the lowest-priority columns go; every row fits, no cell is cut.
    later = copy.deepcopy(snapshot)
    later["services"]["api"]["signals"].update(completions_total=300, errors_total=25)
    narrow = Console(width=80, record=True)
    narrow.print(render(later, "http://127.0.0.1:9901", narrow.width, previous=snapshot))
    lines = narrow.export_text().splitlines()
    assert all(len(line) <= 80 for line in lines)
    header = next(line for line in lines if "service" in line)
    assert "budget share" not in header and "in flight" not in header
    for kept in ("rps", "err%", "replicas", "p99", "last decision"):
        assert kept in header, (kept, header)
    row = next(line for line in lines if "│ api" in line)
    assert "…" not in row
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[2] == "20.0"  # err% between the frames: 20 of 100
