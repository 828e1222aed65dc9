"""Ingress -> routes, backends, policies, workloads: the pure translation."""

from __future__ import annotations

from typing import Any

from gateway.dataplane.updates import RouteRule
from gateway.platforms.kubernetes.ingress_rules import (
    Backend,
    build_table,
    is_ours,
    policy_from_annotations,
)
from gateway.platforms.kubernetes.model import Ingress, Workload, ingress_from_json
from gateway.settings import parse_settings
from scaler.policy import BudgetConfig
from tests.support.kube_objects import ingress


def ing(*args: Any, **kw: Any) -> Ingress:
    return ingress_from_json(ingress(*args, **kw))


def test_class_field_decides_then_legacy_annotation() -> None:
    by_field = ing(
        "a", [], ingress_class="sluice", annotations={"kubernetes.io/ingress.class": "nginx"}
    )
    by_annotation = ing(
        "b", [], ingress_class=None, annotations={"kubernetes.io/ingress.class": "sluice"}
    )
    other = ing(
        "c", [], ingress_class="nginx", annotations={"kubernetes.io/ingress.class": "sluice"}
    )
    neither = ing("d", [], ingress_class=None)
    assert [is_ours(i, "sluice") for i in (by_field, by_annotation, other, neither)] == [
        True,
        True,
        False,
        False,
    ]


def test_rules_hosts_paths_and_default_backend() -> None:
    table = build_table(
        [
            ing(
                "web",
                [
                    ("Shop.Test", "/", "Prefix", "web", 80),
                    ("*.shop.test", "/api", "Exact", "api", "http"),
                    (None, "/img", "ImplementationSpecific", "img", 8080),
                ],
                default_backend=("web", 80),
            )
        ],
        "sluice",
        {},
    )
    assert table.routes.rules == (
        RouteRule("shop/web", "shop.test", "/", "Prefix"),
        RouteRule("shop/api", "*.shop.test", "/api", "Exact"),
        RouteRule("shop/img", None, "/img", "ImplementationSpecific"),
    )
    assert table.routes.default_backend == "shop/web"
    assert table.backends["shop/api"] == Backend("shop", "api", None, "http")
    assert table.backends["shop/img"] == Backend("shop", "img", 8080, None)
    assert table.problems == ()


def test_a_bad_path_drops_only_itself() -> None:
    table = build_table(
        [
            ing(
                "web",
                [
                    ("*.", "/", "Prefix", "web", 80),
                    ("ok.test", "/", "Prefix", "ok", 80),
                    ("ok.test", "x", "Prefix", "x", 80),
                ],
            )
        ],
        "sluice",
        {},
    )
    assert table.routes.rules == (RouteRule("shop/ok", "ok.test", "/", "Prefix"),)
    messages = [p.message for p in table.problems]
    assert (
        "rules[0].http.paths[0].host: a wildcard host needs a domain after '*.', got '*.'"
        in messages
    )
    assert "rules[1].http.paths[1].path: must start with '/', got 'x'" in messages


def test_conflicts_first_by_namespace_and_name_wins() -> None:
    a = ing("a", [("x.test", "/", "Prefix", "one", 80)], default_backend=("one", 80))
    b = ing(
        "b",
        [("x.test", "/", "Prefix", "two", 80), ("y.test", "/", "Prefix", "one", 81)],
        default_backend=("two", 80),
    )
    table = build_table([b, a], "sluice", {})
    assert table.routes.rules[0] == RouteRule("shop/one", "x.test", "/", "Prefix")
    assert table.routes.default_backend == "shop/one"
    assert table.backends["shop/one"].port_number == 80
    assert {p.ingress for p in table.problems} == {"shop/b"}
    assert len(table.problems) == 3


def test_policy_config_first_then_annotations_else_unmanaged() -> None:
    settings = parse_settings({"services": {"shop/web": {"scaling": {"max_replicas": 4}}}})
    table = build_table(
        [
            ing(
                "web",
                [("w.test", "/", "Prefix", "web", 80)],
                annotations={"sluice.io/max-replicas": "9"},
            ),
            ing(
                "api",
                [("a.test", "/", "Prefix", "api", 80)],
                annotations={
                    "sluice.io/scaling": '{"target": 5, "max_replicas": 3}',
                    "sluice.io/max-replicas": "7",
                    "sluice.io/cpu-request": "0.5",
                    "sluice.io/workload": "StatefulSet/api-db",
                },
            ),
            ing("plain", [("p.test", "/", "Prefix", "plain", 80)]),
        ],
        "sluice",
        settings.services,
    )
    assert table.policies["shop/web"].max_replicas == 4
    api = table.policies["shop/api"]
    assert (api.target, api.max_replicas, api.cpu.request) == (5, 7, 0.5)
    assert "shop/plain" not in table.policies
    assert table.workloads == {
        "shop/web": Workload("Deployment", "shop", "web"),
        "shop/api": Workload("StatefulSet", "shop", "api-db"),
    }


def test_annotation_problems_name_the_annotation() -> None:
    cases = {
        "sluice.io/min-replicas": (
            "abc",
            "annotation sluice.io/min-replicas: input should be a valid integer",
        ),
        "sluice.io/cpu-max": ("-1", "annotation sluice.io/cpu-max: must be > 0"),
        "sluice.io/metric": (
            "latency",
            "annotation sluice.io/metric: must be one of concurrency, rps, cpu, got 'latency'",
        ),
        "sluice.io/scaling": (
            "[1, 2]",
            "annotation sluice.io/scaling: must be a JSON/YAML mapping of scaling fields",
        ),
    }
    for key, (value, expected) in cases.items():
        policy, problems = policy_from_annotations({key: value})
        assert any(p.startswith(expected) for p in problems), (key, problems)
    policy, problems = policy_from_annotations({"sluice.io/scaling": "{tolerance: 2}"})
    assert policy is None
    assert problems == ["annotation sluice.io/scaling (tolerance): must be < 1, got 2"]
    assert policy_from_annotations({"other.io/x": "1"}) == (None, [])


def test_annotation_policies_must_fit_the_budget_floors() -> None:
    table = build_table(
        [
            ing(
                "big",
                [("b.test", "/", "Prefix", "big", 80)],
                annotations={"sluice.io/min-replicas": "10", "sluice.io/cpu-min": "1"},
            )
        ],
        "sluice",
        {},
        BudgetConfig(cpu=2),
    )
    assert "shop/big" not in table.policies
    (problem,) = table.problems
    assert "guaranteed CPU (10 cores" in problem.message


def test_bad_workload_annotation() -> None:
    table = build_table(
        [
            ing(
                "w",
                [("w.test", "/", "Prefix", "web", 80)],
                annotations={
                    "sluice.io/workload": "Pod/x, nope=Deployment/y",
                    "sluice.io/target": "3",
                },
            )
        ],
        "sluice",
        {},
    )
    assert table.workloads["shop/web"] == Workload("Deployment", "shop", "web")
    assert len(table.problems) == 2
