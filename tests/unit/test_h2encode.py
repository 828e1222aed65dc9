"""The table-less, memoised HPACK encoder against hpack's own decoder."""

from __future__ import annotations

import hpack

from gateway.dataplane.h2encode import FieldCacheEncoder, encode_field

FIELDS = [
    (b":status", b"200"),  # a full static-table match
    (b"content-type", b"application/json"),  # a static name, literal value
    (b"x-request-id", b"abc-123"),  # a literal name and value
    (b"set-cookie", b"session=secret"),  # never indexed, never cached
    (b"content-length", b"0"),
    (b"x-long", b"v" * 300),  # a length over a 7-bit prefix
]


def test_blocks_decode_to_the_fields_and_leave_the_peer_table_empty() -> None:
    encoder, decoder = FieldCacheEncoder(), hpack.Decoder()
    for _ in range(3):
        assert decoder.decode(encoder.encode(FIELDS), raw=True) == FIELDS
        assert len(decoder.header_table.dynamic_entries) == 0
    assert decoder.header_table_size == 0  # the first block announced a 0-byte table


def test_a_table_size_change_is_answered_at_the_next_block() -> None:
    encoder = FieldCacheEncoder()
    first = encoder.encode(FIELDS[:1])
    assert first.startswith(b"\x20")
    assert not encoder.encode(FIELDS[:1]).startswith(b"\x20")
    encoder.header_table_size = 1024
    assert encoder.encode(FIELDS[:1]).startswith(b"\x20")


def test_sensitive_fields_are_never_indexed_literals() -> None:
    encoded = encode_field(b"authorization", b"Bearer x")
    assert encoded[0] & 0xF0 == 0x10
    decoded = hpack.Decoder().decode(encoded, raw=True)
    assert decoded == [(b"authorization", b"Bearer x")]
    assert isinstance(hpack.Decoder().decode(encoded)[0], hpack.NeverIndexedHeaderTuple)


def test_repeated_blocks_decode_the_same_and_table_changes_are_seen() -> None:
    from gateway.dataplane.h2encode import BlockCacheDecoder

    encoder = hpack.Encoder()  # a client's encoder: indexes what it sends
    decoder = BlockCacheDecoder(65536)
    first = [(b":method", b"GET"), (b":path", b"/a"), (b"x-user", b"alice")]
    assert decoder.decode(encoder.encode(first), raw=True) == first  # inserts: not cached
    again = encoder.encode(first)  # now all indexed: cached
    assert decoder.decode(again, raw=True) == first
    assert decoder.decode(again, raw=True) == first
    # The table changes (a new field pushes the indices): the same bytes mean other fields.
    other = [(b"x-user", b"bob")]
    assert decoder.decode(encoder.encode(other), raw=True) == other
    reference = hpack.Decoder()
    encoder2 = hpack.Encoder()
    blocks = [encoder2.encode(h) for h in (first, first, other, first, other, first)]
    fresh = BlockCacheDecoder(65536)
    for block in blocks:
        assert fresh.decode(block, raw=True) == reference.decode(block, raw=True)
