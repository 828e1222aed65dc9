"""Config loading: good files load, bad ones give one `file: key.path: problem` line each."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.settings import ConfigError, json_schema, load_settings, parse_settings

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted([ROOT / "config" / "sluice.yaml", *(ROOT / "config" / "examples").glob("*.yaml")])


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_loads(path: Path) -> None:
    settings = load_settings(path)
    assert settings.services


def test_schema_file_is_current() -> None:
    assert (ROOT / "config" / "sluice.schema.json").read_text() == json_schema(), (
        "config/sluice.schema.json is stale: run `sluice schema > config/sluice.schema.json`"
    )


def problems(data: object) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_settings(data, "cfg.yaml")
    return info.value.problems


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"services": {"api": {"routes": [{"path": "/", "path_type": "prefix"}]}}},
            "cfg.yaml: services.api.routes[0].path_type: must be one of Exact, Prefix, "
            "ImplementationSpecific, got 'prefix'",
        ),
        (
            {"services": {"api": {"scaling": {"min_replicas": 3, "max_replicas": 1}}}},
            "cfg.yaml: services.api.scaling.max_replicas: must be >= min_replicas (3), got 1",
        ),
        (
            {"services": {"api": {"endpoints": ["nohost"]}}},
            "cfg.yaml: services.api.endpoints[0]: must be 'host:port' with a port in 1..65535, got 'nohost'",
        ),
        ({"listen": {"port": 70000}}, "cfg.yaml: listen.port: must be <= 65535, got 70000"),
        ({"listne": {}}, "cfg.yaml: listne: unknown key (did you mean 'listen'?)"),
        (
            {"services": {"a": {"scaling": {"cpu": {"min": 0.5, "max": 0.25}}}}},
            "cfg.yaml: services.a.scaling.cpu.max: must be >= min (0.5), got 0.25",
        ),
        (
            {
                "budget": {"cpu": 1},
                "services": {"a": {"scaling": {"min_replicas": 3, "cpu": {"min": 0.5}}}},
            },
            "cfg.yaml: budget.cpu: the services' guaranteed CPU (1.5 cores: a=1.5) exceeds the budget (1)",
        ),
        (
            {"default_backend": "nope", "services": {"a": {}}},
            "cfg.yaml: default_backend: names no service (have: a), got 'nope'",
        ),
        (
            {"services": {"a": {"routes": [{"host": "*.", "path": "/"}]}}},
            "cfg.yaml: services.a.routes[0].host: a wildcard host needs a domain after '*.', got '*.'",
        ),
        (
            {"trusted_proxies": ["10.0.0.0/33"]},
            "cfg.yaml: trusted_proxies[0]: must be an IP address or CIDR network, got '10.0.0.0/33'",
        ),
        ([], "cfg.yaml: the top level must be a mapping, got list"),
        (
            {"services": {"a": {"protocol": "h2"}}},
            "cfg.yaml: services.a.protocol: h2 is HTTP/2 over TLS and needs "
            "upstream_tls.enabled: true (h2c is HTTP/2 over plain TCP)",
        ),
        (
            {"services": {"a": {"protocol": "h2c", "upstream_tls": {"enabled": True}}}},
            "cfg.yaml: services.a.protocol: h2c is HTTP/2 over plain TCP but upstream_tls is "
            "enabled (use protocol: h2)",
        ),
    ],
)
def test_bad_config_names_key_path_and_problem(data: object, expected: str) -> None:
    assert expected in problems(data)


def test_invalid_yaml_reports_line_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("services:\n  api: [1,\n  b: }\n")
    with pytest.raises(ConfigError) as info:
        load_settings(bad)
    (line,) = info.value.problems
    assert line.startswith(f"{bad}:3:")
    assert "invalid YAML" in line


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(tmp_path / "missing.yaml")
    assert info.value.problems == [
        f"{tmp_path / 'missing.yaml'}: cannot read: No such file or directory"
    ]


def test_every_problem_is_reported_at_once() -> None:
    found = problems(
        {
            "services": {
                "a": {"balancer": "random", "routes": [{"path": "x"}], "timeouts": {"connect_s": 0}}
            }
        }
    )
    assert len(found) == 3
