"""Value types and limits shared by every Codec frame format (codec-spec.md §1.1-§1.4).

One module per wire format holds the bytes (``frames_msgpack``, ``frames_protobuf``,
``frames_delta``); each exports a pure ``FrameEncoder`` and an incremental ``FrameDecoder``
with the same API. This module holds what they share:

* :class:`Frame` and :class:`ToolCall`, frozen ``msgspec.Struct`` values. ``Frame`` is also
  the msgpack wire shape: its field order is the engines' key order (``ids``, ``done``,
  ``finish_reason``, ``tool_calls``) and ``omit_defaults`` drops ``finish_reason=None`` and
  empty ``tool_calls`` exactly as the engine forks do (§1.1 rules 2 and 7), so
  ``msgspec.msgpack.encode(frame)`` is byte-exact.
* :class:`StreamFormat` (``stream_format`` wire tokens) and their content types (§2.4).
* The limits, and :class:`FrameDecoderBase`: the sticky-error / EOF / ``done`` bookkeeping
  every decoder needs (STYLE.md §6.2).
"""

from __future__ import annotations

import enum
from array import array
from typing import Annotated

import msgspec

from tokenwire.errors import LocalProtocolError, RemoteProtocolError, TruncatedStream

__all__ = [
    "CONTENT_TYPES",
    "MAX_FRAME_BYTES",
    "MAX_UINT32",
    "Frame",
    "FrameDecoderBase",
    "StreamFormat",
    "ToolCall",
    "Uint32",
    "check_ids",
]

# The draft's default cap on one frame (codec-spec.md §1.2, §2.7): large enough for any real
# frame (70,000 ids are ~350 KB in msgpack), small enough that a hostile or corrupt length
# prefix cannot make a client buffer gigabytes. It also keeps the first byte of a 4-byte
# big-endian length prefix at 0x00, which is how the msgpack decoder tells a prefixed stream
# from bare maps.
MAX_FRAME_BYTES = 16 * 1024 * 1024

# Token ids are proto3 ``uint32`` (codec-spec.md §1.2); msgpack carries them in at most
# ``0xce`` uint32 form.
MAX_UINT32 = 0xFFFF_FFFF

Uint32 = Annotated[int, msgspec.Meta(ge=0, le=MAX_UINT32)]


class StreamFormat(enum.StrEnum):
    """The binary ``stream_format`` values we speak (codec-spec.md §1, §2.3)."""

    MSGPACK = "msgpack"
    PROTOBUF = "protobuf"
    MSGPACK_DELTA = "msgpack-delta"

    @property
    def content_type(self) -> str:
        return CONTENT_TYPES[self]


# codec-spec.md §2.4: the delta variant is still a msgpack body (§1.4), so it shares the type.
CONTENT_TYPES: dict[StreamFormat, str] = {
    StreamFormat.MSGPACK: "application/x-msgpack",
    StreamFormat.PROTOBUF: "application/x-protobuf",
    StreamFormat.MSGPACK_DELTA: "application/x-msgpack",
}


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """A server-side parsed tool call (codec-spec.md §1.1 rule 7, §1.2 ``ToolCall``).

    ``name`` and ``id`` may be None; in msgpack all three keys are written (None as nil),
    in protobuf ``name``/``id`` are omitted when None and ``arguments_json`` is always written.
    """

    name: str | None = None
    arguments_json: str = ""
    id: str | None = None


class Frame(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One streaming frame: the token ids generated since the previous frame.

    ``ids`` is a tuple when produced by a decoder; a list is accepted when encoding.
    Unknown msgpack keys are ignored on decode (codec-spec.md §1.1 "liberal acceptance").
    """

    ids: tuple[Uint32, ...]
    done: bool
    finish_reason: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()


# array("I") converts in C and raises on anything that is not an int in 0..2**32-1: about
# 3x faster than min()/max() over the tuple, and it also rejects floats.
_U32_CODE = next(code for code in "IL" if array(code).itemsize == 4)


def check_ids(ids: tuple[int, ...] | list[int]) -> None:
    """Raise :class:`LocalProtocolError` unless every id is an int that fits a uint32."""
    try:
        array(_U32_CODE, ids)
    except (OverflowError, TypeError) as exc:
        bad = next((i for i in ids if type(i) is not int or not 0 <= i <= MAX_UINT32), None)
        raise LocalProtocolError(f"token id {bad!r} is not a uint32") from exc


class FrameDecoderBase:
    """Bookkeeping shared by the incremental decoders.

    Subclasses implement ``_feed(data) -> list[Frame]`` (raising ``RemoteProtocolError``
    subclasses) and ``_buffered() -> int``, and set ``self._done`` when the terminal frame
    has been decoded. Errors are sticky: once a decoder raised, every later call raises a
    fresh error of the same class, chained to the first.
    """

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        if max_frame_bytes < 1:
            raise ValueError("max_frame_bytes must be positive")
        self.max_frame_bytes = max_frame_bytes
        self._done = False
        self._eof = False
        self._error: RemoteProtocolError | None = None

    @property
    def done(self) -> bool:
        """True once the terminal (``done=true``) frame has been returned."""
        return self._done

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Consume ``data`` (any chunk size) and return the frames it completed, in order."""
        self._check_usable()
        try:
            return self._feed(data)
        except RemoteProtocolError as exc:
            self._error = exc
            raise

    def feed_eof(self) -> None:
        """Declare the end of the body; raise :class:`TruncatedStream` if it ended early."""
        self._check_usable()
        self._eof = True
        try:
            if self._buffered():
                raise TruncatedStream(
                    f"stream ended inside a frame ({self._buffered()} bytes buffered)"
                )
            if not self._done:
                raise TruncatedStream("stream ended without a done=true frame")
        except RemoteProtocolError as exc:
            self._error = exc
            raise

    def _check_usable(self) -> None:
        if self._error is not None:
            exc = self._error
            raise type(exc)(f"decoder already failed: {exc}") from exc
        if self._eof:
            raise LocalProtocolError("decoder used after feed_eof()")

    def _feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:  # pragma: no cover
        raise NotImplementedError

    def _buffered(self) -> int:  # pragma: no cover
        raise NotImplementedError
