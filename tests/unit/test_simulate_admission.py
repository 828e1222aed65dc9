"""The simulator follows the gateway's admission control: concurrency slots, a FIFO queue
bounded in size and wait, and the hold while a service has no ready replica."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.policy import BudgetConfig, ScalingPolicy
from scaler.signals import LATENCY_BUCKETS_S
from scaler.simulate.arrivals import Arrivals
from scaler.simulate.loop import EventLoop
from scaler.simulate.model import UNBOUNDED, Admission, Node, ServiceModel
from scaler.simulate.report import json_ready
from scaler.simulate.runner import RunResult, build_scenario, run
from scaler.simulate.workload import parse_workload
from tests.support.sim_scenarios import placed, requests

ROOT = Path(__file__).resolve().parents[2]
THREE = requests((0.0, 1.0), (0.1, 1.0), (0.2, 1.0))


def one_replica(arrivals: Arrivals, admission: Admission) -> tuple[EventLoop, ServiceModel]:
    m = ServiceModel("a", arrivals, startup_s=0.0, request_cores_max=1.0, admission=admission)
    node = placed(1.0, {m: (1, 1.0)})
    return EventLoop(1.0, node.services, rule="limit"), m


def test_without_limits_every_request_shares_the_replica_at_once() -> None:
    loop, m = one_replica(THREE, UNBOUNDED)
    loop.run(10.0)
    # processor sharing: the three finish together-ish, none waits in the gateway
    assert sorted(m.latencies) == pytest.approx([2.75, 2.8, 2.85])
    assert m.rejected_total == 0


def test_one_slot_per_replica_serves_in_arrival_order() -> None:
    loop, m = one_replica(THREE, Admission(slots_per_replica=1))
    loop.run(10.0)
    assert m.latencies == pytest.approx([1.0, 1.9, 2.8])  # first come, first served
    assert m.rejected_total == 0


def test_a_full_queue_rejects_at_once() -> None:
    loop, m = one_replica(THREE, Admission(slots_per_replica=1, queue_max=1))
    loop.run(10.0)
    assert m.latencies == pytest.approx([1.0, 1.9])
    assert (m.rejected_queue_full, m.rejected_timeout) == (1, 0)


def test_a_request_that_waits_past_the_timeout_is_rejected_not_served() -> None:
    loop, m = one_replica(THREE, Admission(slots_per_replica=1, queue_timeout_s=1.5))
    loop.run(10.0)
    # the second waited 0.9 s for the slot; the third would have waited 1.8 s
    assert m.latencies == pytest.approx([1.0, 1.9])
    assert (m.rejected_queue_full, m.rejected_timeout) == (0, 1)
    assert m.concurrency == 0


def test_with_no_ready_replica_requests_wait_in_the_bounded_queue() -> None:
    m = ServiceModel(
        "a",
        THREE,
        startup_s=0.0,
        request_cores_max=1.0,
        admission=Admission(
            queue_max=1, queue_timeout_s=5.0, cold_start_timeout_s=8.0, cold_start_max=2
        ),
    )
    loop = EventLoop(1.0, {"a": m}, rule="limit")
    loop.run(1.0)
    assert len(m.queue) == 2 and m.rejected_queue_full == 1
    loop.run(7.9)  # past queue_timeout_s: held, since no replica was ready when they came
    assert len(m.queue) == 2 and m.rejected_timeout == 0
    loop.run(10.0)  # no replica ever: both time out at cold_start_timeout_s
    assert not m.queue and m.rejected_timeout == 2 and m.latencies == []
    assert m.residence_total_s == pytest.approx(16.0)  # each left after its 8 s


def test_a_wait_for_a_slot_behind_cold_requests_times_out_on_its_own_bound() -> None:
    """Cold requests hold the head of the queue past ``queue_timeout_s``; one queued behind
    them once a replica is ready still times out after ``queue_timeout_s``, out of order."""
    arrivals = requests((0.0, 5.0), (0.1, 5.0), (1.5, 1.0))
    adm = Admission(slots_per_replica=1, queue_timeout_s=2.0, cold_start_timeout_s=100.0)
    m = ServiceModel("a", arrivals, startup_s=1.0, request_cores_max=1.0, admission=adm)
    node = Node(1.0, {"a": m})
    m.set_target(1, 1.0, node.claims())
    node.schedule(0.0)  # ready at 1 s: the first two requests arrive to no ready replica
    loop = EventLoop(1.0, node.services, rule="limit")
    loop.run(3.4)
    assert [q[0] for q in m.queue] == [0.1, 1.5]
    loop.run(3.6)  # the third's 2 s are up; the second, ahead of it, is still held
    assert [q[0] for q in m.queue] == [0.1] and m.rejected_timeout == 1
    loop.run(20.0)
    assert m.latencies == pytest.approx([6.0, 10.9])  # served in order: 1 -> 6 -> 11
    assert m.concurrency == 0 and m.arrivals_total == 3


WAKE = {
    "duration_s": 120,
    "seed": 5,
    "services": {
        "hook": {
            "slo_s": 2.0,
            "startup_s": 12,
            "load": [{"at_s": 0, "rps": 0, "cpu_s": 0.05}],
            "bursts": [{"every_s": 60, "for_s": 20, "start_s": 10, "rps": 20, "cpu_s": 0.05}],
        }
    },
}


@pytest.mark.parametrize(("timeout_s", "cold_s"), [(5.0, 5.0), (5.0, 300.0), (30.0, 10.0)])
def test_a_cold_start_longer_than_the_cold_start_timeout_rejects_what_waited_too_long(
    timeout_s: float, cold_s: float
) -> None:
    policies = {"hook": ScalingPolicy(min_replicas=0, max_replicas=2, cpu={"max": 1.0})}
    admission = {
        "hook": Admission(queue_max=1000, queue_timeout_s=timeout_s, cold_start_timeout_s=cold_s)
    }
    scenario = build_scenario(parse_workload(WAKE), policies, admission=admission)
    result = run(scenario, "sluice", policies, BudgetConfig(cpu=2))
    arrived, done = result.arrivals["hook"], result.completed["hook"]
    rejected, left = result.rejected["hook"], result.unfinished["hook"]
    assert done + rejected + left == arrived  # nothing lost: each one is accounted for
    if cold_s < 12:  # the replica starts 12 s after the first request
        assert rejected > 0
    else:
        assert rejected == 0
    assert math.isfinite(float(result.latencies_s["hook"].max()))


def test_the_summary_figure_says_when_a_run_served_none_of_a_services_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from gateway.cli import main

    legends: list[str] = []
    save = Figure.savefig

    def spy(self: Figure, *args: Any, **kwargs: Any) -> None:
        for ax in self.axes:
            if (legend := ax.get_legend()) is not None:
                legends.extend(t.get_text() for t in legend.get_texts())
        save(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    scenario = ROOT / "benchmarks" / "scenarios" / "scale-to-zero-4c-three-hooks-slow-start"
    config = yaml.safe_load((scenario / "config.yaml").read_text())
    for hook in ("github", "stripe", "slack"):  # fail fast rather than hold a cold start
        config["services"][hook]["limits"] = {"queue": {"cold_start_timeout_s": 10}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    args = ["simulate", "--config", str(tmp_path / "config.yaml")]
    args += ["--workload", str(scenario / "workload.yaml"), "--duration", "150"]
    out = tmp_path / "out"
    assert main([*args, "--out", str(out), "--no-progress", "--plot"]) == 0
    # independent never starts the hooks (the app holds the budget): all their requests 503
    report = json.loads((out / "report.json").read_text())
    github = report["runs"]["independent"]["services"]["github"]
    assert github["completed"] == 0 and github["rejected"] == github["requests"] > 0
    assert f"independent: none served, {github['rejected']} rejected" in legends
    # a 503 is no answer: rejected requests sit above every served one in the quantiles
    # (inf, written null), so a run that sheds requests never reads as the faster one
    shed = 0
    for name, figures in report["runs"].items():
        for service, f in figures["services"].items():
            if f["rejected"] > 0.01 * f["requests"]:
                shed += 1
                assert f["latency_p99_s"] is None and f["latency_cdf_s"][-1] is None
                assert f"{name} (p99 rejected, {f['rejected']} rejected)" in legends or (
                    f["completed"] == f["unfinished"] == 0
                ), (name, service)
    assert shed >= 2


def test_a_runs_outcomes_are_its_latencies_then_one_inf_per_rejected_request() -> None:
    result = RunResult(
        name="independent",
        series={},
        latencies_s={"hook": np.array([0.5, 2.0])},
        arrivals={"hook": 4},
        completed={"hook": 1},
        unfinished={"hook": 1},
        cpu_seconds={"hook": 0.1},
        rejected={"hook": 2},
    )
    assert result.outcomes_s("hook").tolist() == [0.5, 2.0, math.inf, math.inf]
    assert json_ready({"p99": math.inf, "cdf": [0.5, math.inf], "n": 2}) == {
        "p99": None,
        "cdf": [0.5, None],
        "n": 2,
    }


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 30.0),  # rps
            st.sampled_from([0.02, 0.1, 0.3]),  # CPU-seconds per request
            st.sampled_from([0.0, 2.0, 8.0]),  # replica start-up (s)
            st.sampled_from([0, 1]),  # min_replicas
            st.sampled_from([None, 1, 2, 4]),  # concurrency slots per replica
            st.sampled_from([None, 0, 5, 50]),  # queue max
            st.sampled_from([0.5, 2.0, 10.0, math.inf]),  # queue timeout (s)
        ),
        min_size=1,
        max_size=3,
    ),
    st.sampled_from([1.0, 2.0, 4.0]),
    st.sampled_from(["sluice", "independent", "static"]),
)
def test_every_arrival_is_served_rejected_or_still_waiting(
    services: list[tuple[float, float, float, int, int | None, int | None, float]],
    cores: float,
    name: str,
) -> None:
    names = [f"s{i}" for i in range(len(services))]
    workload = {
        "duration_s": 40,
        "seed": 7,
        "services": {
            n: {
                "slo_s": 1,
                "startup_s": start,
                "load": [{"at_s": 0, "rps": 0, "cpu_s": cpu}],
                "bursts": [
                    {"every_s": 20, "for_s": 8, "start_s": 2, "rps": rps or 0.1, "cpu_s": cpu}
                ],
            }
            for n, (rps, cpu, start, *_) in zip(names, services, strict=True)
        },
    }
    policies = {
        n: ScalingPolicy(min_replicas=low, max_replicas=3, cpu={"max": 1.0})
        for n, (_, _, _, low, *_) in zip(names, services, strict=True)
    }
    admission = {
        n: Admission(slots, qmax, timeout)
        for n, (*_, slots, qmax, timeout) in zip(names, services, strict=True)
    }
    scenario = build_scenario(parse_workload(workload), policies, admission=admission)
    result = run(scenario, name, policies, BudgetConfig(cpu=cores))  # type: ignore[arg-type]
    for n in names:
        a = admission[n]
        accounted = result.completed[n] + result.rejected[n] + result.unfinished[n]
        assert accounted == result.arrivals[n]
        if a.queue_max is None and a.queue_timeout_s == math.inf:
            assert result.rejected[n] == 0  # an unbounded queue turns nobody away


def test_the_concurrency_integral_is_every_requests_time_in_the_gateway() -> None:
    """As the gateway counts it: served requests for their latency, requests rejected by a
    timeout for their wait, those rejected at once for nothing, the rest for their age."""
    loop, m = one_replica(THREE, UNBOUNDED)
    loop.run(0.5)
    assert m.signals(0.5).concurrency_seconds_total == pytest.approx(0.5 + 0.4 + 0.3)
    loop, m = one_replica(THREE, Admission(slots_per_replica=1, queue_max=1))
    loop.run(10.0)
    assert m.signals(10.0).concurrency_seconds_total == pytest.approx(1.0 + 1.9)
    loop, m = one_replica(THREE, Admission(slots_per_replica=1, queue_timeout_s=1.5))
    loop.run(10.0)
    assert m.signals(10.0).concurrency_seconds_total == pytest.approx(1.0 + 1.9 + 1.5)


def gateway_histogram(latencies: list[float]) -> tuple[int, ...]:
    """The gateway's own latency histogram of these latencies (``ServiceStats.complete``)."""
    from gateway.dataplane.stats import ServiceStats

    stats = ServiceStats("a")
    for k, latency in enumerate(latencies):
        stats.arrive(float(k))
        stats.complete(200, latency, float(k))
    return tuple(stats.latency_counts)


def test_a_latency_metric_reads_the_gateway_histogram_of_what_the_replicas_served() -> None:
    """As the gateway counts its latency histogram only for a service with a ``latency``
    metric, so does the model; the buckets are the gateway's, cumulative, the served
    requests' latencies in them."""
    arrivals = requests(*((0.05 * k, 0.02 + 0.01 * (k % 7)) for k in range(60)))
    plain = ServiceModel("a", arrivals, startup_s=0.0, request_cores_max=1.0)
    placed(1.0, {plain: (1, 1.0)})
    assert plain.signals(0.0).latency_counts is None
    m = ServiceModel("a", arrivals, startup_s=0.0, request_cores_max=1.0, latency_histogram=True)
    node = placed(1.0, {m: (1, 1.0)})
    loop = EventLoop(1.0, node.services, rule="limit")
    loop.run(1.0)
    first = m.signals(1.0)
    assert first.latency_bounds_s == LATENCY_BUCKETS_S
    assert first.latency_counts == gateway_histogram(m.latencies)
    served = len(m.latencies)
    loop.run(10.0)
    later = m.signals(10.0)
    assert later.latency_counts == gateway_histogram(m.latencies)
    assert len(m.latencies) == 60 > served
    assert m.signals(10.0).latency_counts == later.latency_counts  # read twice, counted once


def test_the_histogram_holds_the_gateways_own_503s_as_the_gateway_records_them() -> None:
    """A request rejected at once (queue full) is recorded at ~0 s, one that timed out in the
    queue at ``queue.timeout_s``: the gateway's answer goes through the same histogram."""
    arrivals = requests(*((0.01 * k, 1.0) for k in range(8)))
    admission = Admission(slots_per_replica=1, queue_max=3, queue_timeout_s=0.4)
    m = ServiceModel(
        "a",
        arrivals,
        startup_s=0.0,
        request_cores_max=1.0,
        admission=admission,
        latency_histogram=True,
    )
    node = placed(1.0, {m: (1, 1.0)})
    EventLoop(1.0, node.services, rule="limit").run(5.0)
    assert m.rejected_queue_full == 4 and m.rejected_timeout == 3  # 1 served, 3 waited 0.4 s
    counts = m.signals(5.0).latency_counts
    assert counts is not None
    assert counts == gateway_histogram(m.latencies + [0.0] * 4 + [0.4] * 3)
    assert sum(counts) == m.completions_total + m.rejected_total == 8


def test_a_simulated_service_scaled_on_its_latency_gets_the_percentile_it_would_live() -> None:
    """``sluice simulate`` with a ``latency`` metric: the metric reads the model's histogram
    (before, it never had data and the service scaled on its other metrics alone)."""
    from scaler.metrics import metrics_of
    from scaler.simulate.baselines import make_controller

    policy = ScalingPolicy.model_validate(
        {
            "max_replicas": 6,
            "cpu": {"min": 0.25, "max": 1.0},
            "metrics": [
                {"type": "concurrency", "target": 50},
                {"type": "latency", "percentile": 95, "target_s": 0.2},
            ],
        }
    )
    workload = parse_workload(
        {
            "duration_s": 60,
            "services": {
                "a": {"slo_s": 0.2, "startup_s": 1, "load": [{"at_s": 0, "rps": 40, "cpu_s": 0.04}]}
            },
        }
    )
    budget = BudgetConfig(cpu=4)
    scenario = build_scenario(workload, {"a": policy})
    controller = make_controller("sluice", {"a": policy}, budget)
    values: list[float] = []
    tick = controller.engine.tick

    def record(now: float, signals: Any, states: Any) -> Any:
        out = tick(now, signals, states)
        metrics = metrics_of(out["a"].explanation)
        assert metrics is not None
        values.extend(
            a["value"]
            for a in metrics["answers"]
            if a["type"] == "latency" and a["value"] is not None
        )
        return out

    controller.engine.tick = record  # type: ignore[method-assign]
    run(scenario, "sluice", {"a": policy}, budget, controller=controller)
    assert values and all(v > 0.0 for v in values)
