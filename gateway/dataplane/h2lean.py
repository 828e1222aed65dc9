"""``h2``'s connection with lean hot paths (:class:`LeanConnection`): the same framing, stream
state machines and flow control as ``h2`` 4.x, without the per-frame and per-stream work a
proxy does not use.

* Frames of the hot types (DATA, HEADERS, CONTINUATION) are built from a prototype
  (:func:`new_frame`) instead of ``hyperframe``'s constructor chains, and serialized by
  :meth:`LeanConnection._prepare_for_sending` from their fields when unpadded.
* Streams (:class:`LeanStream`) send and receive header blocks without building the
  validation flags, re-encoding names to UTF-8 or copying through generators: validation
  and normalisation are off on both sides (the gateway checks fields in one pass, see
  ``h2server.http1_fields`` and ``h2upstream.response_head``), names and values are bytes.
* Open streams are counted against ``SETTINGS_MAX_CONCURRENT_STREAMS`` without a scan of
  every stream per new stream while the number of streams kept is below the limit.
* Frames are received without ``h2`` formatting each one for a trace log it then
  discards, and a received GOAWAY leaves the connection open (see :class:`LeanConnection`).

Every such override is of ``h2``/``hyperframe`` internals: pinned to ``h2`` 4.x.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, TypeVar

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.frame_buffer
import h2.settings
import h2.stream
from h2.stream import StreamInputs
from h2.utilities import authority_from_headers, extract_method_header
from hyperframe.exceptions import InvalidDataError, InvalidFrameError
from hyperframe.flags import Flags
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    RstStreamFrame,
)

from gateway.dataplane.h2encode import install as install_hpack

_HEADER = struct.Struct(">HBBBL")
"""A frame header: length (24 bits, as 16 + 8), type, flags, stream id."""
_LEAN_TYPES = (DataFrame, HeadersFrame, ContinuationFrame)
_Lean = TypeVar("_Lean", DataFrame, HeadersFrame, ContinuationFrame)


def _prototype(cls: type[Frame]) -> tuple[dict[str, Any], set[str], dict[str, int]]:
    frame = cls(1)
    attrs = {k: v for k, v in vars(frame).items() if k not in {"flags", "stream_id"}}
    return attrs, {flag.name for flag in cls.defined_flags}, dict(cls.defined_flags)


_PROTOTYPES = {cls: _prototype(cls) for cls in _LEAN_TYPES}
_BY_TYPE: dict[int, type[Frame]] = {cls.type: cls for cls in _LEAN_TYPES}
_FLAG_NAMES: dict[tuple[type[Frame], int], frozenset[str]] = {
    (cls, byte): frozenset(name for name, bit in cls.defined_flags if byte & bit)
    for cls in _LEAN_TYPES
    for byte in range(256)
}
"""The flags a flag byte sets on a frame of each lean type."""
_UNPLAIN = frozenset({"PADDED", "PRIORITY"})
"""Flags whose fields are serialized by ``hyperframe`` itself (never sent by the gateway)."""


def new_frame(cls: type[_Lean], stream_id: int) -> _Lean:
    """A blank frame of a lean type on a stream (> 0), as ``cls(stream_id)`` builds it."""
    frame = cls.__new__(cls)
    attrs, valid, _ = _PROTOTYPES[cls]
    frame.__dict__.update(attrs)
    flags = Flags.__new__(Flags)
    flags._valid_flags = valid  # (shared, never changed: Flags only reads it)
    flags._flags = set()
    frame.flags = flags
    frame.stream_id = stream_id
    return frame


class LeanFrameBuffer(h2.frame_buffer.FrameBuffer):
    """``h2``'s frame buffer, building frames of the lean types from their header directly
    (``Frame.parse_frame_header`` for the others); the rest of ``__next__`` is ``h2``'s."""

    def __next__(self) -> Frame:
        data = self._data
        if len(data) < 9:
            raise StopIteration
        high, low, kind, flag_byte, stream_id = _HEADER.unpack_from(data)
        length = (high << 8) + low
        stream_id &= 0x7FFFFFFF
        cls = _BY_TYPE.get(kind)
        f: Frame
        if cls is not None and stream_id:
            f = new_frame(cls, stream_id)  # type: ignore[type-var]
            f.flags._flags = set(_FLAG_NAMES[cls, flag_byte])
        else:
            try:
                f, length = Frame.parse_frame_header(memoryview(data[:9]))
            except (InvalidDataError, InvalidFrameError) as err:
                msg = f"Received frame with invalid header: {err!s}"
                raise h2.exceptions.ProtocolError(msg) from err
        if len(data) < length + 9:
            raise StopIteration
        self._validate_frame_length(length)
        try:
            f.parse_body(memoryview(data[9 : 9 + length]))
        except InvalidDataError as err:
            msg = "Received frame with non-compliant data"
            raise h2.exceptions.ProtocolError(msg) from err
        except InvalidFrameError as err:
            msg = "Frame data missing or invalid"
            raise h2.exceptions.FrameDataMissingError(msg) from err
        del data[: 9 + length]
        new_f = self._update_header_buffer(f)
        return new_f if new_f is not None else self.__next__()


def _informational(headers: Sequence[tuple[bytes, bytes]]) -> bool:
    """A ``:status`` of 1xx among the leading pseudo-header fields (as ``h2`` checks)."""
    for name, value in headers:
        if name[:1] != b":":
            return False
        if name == b":status":
            return value[:1] == b"1"
    return False


class LeanStream(h2.stream.H2Stream):
    """``h2``'s stream, sending and receiving header blocks and DATA the lean way (see the
    module's docstring); the state machine's transitions are ``h2``'s, in the same order."""

    def send_headers(  # type: ignore[override]
        self,
        headers: Sequence[tuple[bytes, bytes]],
        encoder: Any,
        end_stream: bool = False,
    ) -> list[Frame]:
        machine = self.state_machine
        input_ = StreamInputs.SEND_HEADERS
        if not machine.client and _informational(headers):
            if end_stream:
                msg = "Cannot set END_STREAM on informational responses."
                raise h2.exceptions.ProtocolError(msg)
            input_ = StreamInputs.SEND_INFORMATIONAL_HEADERS
        machine.process_input(input_)
        block = encoder.encode(headers)
        size = self.max_outbound_frame_size or 0
        first = new_frame(HeadersFrame, self.stream_id)
        frames: list[Frame] = [first]
        if len(block) <= size:
            first.data = block
        else:
            first.data = block[:size]
            for i in range(size, len(block), size):
                more = new_frame(ContinuationFrame, self.stream_id)
                more.data = block[i : i + size]
                frames.append(more)
        frames[-1].flags._flags.add("END_HEADERS")
        if end_stream:
            machine.process_input(StreamInputs.SEND_END_STREAM)
            first.flags._flags.add("END_STREAM")
        if machine.trailers_sent and not end_stream:
            msg = "Trailers must have END_STREAM set."
            raise h2.exceptions.ProtocolError(msg)
        if machine.client:
            if self._authority is None:
                self._authority = authority_from_headers(headers)
            self.request_method = extract_method_header(headers)
        else:
            self.request_method = None  # (a response has no :method)
        return frames

    def send_data(
        self, data: bytes | memoryview, end_stream: bool = False, pad_length: int | None = None
    ) -> list[Frame]:
        if pad_length is not None:
            return super().send_data(data, end_stream, pad_length)
        machine = self.state_machine
        machine.process_input(StreamInputs.SEND_DATA)
        frame = new_frame(DataFrame, self.stream_id)
        frame.data = data.tobytes() if isinstance(data, memoryview) else data
        if end_stream:
            machine.process_input(StreamInputs.SEND_END_STREAM)
            frame.flags._flags.add("END_STREAM")
        self.outbound_flow_control_window -= len(frame.data)
        return [frame]

    def receive_headers(
        self,
        headers: Any,
        end_stream: bool,
        header_encoding: bool | str | None,
    ) -> tuple[list[Frame], list[h2.events.Event]]:
        if header_encoding:
            return super().receive_headers(headers, end_stream, header_encoding)
        machine = self.state_machine
        if _informational(headers):
            if end_stream:
                msg = "Cannot set END_STREAM on informational responses"
                raise h2.exceptions.ProtocolError(msg)
            input_ = StreamInputs.RECV_INFORMATIONAL_HEADERS
        else:
            input_ = StreamInputs.RECV_HEADERS
        events = machine.process_input(input_)
        event: Any = events[0]
        if end_stream:
            ended = machine.process_input(StreamInputs.RECV_END_STREAM)
            event.stream_ended = ended[0]
            events += ended
        self._initialize_content_length(headers)
        if isinstance(event, h2.events.TrailersReceived) and not end_stream:
            msg = "Trailers must have END_STREAM set"
            raise h2.exceptions.ProtocolError(msg)
        event.headers = list(headers)
        return [], events


_STREAMS_KEPT_MIN = 16
"""Streams kept beyond twice the open ones at the last count before counting again."""


class LeanConnection(h2.connection.H2Connection):
    """``h2``'s connection with the lean hot paths of this module and the gateway's HPACK
    encoder and decoder (``h2encode``).

    Frames are received without formatting each one for a trace log
    (``H2Connection._receive_frame`` computes ``repr(frame)`` for every frame received, for a
    logger that then discards it; the rest of that method is ``h2``'s own), and the
    connection stays open after a GOAWAY it receives: ``h2`` would close its state machine
    (and drop what it had to send), so the streams the peer still answers or expects answers
    on (RFC 9113 §6.8) would end in a protocol error.  A GOAWAY is only reported
    (``ConnectionTerminated``); the owner decides what follows."""

    def __init__(self, config: h2.config.H2Configuration) -> None:
        if (
            config.validate_inbound_headers
            or config.normalize_inbound_headers
            or config.validate_outbound_headers
            or config.normalize_outbound_headers
        ):
            raise ValueError("LeanConnection sends and receives fields as they are")
        super().__init__(config)
        self._frame_dispatch_table[GoAwayFrame] = _goaway_event
        self.incoming_buffer = LeanFrameBuffer(server=not config.client_side)
        install_hpack(self)
        self._recount_at = _STREAMS_KEPT_MIN
        """Streams kept (open or closed) at which open ones are counted again."""

    def _begin_new_stream(
        self, stream_id: int, allowed_ids: h2.connection.AllowedStreamIDs
    ) -> h2.stream.H2Stream:
        outbound = self._stream_id_is_outbound(stream_id)
        highest = self.highest_outbound_stream_id if outbound else self.highest_inbound_stream_id
        if stream_id <= highest:
            raise h2.exceptions.StreamIDTooLowError(stream_id, highest)
        if (stream_id % 2) != int(allowed_ids):
            msg = "Invalid stream ID for peer."
            raise h2.exceptions.ProtocolError(msg)
        s = LeanStream(
            stream_id,
            config=self.config,
            inbound_window_size=self.local_settings.initial_window_size,
            outbound_window_size=self.remote_settings.initial_window_size,
        )
        s.max_outbound_frame_size = self.max_outbound_frame_size
        self.streams[stream_id] = s
        if outbound:
            self.highest_outbound_stream_id = stream_id
        else:
            self.highest_inbound_stream_id = stream_id
        return s

    def _open_streams(self, remainder: int) -> int:
        """``h2`` counts the open streams (and forgets closed ones) by a scan of every stream
        kept, before each new stream, only to compare the count with the peer's or its own
        ``SETTINGS_MAX_CONCURRENT_STREAMS``.  While fewer streams than that limit are kept,
        open or not, the comparison cannot fail: their number stands in for the count (an
        upper bound), and the scan runs once the streams kept reach the limit or twice the
        open ones at the last scan (so closed streams are still forgotten, at O(1) a stream)."""
        kept = len(self.streams)
        if remainder == int(self.config.client_side):
            limit = self.remote_settings.max_concurrent_streams
        else:
            limit = self.local_settings.max_concurrent_streams
        if kept < limit and kept < self._recount_at:
            return kept
        count = super()._open_streams(remainder)
        self._recount_at = 2 * len(self.streams) + _STREAMS_KEPT_MIN
        return count

    def _prepare_for_sending(self, frames: list[Frame]) -> None:
        if not frames:
            return
        out = self._data_to_send
        size = self.max_outbound_frame_size
        for f in frames:
            cls = f.__class__
            flags = f.flags._flags
            if cls in _PROTOTYPES and not (flags & _UNPLAIN):
                data: bytes = f.data  # type: ignore[attr-defined]
                n = f.body_len = len(data)
                bits = _PROTOTYPES[cls][2]
                byte = 0
                for name in flags:
                    byte |= bits[name]
                out += _HEADER.pack(n >> 8, n & 0xFF, cls.type, byte, f.stream_id & 0x7FFFFFFF)
                out += data
            else:
                out += f.serialize()
            assert f.body_len <= size

    def _receive_frame(self, frame: Frame) -> list[h2.events.Event]:
        events: list[h2.events.Event]
        try:
            frames, events = self._frame_dispatch_table[frame.__class__](frame)
        except h2.exceptions.StreamClosedError as e:
            # Closed by RST_STREAM: a stream error (RST_STREAM back); else a connection error.
            if self._stream_is_closed_by_reset(e.stream_id):
                f = RstStreamFrame(e.stream_id)
                f.error_code = e.error_code
                self._prepare_for_sending([f])
                events = e._events
            else:
                raise
        except h2.exceptions.StreamIDTooLowError as e:
            if self._stream_is_closed_by_reset(e.stream_id):
                f = RstStreamFrame(e.stream_id)
                f.error_code = h2.errors.ErrorCodes.STREAM_CLOSED
                self._prepare_for_sending([f])
                events = []
            elif self._stream_is_closed_by_end(e.stream_id):
                raise h2.exceptions.StreamClosedError(e.stream_id) from e
            else:
                raise
        else:
            self._prepare_for_sending(frames)
        return events


def _goaway_event(frame: Frame) -> tuple[list[Frame], list[h2.events.Event]]:
    """A received GOAWAY as a ``ConnectionTerminated`` event, the connection left open."""
    assert isinstance(frame, GoAwayFrame)
    event = h2.events.ConnectionTerminated()
    try:
        event.error_code = h2.errors.ErrorCodes(frame.error_code)
    except ValueError:
        event.error_code = frame.error_code
    event.last_stream_id = frame.last_stream_id
    event.additional_data = frame.additional_data or None
    return [], [event]
