"""The kubernetes: config section: defaults load, bad values name the key."""

from __future__ import annotations

import pytest

from gateway.settings import ConfigError, parse_settings


def test_defaults() -> None:
    k = parse_settings({}).kubernetes
    assert (
        k.ingress_class,
        k.namespaces,
        k.lease.duration_s,
        k.gateway_service.admin_port_name,
    ) == (
        "sluice",
        [],
        15,
        "admin",
    )


def test_kubernetes_config_errors() -> None:
    for data, expected in [
        (
            {"kubernetes": {"namespaces": ["a", "b", "a"]}},
            "c.yaml: kubernetes.namespaces: 'a' is listed twice (entry [2])",
        ),
        (
            {"kubernetes": {"namespaces": ["Bad_NS"]}},
            "c.yaml: kubernetes.namespaces[0]: must be a Kubernetes name (lowercase DNS label, <= 63 chars), got 'Bad_NS'",
        ),
        (
            {"kubernetes": {"lease": {"duration_s": 5, "renew_deadline_s": 6}}},
            "c.yaml: kubernetes.lease.renew_deadline_s: must be < duration_s (5), got 6",
        ),
        (
            {"kubernetes": {"lease": {"retry_period_s": 10}}},
            "c.yaml: kubernetes.lease.retry_period_s: must be < renew_deadline_s (10), got 10",
        ),
        (
            {"kubernetes": {"ingress_class": ""}},
            "c.yaml: kubernetes.ingress_class: must be a Kubernetes name (lowercase DNS subdomain), got ''",
        ),
    ]:
        with pytest.raises(ConfigError) as info:
            parse_settings(data, "c.yaml")
        assert expected in info.value.problems
