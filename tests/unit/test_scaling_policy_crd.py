"""The ScalingPolicy resource's pure parts: the CRD generated from the one scaling model (and
the chart's copy of it), which policy is in force (config > ScalingPolicy > annotations), and
the status built from a decision."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gateway.platforms.kubernetes.crd import PRINTER_COLUMNS, ScalingPolicySpec, crd, crd_yaml
from gateway.platforms.kubernetes.ingress_rules import build_table
from gateway.platforms.kubernetes.model import Meta, PolicyObject, Workload, ingress_from_json
from gateway.platforms.kubernetes.policy_objects import Verdict, resolve
from gateway.platforms.kubernetes.policy_status import build_status
from gateway.settings import parse_settings
from scaler.decision import Decision
from scaler.engine import Engine
from scaler.policy import BudgetConfig, ScalingPolicy
from scaler.signals import ServiceSignals
from tests.support.fake_kube_crd import _structural_problems, jsonpath
from tests.support.kube_objects import ingress

ROOT = Path(__file__).resolve().parents[2]


def test_the_chart_ships_the_generated_crd() -> None:
    shipped = ROOT / "charts/sluice/crds/scalingpolicies.sluice.io.yaml"
    assert shipped.read_text() == crd_yaml(), (
        "charts/sluice/crds/scalingpolicies.sluice.io.yaml is stale: run "
        "`sluice crd > charts/sluice/crds/scalingpolicies.sluice.io.yaml`"
    )


def schema() -> dict[str, Any]:
    out: dict[str, Any] = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return out


def test_the_schema_is_structural_and_covers_every_scaling_field() -> None:
    assert _structural_problems(schema(), "openAPIV3Schema") == []
    spec = schema()["properties"]["spec"]
    assert set(spec["properties"]) == {"targetRef", *ScalingPolicy.model_fields}
    assert spec["required"] == ["targetRef"]
    assert spec["properties"]["min_replicas"]["type"] == "integer"
    assert spec["properties"]["mode"]["enum"] == ["kpa", "hpa"]
    target = spec["properties"]["target"]
    assert (target["minimum"], target["exclusiveMinimum"]) == (0, True)
    cpu = spec["properties"]["cpu"]
    assert cpu["properties"]["request"]["nullable"] is True
    assert "$ref" not in yaml.safe_dump(schema()) and "anyOf" not in yaml.safe_dump(schema())


def test_cel_rules_use_the_models_defaults() -> None:
    rules = [r["rule"] for r in schema()["properties"]["spec"]["x-kubernetes-validations"]]
    assert (
        "(has(self.min_replicas) ? self.min_replicas : 1) <= "
        "(has(self.max_replicas) ? self.max_replicas : 10)"
    ) in rules


def test_printer_columns_point_at_fields_of_the_schema() -> None:
    props = schema()["properties"]
    for column in PRINTER_COLUMNS:
        path = column["jsonPath"].split("[")[0].strip(".").split(".")
        if path[0] == "metadata":
            continue
        node = props
        for part in path:
            assert part in node, column
            node = node[part].get("properties") or node[part].get("items", {}).get("properties", {})
    obj = {
        "status": {
            "conditions": [
                {"type": "Active", "status": "False"},
                {"type": "Ready", "status": "True"},
            ]
        }
    }
    assert jsonpath(obj, PRINTER_COLUMNS[6]["jsonPath"]) == "True"


def obj(name: str, created: str, **spec: Any) -> PolicyObject:
    return PolicyObject(Meta("shop", name, uid=name), 1, created, spec, {})


def test_older_policy_wins_config_wins_bad_specs_and_floors_are_reported() -> None:
    objects = [
        obj("b", "2026-01-02T00:00:00Z", targetRef={"service": "web"}, target=2),
        obj(
            "a",
            "2026-01-01T00:00:00Z",
            targetRef={"service": "web", "kind": "StatefulSet"},
            target=5,
        ),
        obj("cfg", "2026-01-01T00:00:00Z", targetRef={"service": "api"}, target=7),
        obj("bad", "2026-01-01T00:00:00Z", targetRef={"service": "x"}, max_replicas=0),
        obj(
            "big",
            "2026-01-03T00:00:00Z",
            targetRef={"service": "big"},
            min_replicas=30,
            max_replicas=30,
        ),
    ]
    configured = {"shop/api": ScalingPolicy(target=1)}
    got = resolve(objects, configured, BudgetConfig(cpu=2))
    assert got.policies["shop/web"].target == 5
    assert got.workloads["shop/web"] == Workload("StatefulSet", "shop", "web")
    v = got.verdicts
    assert v["shop/a"] == Verdict(True, "InForce", "scales StatefulSet/web", "shop/web")
    assert v["shop/b"].reason == "Conflict" and "shop/a (older)" in v["shop/b"].message
    assert v["shop/cfg"].reason == "OverriddenByConfig"
    assert v["shop/bad"].reason == "InvalidSpec"
    assert v["shop/bad"].message.startswith("spec.max_replicas: ")
    assert v["shop/big"].reason == "BudgetExceeded" and "budget.cpu: " in v["shop/big"].message
    routed = got.not_routed(["shop/api"])
    assert routed.verdicts["shop/a"].reason == "NotRouted"


def test_table_precedence_config_then_scalingpolicy_then_annotations() -> None:
    annotated = {"sluice.io/target": "9"}
    ings = [
        ingress_from_json(
            ingress("web", [(None, "/w", "Prefix", "web", 80)], annotations=annotated)
        ),
        ingress_from_json(
            ingress("api", [(None, "/a", "Prefix", "api", 80)], annotations=annotated)
        ),
        ingress_from_json(
            ingress("etc", [(None, "/e", "Prefix", "etc", 80)], annotations=annotated)
        ),
    ]
    settings = parse_settings(
        {"platform": "kubernetes", "services": {"shop/api": {"scaling": {"target": 1}}}}
    )
    objects = [
        obj(
            "web", "2026-01-01T00:00:00Z", targetRef={"service": "web", "name": "web-v2"}, target=5
        ),
        obj("api", "2026-01-01T00:00:00Z", targetRef={"service": "api"}, target=5),
    ]
    crds = resolve(objects, {n: s.scaling for n, s in settings.services.items()})
    table = build_table(ings, "sluice", settings.services, settings.budget, crd=crds)
    assert table.policies["shop/api"].target == 1  # the config file
    assert table.policies["shop/web"].target == 5  # the ScalingPolicy
    assert table.workloads["shop/web"] == Workload("Deployment", "shop", "web-v2")
    assert table.policies["shop/etc"].target == 9  # the annotations


def test_status_from_a_decision_and_transition_times_kept() -> None:
    spec = ScalingPolicySpec.model_validate(
        {"targetRef": {"service": "web"}, "target": 1, "max_replicas": 2}
    )
    engine = Engine({"shop/web": spec.policy()}, BudgetConfig(cpu=4))
    decision: Decision = engine.tick(
        0.0, {"shop/web": ServiceSignals("shop/web", 0.0, in_flight=20)}, {}
    )["shop/web"]
    o = obj("web", "t", targetRef={"service": "web"})
    ready = Verdict(True, "InForce", "scales Deployment/web", "shop/web")
    first = build_status(
        o,
        ready,
        decision=decision,
        current_replicas=1,
        fair_share_cores=2.0,
        budget="4 cores (budget.cpu)",
        policy=spec.policy(),
        now="2026-11-25T10:00:00Z",
    )
    assert first["desiredReplicas"] == 2 and first["currentReplicas"] == 1
    assert first["metric"] == "concurrency" and first["metricValue"] == "20"
    conditions = {c["type"]: c for c in first["conditions"]}
    assert conditions["Limited"]["status"] == "True"
    assert conditions["Limited"]["reason"] == "MaxReplicas"
    assert conditions["Limited"]["message"] == "wants 29 replicas, decided 2 (max_replicas 2)"
    again = build_status(
        PolicyObject(o.meta, 1, "t", o.spec, first),
        ready,
        decision=decision,
        current_replicas=2,
        fair_share_cores=2.0,
        budget="4 cores (budget.cpu)",
        policy=spec.policy(),
        now="2026-11-25T10:05:00Z",
    )
    assert [c["lastTransitionTime"] for c in again["conditions"]] == ["2026-11-25T10:00:00Z"] * 4
    refused = build_status(
        o,
        Verdict(False, "Conflict", "older wins", "shop/web"),
        decision=decision,
        current_replicas=1,
        fair_share_cores=None,
        budget=None,
        policy=None,
        now="x",
    )
    assert [c["type"] for c in refused["conditions"]] == ["Ready"]
    assert "desiredReplicas" not in refused
