"""HPACK shortcuts for the ``h2`` connections: a memoised encoder and decoder (:func:`install`).

**Encoding** (header blocks we send): no dynamic table, memoised per field.

The ``h2`` library's encoder (``hpack.Encoder``) searches and updates a dynamic table for
every field of every block: about a third of the time the gateway spends framing a
response.  :class:`FieldCacheEncoder` stands in for it on a connection.  It never inserts
into the dynamic table (it announces a table size of 0 at its first block and after every
SETTINGS_HEADER_TABLE_SIZE change), so a field's encoding depends on nothing but the field:
each one is encoded once (an indexed static-table entry, or a literal "without indexing",
Huffman-coded when shorter) and then taken from a shared, bounded cache, and a block is the
join of its fields.  Repeated header sets (the common case behind a proxy) cost a dict
lookup per field.  Blocks are somewhat larger than with a dynamic table (a repeated value
is sent again instead of as an index), as nginx's encoder does too.

Credentials (``authorization``, ``cookie``, ``set-cookie``, ...) are never cached and are
sent as "never indexed" literals (RFC 7541 §7.1.3).

**Decoding** (header blocks we receive): :class:`BlockCacheDecoder` is ``hpack.Decoder``
that remembers the last small blocks which changed nothing in the dynamic table (all
indexed or literal-without-indexing: a client repeating a request after its first), with
the table's state they were decoded in; the same bytes in the same state decode to the
same fields, without decoding again.
"""

from __future__ import annotations

from collections.abc import Iterable

import h2.connection
from hpack import Decoder, HeaderTuple
from hpack.hpack import encode_integer
from hpack.huffman import HuffmanEncoder
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH
from hpack.table import HeaderTable

CACHE_MAX = 4096
"""Distinct fields kept encoded (cleared whole when full)."""
SENSITIVE = frozenset({b"authorization", b"proxy-authorization", b"cookie", b"set-cookie"})

_FULL: dict[tuple[bytes, bytes], int] = {}
_NAME: dict[bytes, int] = {}
for _i, (_n, _v) in enumerate(HeaderTable.STATIC_TABLE, 1):
    _FULL.setdefault((_n, _v), _i)
    _NAME.setdefault(_n, _i)
_HUFFMAN = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH)
_TABLE_SIZE_ZERO = b"\x20"
"""A dynamic table size update to 0 (RFC 7541 §6.3)."""
_cache: dict[tuple[bytes, bytes], bytes] = {}


def _string(data: bytes) -> bytes:
    coded = _HUFFMAN.encode(data)
    if len(coded) < len(data):
        length = encode_integer(len(coded), 7)
        length[0] |= 0x80
        return bytes(length) + coded
    return bytes(encode_integer(len(data), 7)) + data


def encode_field(name: bytes, value: bytes) -> bytes:
    """One field's representation, independent of any dynamic table."""
    index = _FULL.get((name, value))
    if index is not None:
        indexed = encode_integer(index, 7)
        indexed[0] |= 0x80
        return bytes(indexed)
    flag = 0x10 if name in SENSITIVE else 0x00  # never indexed / without indexing
    index = _NAME.get(name)
    if index is not None:
        prefix = encode_integer(index, 4)
        prefix[0] |= flag
        return bytes(prefix) + _string(value)
    return bytes([flag]) + _string(name) + _string(value)


class FieldCacheEncoder:
    """The encoder of one HTTP/2 connection (``H2Connection.encoder``), as ``h2`` calls it."""

    __slots__ = ("_announce",)

    def __init__(self) -> None:
        self._announce = True
        """The next block starts with a table size update to 0."""

    @property
    def header_table_size(self) -> int:
        return 0

    @header_table_size.setter
    def header_table_size(self, value: int) -> None:
        # The peer changed SETTINGS_HEADER_TABLE_SIZE: say again that we use none of it.
        self._announce = True

    def encode(self, headers: Iterable[tuple[bytes, bytes]], huffman: bool = True) -> bytes:
        cache = _cache
        parts = []
        if self._announce:
            self._announce = False
            parts.append(_TABLE_SIZE_ZERO)
        for name, value in headers:
            key = (name, value)
            encoded = cache.get(key)
            if encoded is None:
                encoded = encode_field(name, value)
                if name not in SENSITIVE:
                    if len(cache) >= CACHE_MAX:
                        cache.clear()
                    cache[key] = encoded
            parts.append(encoded)
        return b"".join(parts)


class BlockCacheDecoder(Decoder):
    """``hpack.Decoder`` answering repeated blocks that leave the dynamic table as it was
    from a small per-connection cache (checked against the table's state: its newest entry,
    by identity, its length and size, and the header list limit)."""

    BLOCKS_MAX = 32
    BLOCK_BYTES_MAX = 1024

    def __init__(self, max_header_list_size: int) -> None:
        super().__init__(max_header_list_size)
        self._blocks: dict[bytes, tuple[object, int, int, int, Iterable[HeaderTuple]]] = {}

    def decode(self, data: bytes, raw: bool = False) -> Iterable[HeaderTuple]:
        table = self.header_table
        entries = table.dynamic_entries
        newest = entries[0] if entries else None
        count = len(entries)
        maxsize = table.maxsize
        limit = self.max_header_list_size
        blocks = self._blocks
        hit = blocks.get(data) if raw else None
        if (
            hit is not None
            and hit[0] is newest
            and hit[1] == count
            and hit[2] == maxsize
            and hit[3] == limit
        ):
            return hit[4]
        headers = super().decode(data, raw)
        if (
            raw
            and len(data) <= self.BLOCK_BYTES_MAX
            and len(entries) == count
            and (entries[0] if entries else None) is newest
            and table.maxsize == maxsize
        ):
            if len(blocks) >= self.BLOCKS_MAX:
                blocks.clear()
            blocks[bytes(data)] = (newest, count, maxsize, limit, headers)
        return headers


def install(conn: h2.connection.H2Connection) -> None:
    """Put the memoised encoder and decoder on a new ``h2`` connection."""
    conn.encoder = FieldCacheEncoder()  # type: ignore[assignment]  # (duck-typed as h2 uses it)
    conn.decoder = BlockCacheDecoder(conn.decoder.max_header_list_size)
