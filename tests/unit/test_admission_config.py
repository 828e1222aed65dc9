"""Issue 4 config keys: keyed errors, defaults, the admin token rule and token_env."""

from __future__ import annotations

import pytest

from gateway.settings import (
    ConfigError,
    is_loopback_host,
    parse_settings,
    resolve_admin_token,
)

TOKEN = "x" * 32


def problems(data: object) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_settings(data, "cfg.yaml")
    return info.value.problems


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"admin": {"host": "0.0.0.0"}},
            "cfg.yaml: admin.token: is required when admin.host is not a loopback address "
            "(got host '0.0.0.0')",
        ),
        (
            {"admin": {"token": "short"}},
            "cfg.yaml: admin.token: must be at least 32 characters, got 5",
        ),
        (
            {"admin": {"token": TOKEN, "token_env": "T"}},
            "cfg.yaml: admin.token_env: set token or token_env, not both",
        ),
        (
            {"services": {"a": {"limits": {"queue": {"max": -1}}}}},
            "cfg.yaml: services.a.limits.queue.max: must be >= 0, got -1",
        ),
        (
            {"services": {"a": {"limits": {"queue": {"timeout_s": 0}}}}},
            "cfg.yaml: services.a.limits.queue.timeout_s: must be > 0, got 0",
        ),
        (
            {"services": {"a": {"limits": {"queue": {"cold_start_timeout_s": -1}}}}},
            "cfg.yaml: services.a.limits.queue.cold_start_timeout_s: must be > 0, got -1",
        ),
        (
            {"services": {"a": {"limits": {"queue": {"cold_start_max": -1}}}}},
            "cfg.yaml: services.a.limits.queue.cold_start_max: must be >= 0, got -1",
        ),
        (
            {"services": {"a": {"limits": {"concurrency_per_replica": 0}}}},
            "cfg.yaml: services.a.limits.concurrency_per_replica: must be >= 1, got 0",
        ),
        (
            {"services": {"a": {"limits": {"rate_limit": {"rps": 0}}}}},
            "cfg.yaml: services.a.limits.rate_limit.rps: must be > 0, got 0",
        ),
        (
            {"services": {"a": {"retries": {"retry_on": ["5xx"]}}}},
            "cfg.yaml: services.a.retries.retry_on[0]: must be one of connect-failure, reset, got '5xx'",
        ),
        (
            {
                "services": {
                    "a": {"outlier_detection": {"base_ejection_s": 60, "max_ejection_s": 10}}
                }
            },
            "cfg.yaml: services.a.outlier_detection.max_ejection_s: must be >= base_ejection_s (60), got 10",
        ),
        (
            {"services": {"a": {"outlier_detection": {"max_ejection_percent": 101}}}},
            "cfg.yaml: services.a.outlier_detection.max_ejection_percent: must be <= 100, got 101",
        ),
        ({"limits": {"max_headers": 0}}, "cfg.yaml: limits.max_headers: must be >= 1, got 0"),
        ({"shutdown": {"drain_s": -1}}, "cfg.yaml: shutdown.drain_s: must be >= 0, got -1"),
    ],
)
def test_keyed_errors(data: object, expected: str) -> None:
    assert expected in problems(data)


def test_defaults() -> None:
    s = parse_settings({"services": {"a": {}}})
    a = s.services["a"]
    assert a.limits.concurrency_per_replica is None and a.limits.rate_limit is None
    assert (a.limits.queue.max, a.limits.queue.timeout_s) == (100, 10.0)
    assert (a.limits.queue.cold_start_max, a.limits.queue.cold_start_timeout_s) == (10000, 300.0)
    assert (
        a.retries.max_attempts == 2 and a.retries.budget_percent == 20 and a.retries.budget_min == 3
    )
    assert a.outlier_detection.consecutive_failures == 5
    assert (s.limits.max_header_bytes, s.limits.max_headers, s.limits.max_uri_bytes) == (
        32768,
        100,
        8192,
    )
    assert s.admin.host == "127.0.0.1" and s.admin.token is None


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.1", False),
        ("example.com", False),
    ],
)
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_token_env_is_resolved_at_start() -> None:
    s = parse_settings({"admin": {"host": "0.0.0.0", "token_env": "SLUICE_T"}})
    assert s.admin.token is None
    resolved = resolve_admin_token(s, {"SLUICE_T": TOKEN}, "cfg.yaml")
    assert resolved.admin.token is not None
    assert resolved.admin.token.get_secret_value() == TOKEN
    with pytest.raises(ConfigError) as info:
        resolve_admin_token(s, {}, "cfg.yaml")
    assert info.value.problems == [
        "cfg.yaml: admin.token_env: environment variable SLUICE_T is not set"
    ]
    with pytest.raises(ConfigError) as info:
        resolve_admin_token(s, {"SLUICE_T": "short"}, "cfg.yaml")
    assert info.value.problems == [
        "cfg.yaml: admin.token_env: SLUICE_T must hold at least 32 characters, got 5"
    ]


def test_rate_limit_burst_default() -> None:
    s = parse_settings({"services": {"a": {"limits": {"rate_limit": {"rps": 2.5}}}}})
    rate = s.services["a"].limits.rate_limit
    assert rate is not None and rate.burst_requests == 3
