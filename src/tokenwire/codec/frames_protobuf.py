"""Mode B frames: 4-byte big-endian length + proto3 ``CodecFrame`` (codec-spec.md §1.2).

Hand-rolled, no protoc, like the engine forks::

    CodecFrame { repeated uint32 ids = 1 [packed]; bool done = 2;
                 optional string finish_reason = 3; repeated ToolCall tool_calls = 4;
                 optional uint32 base_id = 5; }
    ToolCall   { optional string name = 1; string arguments_json = 2; optional string id = 3; }

Encoding is canonical proto3 by default (``done`` omitted when false, as current sglang);
``legacy_done_false=True`` writes ``10 00`` on every non-final frame as older fork builds
and llama.cpp did (codec-spec.md §9.1 item 2). Field 4 is ``tool_calls`` and ``base_id`` is
field 5 (the draft's resolution of §9.1 item 1).

Decoding is tolerant where the spec asks (§10 item 4): packed *and* unpacked ids (the
reference client drops unpacked ones, §9.1 item 21), both ``done`` encodings, unknown fields
of wire types 0/1/2/5, ``base_id`` accepted and ignored; and strict where it must be: uint32
varints over 5 bytes, groups and wire types 6/7, truncated fields, bad UTF-8, and frames
over ``max_frame_bytes`` (checked from the prefix, before the body is buffered).
"""

from __future__ import annotations

import struct

from tokenwire.codec.frames import (
    MAX_FRAME_BYTES,
    MAX_UINT32,
    Frame,
    FrameDecoderBase,
    ToolCall,
    check_ids,
)
from tokenwire.codec.varint import (
    VARINT_TABLE,
    VARINT_TABLE_SIZE,
    encode_uvarint,
    pack_uvarints,
    read_uvarint32,
    read_uvarint64,
    skip_field,
)
from tokenwire.errors import DataAfterDone, FrameTooLarge, LocalProtocolError, MalformedFrame

__all__ = ["FrameDecoder", "FrameEncoder", "decode_frame_body", "encode_frame_body"]

_PREFIX_BYTES = 4
_PREFIX = struct.Struct(">I")

# Whole prefixed frame header for the hot case {ids: [one id], done: false}, by varint
# length L: prefix (2 + L), tag 0x0a, length L.
_ONE_ID_HEAD = [(2 + n).to_bytes(_PREFIX_BYTES, "big") + bytes((0x0A, n)) for n in range(6)]


def _field(tag: bytes, payload: bytes) -> bytes:
    return tag + encode_uvarint(len(payload)) + payload


def _encode_tool_call(call: ToolCall) -> bytes:
    parts = []
    if call.name is not None:
        parts.append(_field(b"\x0a", call.name.encode("utf-8")))
    parts.append(_field(b"\x12", call.arguments_json.encode("utf-8")))  # always written
    if call.id is not None:
        parts.append(_field(b"\x1a", call.id.encode("utf-8")))
    return b"".join(parts)


def encode_frame_body(frame: Frame, *, legacy_done_false: bool = False) -> bytes:
    """The ``CodecFrame`` message bytes, without the length prefix."""
    parts = []
    if frame.ids:
        parts.append(_field(b"\x0a", pack_uvarints(frame.ids)))
    if frame.done:
        parts.append(b"\x10\x01")
    elif legacy_done_false:
        parts.append(b"\x10\x00")
    if frame.finish_reason:  # written only when a non-empty string (§1.2)
        parts.append(_field(b"\x1a", frame.finish_reason.encode("utf-8")))
    for call in frame.tool_calls:
        parts.append(_field(b"\x22", _encode_tool_call(call)))
    return b"".join(parts)


class FrameEncoder:
    """Pure Mode B encoder: ``encode(frame) -> bytes`` (prefix included)."""

    def __init__(self, *, legacy_done_false: bool = False, validate: bool = True) -> None:
        self.legacy_done_false = legacy_done_false
        self.validate = validate

    def encode(self, frame: Frame) -> bytes:
        ids = frame.ids
        if (len(ids) == 1 and not frame.done and not self.legacy_done_false
                and frame.finish_reason is None and not frame.tool_calls):
            i = ids[0]
            if 0 <= i < VARINT_TABLE_SIZE:
                v = VARINT_TABLE[i]
            elif 0 <= i <= MAX_UINT32:
                v = encode_uvarint(i)
            else:
                raise LocalProtocolError(f"token id {i!r} is not a uint32")
            return _ONE_ID_HEAD[len(v)] + v
        if self.validate:
            check_ids(ids)
        body = encode_frame_body(frame, legacy_done_false=self.legacy_done_false)
        return len(body).to_bytes(_PREFIX_BYTES, "big") + body


def _unpack_ids(buf: bytes | bytearray, pos: int, end: int, out: list[int]) -> None:
    """Append the packed uint32 varints of ``buf[pos:end]`` to ``out``.

    One-, two- and three-byte varints (every id below 2**21) are decoded inline; longer
    ones go through :func:`read_uvarint32`, which enforces the 5-byte / uint32 limits.
    """
    append = out.append
    while pos < end:
        b = buf[pos]
        if b < 0x80:
            append(b)
            pos += 1
            continue
        if pos + 2 < end:
            b1 = buf[pos + 1]
            if b1 < 0x80:
                append(b & 0x7F | b1 << 7)
                pos += 2
                continue
            b2 = buf[pos + 2]
            if b2 < 0x80:
                append(b & 0x7F | (b1 & 0x7F) << 7 | b2 << 14)
                pos += 3
                continue
        value, pos = read_uvarint32(buf, pos, end)
        append(value)


def _utf8(buf: bytes | bytearray, pos: int, end: int, what: str) -> str:
    try:
        return bytes(buf[pos:end]).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedFrame(f"{what} is not valid UTF-8") from exc


def _read_len(buf: bytes | bytearray, pos: int, end: int) -> tuple[int, int]:
    size, pos = read_uvarint32(buf, pos, end)
    if pos + size > end:
        raise MalformedFrame("length-delimited field runs past the end of its message")
    return pos, pos + size


def _decode_tool_call(buf: bytes | bytearray, pos: int, end: int) -> ToolCall:
    fields: dict[str, str] = {}
    names = {1: "name", 2: "arguments_json", 3: "id"}
    while pos < end:
        tag, pos = read_uvarint32(buf, pos, end)
        number, wire_type = tag >> 3, tag & 7
        if number == 0:
            raise MalformedFrame("protobuf field number 0 in ToolCall")
        if number in names:
            if wire_type != 2:
                raise MalformedFrame(f"ToolCall field {number} has wire type {wire_type}")
            start, pos = _read_len(buf, pos, end)
            fields[names[number]] = _utf8(buf, start, pos, f"ToolCall.{names[number]}")
        else:
            pos = skip_field(buf, pos, end, wire_type)
    return ToolCall(**fields)


def decode_frame_body(buf: bytes | bytearray, pos: int = 0, end: int | None = None) -> Frame:
    """Parse one ``CodecFrame`` message occupying ``buf[pos:end]`` (no length prefix)."""
    end = len(buf) if end is None else end
    ids: list[int] = []
    # Fast path: the engines' non-final frame, one packed ids field (+ legacy `10 00`).
    if end - pos >= 2 and buf[pos] == 0x0A and buf[pos + 1] < 0x80:
        stop = pos + 2 + buf[pos + 1]
        if stop == end or (stop + 2 == end and buf[stop] == 0x10 and buf[stop + 1] == 0):
            _unpack_ids(buf, pos + 2, stop, ids)
            return Frame(ids=tuple(ids), done=False)
    done = False
    finish_reason: str | None = None
    calls: list[ToolCall] = []
    while pos < end:
        tag, pos = read_uvarint32(buf, pos, end)
        number, wire_type = tag >> 3, tag & 7
        if number == 0:
            raise MalformedFrame("protobuf field number 0")
        if wire_type == 2 and number in (1, 3, 4):
            start, pos = _read_len(buf, pos, end)
            if number == 1:
                _unpack_ids(buf, start, pos, ids)
            elif number == 3:
                finish_reason = _utf8(buf, start, pos, "finish_reason")
            else:
                calls.append(_decode_tool_call(buf, start, pos))
        elif wire_type == 0 and number in (1, 2, 5):
            if number == 2:
                value, pos = read_uvarint64(buf, pos, end)
                done = value != 0
            else:  # unpacked id, or base_id (accepted; the delta axis is unspecified, §1.4)
                value, pos = read_uvarint32(buf, pos, end)
                if number == 1:
                    ids.append(value)
        elif number <= 5:
            raise MalformedFrame(f"CodecFrame field {number} has wire type {wire_type}")
        else:
            pos = skip_field(buf, pos, end, wire_type)
    return Frame(ids=tuple(ids), done=done, finish_reason=finish_reason, tool_calls=tuple(calls))


class FrameDecoder(FrameDecoderBase):
    """Incremental Mode B decoder: ``feed(bytes) -> list[Frame]``, then ``feed_eof()``."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        super().__init__(max_frame_bytes)
        self._buf = bytearray()

    def _buffered(self) -> int:
        return len(self._buf)

    def _feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        if not data:
            return []
        if self._done:
            raise DataAfterDone(f"{len(data)} bytes after the done frame")
        buf = self._buf
        buf += data
        pos, avail, frames = 0, len(buf), []
        while avail - pos >= _PREFIX_BYTES:
            (size,) = _PREFIX.unpack_from(buf, pos)
            if size > self.max_frame_bytes:  # before buffering the body
                raise FrameTooLarge(
                    f"length prefix announces {size} bytes, over the "
                    f"{self.max_frame_bytes}-byte limit"
                )
            body = pos + _PREFIX_BYTES
            if avail - body < size:
                break
            frame = decode_frame_body(buf, body, body + size)
            frames.append(frame)
            pos = body + size
            if frame.done:
                if pos < avail:
                    raise DataAfterDone("bytes follow the done=true frame")
                self._done = True
                break
        if pos:
            del buf[:pos]  # one compaction per feed keeps the total work linear
        return frames
