"""W3C traceparent on raw bytes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.telemetry.propagation import format_traceparent, parse_traceparent

VALID = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_parses_the_spec_example() -> None:
    assert parse_traceparent(VALID) == (
        0x4BF92F3577B34DA6A3CE929D0E0E4736,
        0x00F067AA0BA902B7,
        1,
    )
    assert parse_traceparent(b" " + VALID + b"\t") is not None


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # uppercase
        b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero span id
        b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # forbidden version
        b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",  # v00 has 4 fields
        b"00-4bf92f3577b34da6a3ce929d0e0e47_6-00f067aa0ba902b7-01",  # int() would accept '_'
        b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
    ],
)
def test_rejects_invalid_values(value: bytes) -> None:
    assert parse_traceparent(value) is None


def test_a_future_version_is_read_by_its_first_four_fields() -> None:
    value = b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds"
    assert parse_traceparent(value) == (
        0x4BF92F3577B34DA6A3CE929D0E0E4736,
        0x00F067AA0BA902B7,
        1,
    )


@given(
    st.integers(1, (1 << 128) - 1),
    st.integers(1, (1 << 64) - 1),
    st.integers(0, 255),
)
def test_format_then_parse_round_trips(trace_id: int, span_id: int, flags: int) -> None:
    value = format_traceparent(trace_id, span_id, flags)
    assert len(value) == 55
    assert parse_traceparent(value) == (trace_id, span_id, flags)
