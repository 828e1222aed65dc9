"""Decision metrics read the decision's explanation fields (rule, demand, clamps, flows)."""

from __future__ import annotations

from gateway.admin.metrics import DecisionCollector
from scaler.decision import Decision
from scaler.explanation import Clamp, Explanation, Flow, Step
from tests.unit.test_metrics_quota import samples


def test_rule_frozen_demand_clamps_and_flows() -> None:
    api = Decision(
        "api",
        1.0,
        2,
        0.95,
        1.9,
        "panic",
        explanation=Explanation(
            "panic",
            {"demand_cores": 3.0},
            (
                Clamp("replicas", 15, 8, "max_replicas"),
                Clamp("cores", 3.0, 1.9, "budget"),
                Flow("borrowed", 0.9, ("idle",)),
            ),
        ),
    )
    idle = Decision(
        "idle",
        1.0,
        1,
        0.1,
        0.1,
        "frozen: stale signals",
        frozen=True,
        explanation=Explanation("frozen: stale signals", {}, (Flow("lent", 0.9, ("api",)),)),
    )
    got = samples(DecisionCollector(lambda: {"api": api, "idle": idle}, lambda: 2.0, lambda: True))
    assert got[("sluice_scaler_rule", (("rule", "panic"), ("service", "api")))] == 1
    assert got[("sluice_scaler_frozen", (("service", "idle"),))] == 1
    assert got[("sluice_scaler_frozen", (("service", "api"),))] == 0
    assert got[("sluice_scaler_demand_cores", (("service", "api"),))] == 3.0
    clamped = {labels for name, labels in got if name == "sluice_scaler_clamped"}
    assert clamped == {
        (("bound", "max_replicas"), ("quantity", "replicas"), ("service", "api")),
        (("bound", "budget"), ("quantity", "cores"), ("service", "api")),
    }
    assert got[("sluice_scaler_cpu_flow_cores", (("kind", "borrowed"), ("service", "api")))] == 0.9
    assert got[("sluice_scaler_cpu_flow_cores", (("kind", "lent"), ("service", "idle")))] == 0.9
    assert got[("sluice_scaler_cpu_flow_cores", (("kind", "lent"), ("service", "api")))] == 0.0


def test_resize_blocked_is_read_from_the_decision_steps() -> None:
    def decision(name: str, parts: tuple[Step, ...]) -> Decision:
        return Decision(
            name, 1.0, 3, 0.5, 1.5, "stable", explanation=Explanation("stable", {}, parts)
        )

    blocked = decision("api", (Step("split.resize_blocked", {"cpu": 0.5}),))
    free = decision("web", (Step("split.cores", {}),))
    got = samples(
        DecisionCollector(lambda: {"api": blocked, "web": free}, lambda: 4.0, lambda: True)
    )
    assert got[("sluice_scaler_resize_blocked", (("service", "api"),))] == 1
    assert got[("sluice_scaler_resize_blocked", (("service", "web"),))] == 0
