"""``/api/decisions``' JSON of one decision: the explanation as data, never NaN or infinity."""

from __future__ import annotations

import json
import math

from gateway.admin.decisions import decision_json
from scaler.decision import Decision, ServiceState
from scaler.engine import Engine
from scaler.explanation import Clamp, Explanation, Flow, Step
from scaler.policy import BudgetConfig, ScalingPolicy
from scaler.signals import ServiceSignals


def test_non_finite_numbers_become_null() -> None:
    d = Decision(
        "api",
        1.0,
        2,
        0.5,
        1.0,
        "stable",
        explanation=Explanation(
            "stable",
            {"concurrency": math.nan, "stable": math.inf},
            (
                Step("text", {"text": "x"}),
                Clamp("cores", math.inf, 1.0, "budget"),
                Flow("lent", 0.25, ("web",)),
            ),
        ),
    )
    out = decision_json(d)
    text = json.dumps(out, allow_nan=False)  # raises on NaN / inf
    assert out["wake_concurrency"] is None
    assert out["inputs"] == {"concurrency": None, "stable": None}
    assert out["explanation"]["clamps"] == [
        {"quantity": "cores", "value": None, "bound": 1.0, "name": "budget"}
    ]
    assert out["explanation"]["flows"] == [{"kind": "lent", "cores": 0.25, "peers": ["web"]}]
    assert "NaN" not in text and "Infinity" not in text


def test_an_engine_decision_carries_its_explanation_as_data() -> None:
    policies = {
        "api": ScalingPolicy(target=10, max_replicas=2, cpu={"min": 0.25, "max": 0.25}),
        "idle": ScalingPolicy(target=10, cpu={"min": 0.25, "max": 1.0}),
    }
    engine = Engine(policies, BudgetConfig(cpu=2))
    states = {n: ServiceState(n, 1, 1, 0.25) for n in policies}
    signals = {
        "api": ServiceSignals("api", 0.0, in_flight=100),
        "idle": ServiceSignals("idle", 0.0, rps=math.inf),
    }
    decisions = engine.tick(0.0, signals, states)
    api = decision_json(decisions["api"])
    json.dumps(api, allow_nan=False)
    assert api["explanation"]["rule"] == api["rule"]
    assert {"quantity": "replicas", "value": 15, "bound": 2, "name": "max_replicas"} in api[
        "explanation"
    ]["clamps"]
    assert api["explanation"]["steps"][-1]["kind"] == "budget"
    assert api["reasons"][-1].startswith("budget: demand")
    idle = decision_json(decisions["idle"])
    json.dumps(idle, allow_nan=False)
    assert idle["rule"] == "frozen: invalid signals"
    refused = [s for s in idle["explanation"]["steps"] if s["kind"] == "signals_refused"]
    assert refused == [{"kind": "signals_refused", "fields": "rps=inf"}]
