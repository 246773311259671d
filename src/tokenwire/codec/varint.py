"""Protobuf base-128 varints (LEB128) with the limits Codec puts on them.

Token ids, lengths and tags are ``uint32``: the draft requires rejecting a varint longer than
5 bytes for them (codec-spec.md §1.2, §2.6), and a 5-byte varint whose value passes 2**32-1
is just as wrong. Unknown fields may legitimately be 64-bit (proto3 ``int64``; a negative
``int32`` takes 10 bytes), so skipping them allows the protobuf maximum of 10 bytes.
Truncation inside a complete length-delimited message is a malformed message, not a
truncated stream: the length prefix already said where the message ends.
"""

from __future__ import annotations

from tokenwire.codec.frames import MAX_UINT32
from tokenwire.errors import MalformedFrame, VarintOverflow

__all__ = [
    "MAX_VARINT32_BYTES",
    "MAX_VARINT64_BYTES",
    "VARINT_TABLE",
    "VARINT_TABLE_SIZE",
    "encode_uvarint",
    "pack_uvarints",
    "read_uvarint32",
    "read_uvarint64",
    "skip_field",
]

MAX_VARINT32_BYTES = 5  # ceil(32 / 7): the draft's limit for uint32 fields
MAX_VARINT64_BYTES = 10  # ceil(64 / 7): protobuf's own limit, for unknown varint fields

# Precomputed encodings of 0 .. 2**14-1 (every one- and two-byte varint): the ids of the most
# frequent tokens are small in BPE vocabularies, and a list lookup beats building bytes.
# 16,384 short bytes objects cost about 0.6 MB.
VARINT_TABLE_SIZE = 1 << 14
VARINT_TABLE: list[bytes] = [
    bytes((n,)) if n < 0x80 else bytes((n & 0x7F | 0x80, n >> 7))
    for n in range(VARINT_TABLE_SIZE)
]


# Three-byte varints (2**14 .. 2**21-1, the rest of any real vocabulary) are a continued
# low-14-bit pair plus one final byte: two lookups and a concatenation, no arithmetic.
_CONT14: list[bytes] = [bytes((n & 0x7F | 0x80, n >> 7 | 0x80)) for n in range(1 << 14)]
_FINAL: list[bytes] = VARINT_TABLE[:0x80]


def encode_uvarint(n: int) -> bytes:
    """LEB128 encoding of a non-negative int (no range check beyond ``n >= 0``)."""
    if n < VARINT_TABLE_SIZE:
        if n < 0:
            raise ValueError(f"varint of negative value {n}")
        return VARINT_TABLE[n]
    if n < 1 << 21:
        return _CONT14[n & 0x3FFF] + _FINAL[n >> 14]
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def pack_uvarints(ids: tuple[int, ...] | list[int]) -> bytes:
    """The payload of a packed ``repeated uint32`` field (ids must be non-negative)."""
    if not ids:
        return b""
    top = max(ids)
    if top < VARINT_TABLE_SIZE:
        return b"".join(map(VARINT_TABLE.__getitem__, ids))
    if top < 1 << 21:
        table, cont, final = VARINT_TABLE, _CONT14, _FINAL
        return b"".join([table[i] if i < VARINT_TABLE_SIZE else cont[i & 0x3FFF] + final[i >> 14]
                         for i in ids])
    return b"".join(map(encode_uvarint, ids))


def read_uvarint32(buf: bytes | bytearray, pos: int, end: int) -> tuple[int, int]:
    """Read a uint32 varint at ``pos``: (value, next position)."""
    if pos < end:
        b = buf[pos]
        if b < 0x80:
            return b, pos + 1
    result = shift = 0
    while True:
        if pos >= end:
            raise MalformedFrame("varint runs past the end of its message")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift >= 7 * MAX_VARINT32_BYTES:
            raise VarintOverflow(f"varint longer than {MAX_VARINT32_BYTES} bytes for a uint32")
    if result > MAX_UINT32:
        raise VarintOverflow(f"varint value {result} does not fit a uint32")
    return result, pos


def read_uvarint64(buf: bytes | bytearray, pos: int, end: int) -> tuple[int, int]:
    """Read a varint of up to 64 bits (unknown fields, ``bool``): (value, next position)."""
    result = shift = 0
    while True:
        if pos >= end:
            raise MalformedFrame("varint runs past the end of its message")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & 0xFFFF_FFFF_FFFF_FFFF, pos
        shift += 7
        if shift >= 7 * MAX_VARINT64_BYTES:
            raise VarintOverflow(f"varint longer than {MAX_VARINT64_BYTES} bytes")


def skip_field(buf: bytes | bytearray, pos: int, end: int, wire_type: int) -> int:
    """Skip the value of an unknown field; return the next position.

    Wire types 0, 1, 2 and 5 are skipped (receivers ignore unknown fields, codec-spec.md
    §2.7); groups (3, 4) are not used by proto3 and 6, 7 do not exist, so they are errors.
    """
    if wire_type == 0:
        return read_uvarint64(buf, pos, end)[1]
    if wire_type == 2:
        size, pos = read_uvarint32(buf, pos, end)
        nxt = pos + size
    elif wire_type == 1:
        nxt = pos + 8
    elif wire_type == 5:
        nxt = pos + 4
    else:
        raise MalformedFrame(f"protobuf wire type {wire_type} is not allowed")
    if nxt > end:
        raise MalformedFrame("field runs past the end of its message")
    return nxt
