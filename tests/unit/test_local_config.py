"""The ``replicas:`` config of the local platform: good configs load, bad ones name the key."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from gateway.platforms.local.replicas import render_command
from gateway.settings import ConfigError, parse_settings


def local(services: dict[str, Any]) -> dict[str, Any]:
    return {"platform": "local", "services": services}


def replicas(**over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"command": ["app", "--port", "{port}"], "port_range": [9100, 9119]}
    spec.update(over)
    return spec


def problems(data: object) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_settings(data, "cfg.yaml")
    return info.value.problems


def test_a_local_service_loads_with_defaults() -> None:
    settings = parse_settings(local({"api": {"replicas": replicas()}}))
    spec = settings.services["api"].replicas
    assert spec is not None
    assert spec.port_range == (9100, 9119)
    assert spec.readiness.path == "/healthz"
    assert spec.grace_s == 10.0
    assert spec.port_count == 20


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            local({"api": {}}),
            "cfg.yaml: services.api.replicas: is required when platform is local "
            "(command and port_range of the replicas)",
        ),
        (
            local({"api": {"replicas": replicas(command=[])}}),
            "cfg.yaml: services.api.replicas.command: must name a program to run, got an empty command",
        ),
        (
            local({"api": {"replicas": replicas(command=[" "])}}),
            "cfg.yaml: services.api.replicas.command: must name a program to run, got an empty command",
        ),
        (
            local({"api": {"replicas": replicas(port_range=[9200, 9100])}}),
            "cfg.yaml: services.api.replicas.port_range: end must be >= start (9200), got 9100",
        ),
        (
            local({"api": {"replicas": replicas(port_range=[0, 9100])}}),
            "cfg.yaml: services.api.replicas.port_range: start must be in 1..65535, got 0",
        ),
        (
            local({"api": {"replicas": replicas(port_range=[9100, 70000])}}),
            "cfg.yaml: services.api.replicas.port_range: end must be in 1..65535, got 70000",
        ),
        (
            local({"api": {"replicas": replicas(port_range=[9100])}}),
            "cfg.yaml: services.api.replicas.port_range[1]: is required",
        ),
        (
            local({"api": {"replicas": replicas(port_range=[9100, 9101])}}),
            "cfg.yaml: services.api.replicas.port_range: holds 2 port(s), fewer than "
            "scaling.max_replicas (10)",
        ),
        (
            local(
                {
                    "a": {"replicas": replicas(port_range=[9100, 9119])},
                    "b": {"replicas": replicas(port_range=[9110, 9139])},
                }
            ),
            "cfg.yaml: services.b.replicas.port_range: [9110, 9139] overlaps "
            "services.a.replicas.port_range [9100, 9119]",
        ),
        (
            local(
                {
                    "shop/api": {"replicas": replicas(port_range=[9100, 9119])},
                    "shop_api": {"replicas": replicas(port_range=[9200, 9219])},
                }
            ),
            "cfg.yaml: services.shop_api: its replicas' cgroup name 'shop_api' is also "
            "services.shop/api's ('/' becomes '_' there): rename one of them",
        ),
        (
            local({"api": {"replicas": replicas(), "endpoints": ["127.0.0.1:9001"]}}),
            "cfg.yaml: services.api.endpoints: must be empty when platform is local "
            "(Sluice starts the replicas itself)",
        ),
        (
            local({"api": {"replicas": replicas(readiness={"path": "healthz"})}}),
            "cfg.yaml: services.api.replicas.readiness.path: must start with '/', got 'healthz'",
        ),
        (
            local({"api": {"replicas": replicas(readiness={"timeout_s": 0})}}),
            "cfg.yaml: services.api.replicas.readiness.timeout_s: must be > 0, got 0",
        ),
        (
            local({"api": {"replicas": replicas(grace_s=-1)}}),
            "cfg.yaml: services.api.replicas.grace_s: must be >= 0, got -1",
        ),
        (
            local({"api": {"replicas": replicas(restart_backoff_s=5, restart_backoff_max_s=1)}}),
            "cfg.yaml: services.api.replicas.restart_backoff_max_s: must be >= restart_backoff_s (5), got 1",
        ),
        (
            local({"api": {"replicas": replicas(env={"A=B": "x"})}}),
            "cfg.yaml: services.api.replicas.env.A=B: is not a valid environment variable name",
        ),
        (
            local({"api": {"replicas": replicas(comand=["x"])}}),
            "cfg.yaml: services.api.replicas.comand: unknown key (did you mean 'command'?)",
        ),
    ],
)
def test_bad_replicas_config_names_the_key(data: object, expected: str) -> None:
    assert expected in problems(data)


def test_static_platform_does_not_require_replicas() -> None:
    settings = parse_settings({"services": {"api": {"endpoints": ["127.0.0.1:9001"]}}})
    assert settings.services["api"].replicas is None


def test_command_substitutes_port_and_python() -> None:
    argv = render_command(["{python}", "-m", "app", "--port={port}", "{port}"], 9123)
    assert argv == [sys.executable, "-m", "app", "--port=9123", "9123"]


def test_the_local_example_builds_a_platform_at_min_replicas_and_initial_cpu() -> None:
    from pathlib import Path

    from gateway.platforms.local.discovery import local_parts
    from gateway.settings import load_settings

    root = Path(__file__).resolve().parents[2]
    settings = load_settings(root / "config" / "examples" / "local.yaml")
    platform = local_parts(settings)
    statuses = platform.pool.statuses()
    assert sorted(statuses) == ["api", "reports"]
    assert (statuses["api"].desired, statuses["api"].cpu_per_replica_cores) == (1, 0.25)
    assert (statuses["reports"].desired, statuses["reports"].cpu_per_replica_cores) == (0, 0.25)
    assert platform.endpoints.pool is platform.pool is platform.actuator.pool
    assert platform.pool.total_cpu_cores == settings.budget.cpu == 2
    # budget.enforcement defaults to auto: share when the budget (2 cores) is every CPU this
    # process may use, else limit -- where the decided CPU (cpu.request until the first
    # decision) is each replica's hard cap.
    from gateway.platforms.machine import machine_cpu

    rule = "share" if machine_cpu().cores <= 2 else "limit"
    assert settings.budget.enforcement == "auto"
    assert platform.pool.enforcement == rule
    for status in statuses.values():
        assert status.enforcement == rule
        assert status.cpu_per_replica_cores == 0.25
        if rule == "limit":
            assert status.cpu_cap_per_replica_cores == 0.25


def test_limit_written_out_makes_the_decided_cpu_a_hard_cap() -> None:
    from pathlib import Path

    from gateway.platforms.local.discovery import local_parts
    from gateway.settings import load_settings

    root = Path(__file__).resolve().parents[2]
    settings = load_settings(root / "config" / "examples" / "local.yaml")
    budget = settings.budget.model_copy(update={"enforcement": "limit"})
    platform = local_parts(settings.model_copy(update={"budget": budget}))
    assert platform.pool.enforcement == "limit"
    for status in platform.pool.statuses().values():
        assert status.enforcement == "limit"
        assert status.cpu_cap_per_replica_cores == status.cpu_per_replica_cores == 0.25


def test_share_enforcement_reaches_the_pool() -> None:
    from pathlib import Path

    import yaml

    from gateway.platforms.local.discovery import local_parts

    root = Path(__file__).resolve().parents[2]
    data = yaml.safe_load((root / "config" / "examples" / "local.yaml").read_text())
    data.setdefault("budget", {})["enforcement"] = "share"
    settings = parse_settings(data)
    platform = local_parts(settings)
    assert platform.pool.enforcement == "share"
    # Each replica is capped at its service's cpu.max; each service is entitled to its fair
    # share of the budget (its cgroup's weight): reports has weight 2.
    entitled = {"api": 2 / 3, "reports": 4 / 3}
    for name, status in platform.pool.statuses().items():
        assert status.enforcement == "share"
        assert status.cpu_per_replica_cores == 0.25
        assert status.cpu_cap_per_replica_cores == settings.services[name].scaling.cpu.max
        assert status.entitlement_cores == pytest.approx(entitled[name])


def test_local_platform_refuses_a_service_without_replicas() -> None:
    from gateway.platforms.local.discovery import local_parts

    settings = parse_settings({"services": {"api": {}}})
    with pytest.raises(ValueError, match=r"services\.api\.replicas is required"):
        local_parts(settings)


def test_problems_in_several_replicas_keys_are_reported_together() -> None:
    found = problems(local({"b": {"replicas": replicas(command=[], port_range=[9000, 8000])}}))
    assert found == [
        "cfg.yaml: services.b.replicas.command: must name a program to run, got an empty command",
        "cfg.yaml: services.b.replicas.port_range: end must be >= start (9000), got 8000",
    ]
