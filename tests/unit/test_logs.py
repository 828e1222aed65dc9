"""The log writer (text | json) and the scaler's short INFO line for a changed decision."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from gateway.telemetry.logs import configure
from scaler.decision import Decision
from scaler.explanation import Clamp, Explanation, Flow, Step
from scaler.loop import LOG_LINE_CHARS, short_reason


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


def test_json_lines_carry_the_records_structured_fields(restore_root: None) -> None:
    out = io.StringIO()
    configure("debug", "json", out)
    log = logging.getLogger("gateway.test")
    log.debug("tick %s", "api", extra={"service": "api", "replicas": 2, "ratio": float("nan")})
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError:
        log.exception("failed")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2  # a multi-line exception stays inside one JSON line
    first, second = (json.loads(line) for line in lines)
    assert first["level"] == "debug" and first["logger"] == "gateway.test"
    assert first["message"] == "tick api"
    assert first["service"] == "api" and first["replicas"] == 2 and first["ratio"] is None
    assert first["time"].endswith("+00:00")
    assert second["level"] == "error" and "RuntimeError: boom" in second["exception"]


def test_the_level_filters_and_text_is_one_plain_line(restore_root: None) -> None:
    out = io.StringIO()
    configure("warning", "text", out)
    logging.getLogger("gateway.test").info("hidden")
    logging.getLogger("gateway.test").warning("shown %d", 1)
    assert out.getvalue().count("\n") == 1
    assert " WARNING gateway.test: shown 1" in out.getvalue()
    with pytest.raises(ValueError, match="log level"):
        configure("verbose")


def decision(parts: tuple[Step | Clamp | Flow, ...]) -> Decision:
    return Decision(
        service="api",
        at=1.0,
        replicas=2,
        cpu_per_replica_cores=0.5,
        allocated_cores=1.0,
        rule="stable",
        explanation=Explanation("stable", {}, parts),
    )


def test_the_info_line_drops_the_input_recap_and_stays_short() -> None:
    windows = Step(
        "kpa.windows",
        {
            "metric": "concurrency",
            "stable": 3.0,
            "stable_window_s": 60,
            "panic": 4.0,
            "panic_window_s": 6,
            "target": 4,
            "target_utilization": 0.7,
            "target_value": 2.8,
            "capacity": 2.0,
        },
    )
    stable = Step("kpa.stable", {"stable": 3.0, "target_value": 2.8, "want": 2})
    line = short_reason(decision((windows, stable, Clamp("replicas", 5, 4, "max_replicas"))))
    assert line == "stable: ceil(3.00/2.8) = 2; clamped replicas 5 -> 4 by max_replicas"
    peers = tuple(f"service-{i}" for i in range(200))
    long = short_reason(decision((stable, Flow("lent", 1.5, peers))))
    assert len(long) == LOG_LINE_CHARS and long.endswith("…")
    # Nothing but the recap: it is what there is to say.
    assert short_reason(decision((windows,))).startswith("concurrency stable 3.00")
