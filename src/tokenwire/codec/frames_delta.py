"""``msgpack-delta`` frames: chained zigzag deltas of the ids (codec-spec.md §1.4).

Each frame is a msgpack map with exactly the reference client's shape (codecai's
``stream_delta.py`` encodes a msgspec Struct): keys in the order ``base_id``, ``ids_delta``,
``done``, ``finish_reason``, and ``finish_reason`` written as nil (``0xc0``) when absent,
unlike Mode A where it is omitted. ``base_id`` is the last id of the previous frame (0 on
the first), ``ids_delta[0] = zz(ids[0] - base_id)``, ``ids_delta[k] = zz(ids[k] - ids[k-1])``,
``zz(n) = 2n`` for n >= 0 and ``-2n - 1`` otherwise (protobuf's sint mapping). Every frame
carries its own anchor, so the decoder needs no state across frames and a dropped frame
does not desynchronise the ones after it.

The stream framing (bare concatenated maps, or the 4-byte prefix if the first byte says
so) is Mode A's, so the decoder reuses :class:`MsgpackStreamDecoder`. ``protobuf-delta`` is
not specified anywhere (§1.4) and is not offered.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Annotated

import msgspec

from tokenwire.codec.frames import MAX_UINT32, Frame, Uint32, check_ids
from tokenwire.codec.frames_msgpack import MsgpackStreamDecoder
from tokenwire.errors import DataAfterDone, LocalProtocolError, MalformedFrame

__all__ = [
    "DeltaFrame",
    "FrameDecoder",
    "FrameEncoder",
    "encode_delta_frame",
    "zigzag_decode",
    "zigzag_encode",
]

# The zigzag image of any difference of two uint32 ids: |d| <= 2**32 - 1, so zz(d) < 2**33.
_MAX_ZIGZAG = 2 * MAX_UINT32
_Zigzag = Annotated[int, msgspec.Meta(ge=0, le=_MAX_ZIGZAG)]


class DeltaFrame(msgspec.Struct, frozen=True, kw_only=True):
    """The ``msgpack-delta`` wire value (field order is the byte order, nil not omitted)."""

    base_id: Uint32
    ids_delta: tuple[_Zigzag, ...]
    done: bool
    finish_reason: str | None = None


def zigzag_encode(n: int) -> int:
    return 2 * n if n >= 0 else -2 * n - 1


def zigzag_decode(z: int) -> int:
    return (z >> 1) ^ -(z & 1)


def _deltas(ids: tuple[int, ...] | list[int], base_id: int) -> list[int]:
    prevs = [base_id, *ids[:-1]] if ids else []
    return [2 * d if d >= 0 else -2 * d - 1 for d in map(int.__sub__, ids, prevs)]


_encode = msgspec.msgpack.Encoder().encode


def encode_delta_frame(frame: Frame, base_id: int = 0) -> bytes:
    """Encode ``frame`` against ``base_id`` (pure; ``tool_calls`` have no delta carriage)."""
    return _encode(DeltaFrame(
        base_id=base_id,
        ids_delta=_deltas(frame.ids, base_id),  # type: ignore[arg-type]
        done=frame.done,
        finish_reason=frame.finish_reason,
    ))


class FrameEncoder:
    """``msgpack-delta`` encoder: ``encode(frame) -> bytes``.

    Unlike the other formats' encoders this one holds one int of state, the running
    ``base_id`` (the last id sent; 0 before the first frame, unchanged by empty frames,
    as in the reference client). Use :func:`encode_delta_frame` for an explicit anchor.
    Frames with ``tool_calls`` are refused: the delta shape has no key for them.
    """

    def __init__(self, *, validate: bool = True) -> None:
        self.validate = validate
        self.base_id = 0

    def encode(self, frame: Frame) -> bytes:
        if self.validate:
            check_ids(frame.ids)
        if frame.tool_calls:
            raise LocalProtocolError("msgpack-delta frames cannot carry tool_calls")
        data = encode_delta_frame(frame, self.base_id)
        if frame.ids:
            self.base_id = frame.ids[-1]
        return data


class FrameDecoder(MsgpackStreamDecoder):
    """Incremental ``msgpack-delta`` decoder yielding plain :class:`Frame` values."""

    wire_type = DeltaFrame
    fast_path = False

    def _convert(self, wire: list) -> list[Frame]:
        frames: list[Frame] = []
        for w in wire:
            if frames and frames[-1].done:  # the done rule outranks what follows
                raise DataAfterDone("bytes follow the done=true frame")
            ids = tuple(accumulate(map(zigzag_decode, w.ids_delta), initial=w.base_id))[1:]
            if ids and (min(ids) < 0 or max(ids) > MAX_UINT32):
                raise MalformedFrame(
                    f"ids_delta from base_id {w.base_id} leaves the uint32 range"
                )
            frames.append(Frame(ids=ids, done=w.done, finish_reason=w.finish_reason))
        return frames
