"""The lean h2 connection against h2's and hyperframe's own: the same bytes on the wire, the
same frames parsed, the same events, the same limits."""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.frame_buffer
import h2.settings
import pytest
from hyperframe.frame import ContinuationFrame, DataFrame, HeadersFrame

from gateway.dataplane.h2lean import LeanConnection, LeanFrameBuffer, new_frame

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def _config(client: bool) -> h2.config.H2Configuration:
    return h2.config.H2Configuration(
        client_side=client,
        header_encoding=None,
        validate_inbound_headers=False,
        normalize_inbound_headers=False,
        validate_outbound_headers=False,
        normalize_outbound_headers=False,
    )


@pytest.mark.parametrize(
    ("cls", "flags"),
    [
        (DataFrame, ()),
        (DataFrame, ("END_STREAM",)),
        (HeadersFrame, ("END_HEADERS",)),
        (HeadersFrame, ("END_HEADERS", "END_STREAM")),
        (ContinuationFrame, ("END_HEADERS",)),
    ],
)
def test_new_frames_are_the_frames_hyperframe_builds(cls: type, flags: tuple[str, ...]) -> None:
    lean, reference = new_frame(cls, 7), cls(7)
    for frame in (lean, reference):
        frame.data = b"payload"
        for flag in flags:
            frame.flags.add(flag)
    assert type(lean) is cls
    assert lean.serialize() == reference.serialize()
    assert vars(lean).keys() == vars(reference).keys()
    with pytest.raises(ValueError, match="Unexpected flag"):
        lean.flags.add("ACK")


def _frames(buffer: h2.frame_buffer.FrameBuffer, data: bytes) -> list[tuple[object, ...]]:
    buffer.add_data(data)
    return [
        (type(f), f.stream_id, sorted(f.flags), getattr(f, "data", None), f.body_len)
        for f in buffer
    ]


def test_the_frame_buffer_parses_what_h2s_parses() -> None:
    padded = DataFrame(3, flags=["PADDED", "END_STREAM"])
    padded.data, padded.pad_length = b"abc", 4
    priority = HeadersFrame(5, flags=["PRIORITY", "END_HEADERS"])
    priority.data, priority.depends_on, priority.stream_weight = b"\x82", 3, 16
    split = HeadersFrame(9)
    split.data = b"\x82\x84"
    more = ContinuationFrame(9, flags=["END_HEADERS"])
    more.data = b"\x86"
    frames = [padded, priority, split, more, DataFrame(9, data=b"x" * 100)]
    wire = b"".join(f.serialize() for f in frames)
    lean, reference = LeanFrameBuffer(server=False), h2.frame_buffer.FrameBuffer(server=False)
    lean.max_frame_size = reference.max_frame_size = 16384
    # Byte by byte too: a frame split across reads waits for the rest.
    assert _frames(lean, wire) == _frames(reference, wire)
    one_by_one = []
    for i in range(len(wire)):
        one_by_one += _frames(lean, wire[i : i + 1])
    assert one_by_one == _frames(reference, wire)


def test_a_data_frame_on_stream_zero_is_a_protocol_error() -> None:
    bad = b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x"
    for buffer in (LeanFrameBuffer(server=False), h2.frame_buffer.FrameBuffer(server=False)):
        buffer.add_data(bad)
        with pytest.raises(h2.exceptions.ProtocolError, match="invalid header"):
            next(iter(buffer))


def test_validation_left_on_is_refused() -> None:
    with pytest.raises(ValueError, match="as they are"):
        LeanConnection(h2.config.H2Configuration(client_side=True))


REQUEST = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/a"), (b":authority", b"x")]
RESPONSE = [(b":status", b"200"), (b"content-type", b"application/grpc")]
TRAILERS = [(b"grpc-status", b"0")]


def _pair(
    client_cls: type[h2.connection.H2Connection],
    server_cls: type[h2.connection.H2Connection],
    max_streams: int = 100,
) -> tuple[h2.connection.H2Connection, h2.connection.H2Connection]:
    client = client_cls(_config(True))
    server = server_cls(_config(False))
    server.local_settings = h2.settings.Settings(
        client=False,
        initial_values={h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: max_streams},
    )
    client.initiate_connection()
    server.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    return client, server


def _exchange(
    client: h2.connection.H2Connection, server: h2.connection.H2Connection, sid: int
) -> list[tuple[object, ...]]:
    """One call with a body, a response, a body and trailers; the events on both sides."""
    seen: list[tuple[object, ...]] = []

    def note(events: list[h2.events.Event]) -> None:
        for e in events:
            seen.append((type(e).__name__, getattr(e, "headers", None), getattr(e, "data", None)))

    client.send_headers(sid, REQUEST)
    client.send_data(sid, b"hello", end_stream=True)
    note(server.receive_data(client.data_to_send()))
    server.send_headers(sid, RESPONSE)
    server.send_data(sid, b"world")
    server.send_headers(sid, TRAILERS, end_stream=True)
    note(client.receive_data(server.data_to_send()))
    return seen


def test_a_call_goes_as_between_h2_connections() -> None:
    H2 = h2.connection.H2Connection
    for client_cls, server_cls in ((LeanConnection, LeanConnection), (LeanConnection, H2)):
        lean = _pair(client_cls, server_cls)
        ref = _pair(H2, H2)
        for sid in (1, 3, 5):
            assert _exchange(*lean, sid) == _exchange(*ref, sid)
        kept = lean[0].streams
        assert kept.keys() >= ref[0].streams.keys()
        assert all(kept[sid].closed for sid in kept.keys() - ref[0].streams.keys())


def test_the_concurrent_stream_limit_holds_and_closed_streams_are_forgotten() -> None:
    limit = 4
    client, server = _pair(LeanConnection, LeanConnection, limit)
    for sid in range(1, 2 * limit, 2):
        client.send_headers(sid, REQUEST)
    with pytest.raises(h2.exceptions.TooManyStreamsError):
        client.send_headers(2 * limit + 1, REQUEST)
    # Streams that end make room; many calls later, few streams are kept.
    server.receive_data(client.data_to_send())
    for sid in range(1, 2 * limit, 2):
        client.end_stream(sid)
        server.send_headers(sid, RESPONSE, end_stream=True)
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    sid = 2 * limit + 1
    for _ in range(200):
        _exchange(client, server, sid)
        sid += 2
    assert len(client.streams) <= limit
    assert len(server.streams) <= limit


def test_the_servers_own_limit_refuses_one_stream_too_many() -> None:
    client, server = _pair(h2.connection.H2Connection, LeanConnection, 2)
    client.remote_settings.acknowledge()  # (a client that ignores the limit)
    client.remote_settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = 100
    client.remote_settings.acknowledge()
    for sid in (1, 3, 5):
        client.send_headers(sid, REQUEST)
    with pytest.raises(h2.exceptions.TooManyStreamsError):
        server.receive_data(client.data_to_send())
