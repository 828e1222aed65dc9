"""The telemetry.traces config section, and how it is merged with the OTEL_* environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.settings import ConfigError, TracesConfig, load_settings, parse_settings
from gateway.telemetry.provider import TelemetryError, resolve


def traces(data: dict[str, object]) -> TracesConfig:
    return parse_settings({"telemetry": {"traces": data}}).telemetry.traces


def problems(data: dict[str, object]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_settings({"telemetry": {"traces": data}}, "cfg.yaml")
    return info.value.problems


def test_defaults_are_off_with_full_sampling_and_no_exporter() -> None:
    t = traces({})
    assert t.enabled is False
    assert t.sampler.type == "parentbased_ratio"
    assert t.sampler.ratio == 1.0
    assert t.exporter == "none"
    assert t.endpoint is None
    assert t.buffer.max_traces == 200


def test_a_full_section_loads() -> None:
    t = traces(
        {
            "enabled": True,
            "sampler": {"type": "parentbased_ratio", "ratio": 0.01},
            "exporter": "otlp_grpc",
            "endpoint": "http://collector:4317",
            "headers": {"x-api-key": "secret"},
            "buffer": {"max_traces": 50, "max_spans_per_trace": 10},
        }
    )
    assert t.sampler.ratio == 0.01
    assert t.headers["x-api-key"].get_secret_value() == "secret"
    assert "secret" not in repr(t)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"sampler": {"ratio": 1.5}},
            "cfg.yaml: telemetry.traces.sampler.ratio: must be <= 1, got 1.5",
        ),
        (
            {"sampler": {"ratio": -0.1}},
            "cfg.yaml: telemetry.traces.sampler.ratio: must be >= 0, got -0.1",
        ),
        (
            {"sampler": {"type": "always_on"}},
            "cfg.yaml: telemetry.traces.sampler.type: must be one of parentbased_ratio, got 'always_on'",
        ),
        (
            {"exporter": "jaeger"},
            "cfg.yaml: telemetry.traces.exporter: must be one of otlp_http, otlp_grpc, console, none, "
            "got 'jaeger'",
        ),
        (
            {"exporter": "otlp_http", "endpoint": "collector:4318"},
            "cfg.yaml: telemetry.traces.endpoint: must be an http:// or https:// URL with a host, "
            "got 'collector:4318'",
        ),
        (
            {"exporter": "console", "endpoint": "http://collector:4318"},
            "cfg.yaml: telemetry.traces.endpoint: only applies to the otlp_http and otlp_grpc "
            "exporters, exporter is 'console'",
        ),
        (
            {"exporter": "otlp_http", "headers": {"bad header": "x"}},
            "cfg.yaml: telemetry.traces.headers.bad header: must be an HTTP header name "
            "(letters, digits, '-', ...)",
        ),
        (
            {"buffer": {"max_spans_per_trace": 0}},
            "cfg.yaml: telemetry.traces.buffer.max_spans_per_trace: must be >= 1, got 0",
        ),
        (
            {"sampling": 0.5},
            "cfg.yaml: telemetry.traces.sampling: unknown key (did you mean 'sampler'?)",
        ),
    ],
)
def test_bad_values_name_the_key(data: dict[str, object], expected: str) -> None:
    assert problems(data) == [expected]


def test_file_keys_win_over_the_environment() -> None:
    env = {
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.25",
        "OTEL_TRACES_EXPORTER": "console",
    }
    setup = resolve(
        traces({"enabled": True, "sampler": {"ratio": 0.5}, "exporter": "otlp_http"}), env
    )
    assert setup.ratio == 0.5
    assert setup.exporter == "otlp_http"


def test_the_environment_fills_keys_the_file_leaves_out() -> None:
    env = {
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.25",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
    }
    setup = resolve(traces({"enabled": True}), env)
    assert setup.ratio == 0.25
    assert setup.exporter == "otlp_grpc"
    assert resolve(traces({"enabled": True}), {"OTEL_TRACES_EXPORTER": "otlp"}).exporter == (
        "otlp_http"
    )
    assert resolve(traces({}), {"OTEL_TRACES_SAMPLER": "parentbased_always_off"}).ratio == 0.0


def test_sdk_disabled_turns_tracing_off() -> None:
    assert resolve(traces({"enabled": True}), {"OTEL_SDK_DISABLED": "true"}).enabled is False
    assert resolve(traces({"enabled": True}), {"OTEL_SDK_DISABLED": "false"}).enabled is True


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"OTEL_TRACES_SAMPLER": "always_on"},
            "OTEL_TRACES_SAMPLER: Sluice samples parent-based only: must be one of "
            "parentbased_traceidratio, parentbased_always_on, parentbased_always_off, got 'always_on'",
        ),
        (
            {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "lots"},
            "OTEL_TRACES_SAMPLER_ARG: must be a ratio in 0..1, got 'lots'",
        ),
        (
            {"OTEL_TRACES_EXPORTER": "zipkin"},
            "OTEL_TRACES_EXPORTER: must be one of otlp, console, none, got 'zipkin'",
        ),
    ],
)
def test_bad_environment_values_are_refused_clearly(env: dict[str, str], expected: str) -> None:
    with pytest.raises(TelemetryError) as info:
        resolve(traces({"enabled": True}), env)
    assert str(info.value) == expected


def test_telemetry_changes_need_a_restart(tmp_path: Path) -> None:
    from gateway.admin.reload import Reloader

    path = tmp_path / "sluice.yaml"
    path.write_text("telemetry: {traces: {enabled: false}}\n")
    settings = load_settings(path)
    applied: list[object] = []
    reloader = Reloader(path, settings, applied.append)
    path.write_text("telemetry: {traces: {enabled: true}}\n")
    result = reloader.reload("test")
    assert result.problems == [
        f"{path}: telemetry: cannot change while running (restart Sluice to apply it)"
    ]
    assert applied == []
