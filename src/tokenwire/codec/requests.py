"""Path C request bodies for ``POST /v1/completions/codec`` (codec-spec.md §1.3, §2.7b).

Two encodings of one request::

    CodecRequest { repeated uint32 prompt_ids = 1 [packed]; uint32 max_tokens = 2;
                   float temperature = 3; repeated string stop = 4; string stream_format = 5; }

* ``application/x-protobuf``: a bare ``CodecRequest`` message, no length prefix.
* ``application/x-msgpack``: a map with the same key names, in any order.

Defaults follow the engine forks (§2.7b): ``prompt_ids=()``, ``max_tokens=256``,
``stream_format="msgpack"``; ``temperature`` and ``stop`` are whatever the body says
(None / empty when absent). Errors are :class:`MalformedFrame` or :class:`VarintOverflow`
with ``status_hint`` 400 (§2.6 "Malformed protobuf / varint > 5 bytes / truncated body"),
and :class:`FrameTooLarge` (413) for a body over ``max_bytes``. Which stream formats a
server supports is the server's decision; ``stream_format`` is carried, not judged.
"""

from __future__ import annotations

import math
import struct

import msgspec

from tokenwire.codec.frames import MAX_FRAME_BYTES, StreamFormat, Uint32, check_ids
from tokenwire.codec.varint import (
    encode_uvarint,
    pack_uvarints,
    read_uvarint32,
    skip_field,
)
from tokenwire.errors import FrameTooLarge, LocalProtocolError, MalformedFrame, VarintOverflow

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "REQUEST_FORMATS",
    "CodecRequest",
    "decode_request",
    "encode_request",
    "request_format_for_content_type",
]

DEFAULT_MAX_TOKENS = 256  # the forks' default when the body has none (§2.7b)
# Request bodies come in these two encodings only; msgpack-delta is a response format.
REQUEST_FORMATS = (StreamFormat.MSGPACK, StreamFormat.PROTOBUF)
_BAD_REQUEST = 400


class CodecRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A decoded Path C request body."""

    prompt_ids: tuple[Uint32, ...] = ()
    max_tokens: Uint32 = DEFAULT_MAX_TOKENS
    temperature: float | None = None
    stop: tuple[str, ...] = ()
    stream_format: str = StreamFormat.MSGPACK.value


class _MsgpackIn(msgspec.Struct, kw_only=True):
    """What a msgpack body may hold: ``stop`` as a list or a single string (OpenAI style)."""

    prompt_ids: tuple[Uint32, ...] = ()
    max_tokens: Uint32 = DEFAULT_MAX_TOKENS
    temperature: float | None = None
    stop: str | tuple[str, ...] = ()
    stream_format: str = StreamFormat.MSGPACK.value


class _MsgpackOut(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What we write: the engines' key order, absent temperature/stop omitted."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    temperature: float | None = None
    stop: tuple[str, ...] = ()
    stream_format: str


_msgpack_in = msgspec.msgpack.Decoder(_MsgpackIn)
_msgpack_encode = msgspec.msgpack.Encoder().encode
_FLOAT32 = struct.Struct("<f")


def request_format_for_content_type(content_type: str) -> StreamFormat:
    """The forks' routing (§2.7b): a type containing ``protobuf`` is protobuf, else msgpack."""
    if "protobuf" in content_type.lower():
        return StreamFormat.PROTOBUF
    return StreamFormat.MSGPACK


def _format(fmt: StreamFormat | str) -> StreamFormat:
    try:
        fmt = StreamFormat(fmt)
    except ValueError:
        fmt = None  # type: ignore[assignment]
    if fmt not in REQUEST_FORMATS:
        raise ValueError(f"request bodies are msgpack or protobuf, not {fmt!r}")
    return fmt


def encode_request(req: CodecRequest, fmt: StreamFormat | str) -> bytes:
    """Serialise ``req`` for ``fmt`` (``"msgpack"`` or ``"protobuf"``)."""
    fmt = _format(fmt)
    check_ids(req.prompt_ids)
    if not 0 <= req.max_tokens <= 0xFFFF_FFFF:
        raise LocalProtocolError(f"max_tokens {req.max_tokens} is not a uint32")
    if fmt is StreamFormat.MSGPACK:
        return _msgpack_encode(_MsgpackOut(
            prompt_ids=tuple(req.prompt_ids), max_tokens=req.max_tokens,
            temperature=req.temperature, stop=tuple(req.stop), stream_format=req.stream_format,
        ))
    parts = []
    if req.prompt_ids:
        packed = pack_uvarints(req.prompt_ids)
        parts.append(b"\x0a" + encode_uvarint(len(packed)) + packed)
    parts.append(b"\x10" + encode_uvarint(req.max_tokens))
    if req.temperature is not None:
        parts.append(b"\x1d" + _FLOAT32.pack(req.temperature))
    for text in req.stop:
        parts.append(_pb_field_string(b"\x22", text))
    parts.append(_pb_field_string(b"\x2a", req.stream_format))
    return b"".join(parts)


def _pb_field_string(tag: bytes, text: str) -> bytes:
    data = text.encode("utf-8")
    return tag + encode_uvarint(len(data)) + data


def decode_request(body: bytes | bytearray | memoryview, fmt: StreamFormat | str,
                   *, max_bytes: int = MAX_FRAME_BYTES) -> CodecRequest:
    """Parse a request body; typed 400-class errors for anything malformed."""
    fmt = _format(fmt)
    if len(body) > max_bytes:
        raise FrameTooLarge(f"request body of {len(body)} bytes is over {max_bytes}")
    if fmt is StreamFormat.MSGPACK:
        return _decode_msgpack(body)
    return _decode_protobuf(bytes(body))


def _decode_msgpack(body: bytes | bytearray | memoryview) -> CodecRequest:
    try:
        raw = _msgpack_in.decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise MalformedFrame(f"invalid msgpack request body: {exc}",
                             status_hint=_BAD_REQUEST) from exc
    except RecursionError:  # an unknown key's value nested thousands deep is skipped recursively
        raise MalformedFrame("msgpack request body nests too deeply",
                             status_hint=_BAD_REQUEST) from None
    stop = (raw.stop,) if isinstance(raw.stop, str) else raw.stop
    if raw.temperature is not None and not math.isfinite(raw.temperature):
        raise MalformedFrame(f"temperature {raw.temperature} is not finite",
                             status_hint=_BAD_REQUEST)
    return CodecRequest(prompt_ids=raw.prompt_ids, max_tokens=raw.max_tokens,
                        temperature=raw.temperature, stop=stop, stream_format=raw.stream_format)


def _decode_protobuf(buf: bytes) -> CodecRequest:
    try:
        return _parse_protobuf(buf)
    except (MalformedFrame, VarintOverflow) as exc:
        exc.status_hint = _BAD_REQUEST
        raise


def _pb_string(buf: bytes, pos: int, end: int, what: str) -> tuple[str, int]:
    size, pos = read_uvarint32(buf, pos, end)
    if pos + size > end:
        raise MalformedFrame(f"{what} runs past the end of the body")
    try:
        return buf[pos : pos + size].decode("utf-8"), pos + size
    except UnicodeDecodeError as exc:
        raise MalformedFrame(f"{what} is not valid UTF-8") from exc


def _pb_ids(buf: bytes, pos: int, end: int, out: list[int]) -> int:
    size, pos = read_uvarint32(buf, pos, end)
    stop = pos + size
    if stop > end:
        raise MalformedFrame("prompt_ids runs past the end of the body")
    while pos < stop:
        value, pos = read_uvarint32(buf, pos, stop)
        out.append(value)
    return stop


def _parse_protobuf(buf: bytes) -> CodecRequest:
    pos, end = 0, len(buf)
    ids: list[int] = []
    stop: list[str] = []
    fields: dict[str, object] = {}
    while pos < end:
        tag, pos = read_uvarint32(buf, pos, end)
        number, wire_type = tag >> 3, tag & 7
        if number == 0:
            raise MalformedFrame("protobuf field number 0")
        if (number, wire_type) == (1, 2):
            pos = _pb_ids(buf, pos, end, ids)
        elif (number, wire_type) in ((1, 0), (2, 0)):
            value, pos = read_uvarint32(buf, pos, end)
            if number == 1:
                ids.append(value)
            else:
                fields["max_tokens"] = value
        elif (number, wire_type) == (3, 5):
            if pos + 4 > end:
                raise MalformedFrame("temperature runs past the end of the body")
            (temperature,) = _FLOAT32.unpack_from(buf, pos)
            if not math.isfinite(temperature):
                raise MalformedFrame(f"temperature {temperature} is not finite")
            fields["temperature"] = temperature
            pos += 4
        elif (number, wire_type) in ((4, 2), (5, 2)):
            text, pos = _pb_string(buf, pos, end, "stop" if number == 4 else "stream_format")
            if number == 4:
                stop.append(text)
            else:
                fields["stream_format"] = text
        elif number <= 5:
            raise MalformedFrame(f"CodecRequest field {number} has wire type {wire_type}")
        else:
            pos = skip_field(buf, pos, end, wire_type)
    return CodecRequest(prompt_ids=tuple(ids), stop=tuple(stop), **fields)  # type: ignore[arg-type]
