"""Mode A frames: concatenated MessagePack maps (codec-spec.md §1.1), sans-IO.

Encoding is one msgspec call: :class:`~tokenwire.codec.frames.Frame` *is* the wire shape
(field order = the engines' key order, ``omit_defaults`` = "finish_reason only if not None,
tool_calls only if non-empty"), and msgspec writes minimal-width unsigned ints, which is what
the engine forks emit (they build a dict and call ``msgspec.msgpack``). An optional 4-byte
big-endian length prefix per frame is offered for peers that expect it (the website's
description, codec-spec.md §9.1 item 12).

Decoding has to find frame boundaries itself: the body has no delimiter and msgspec rejects
trailing bytes. The reference client walks the buffer in Python and then re-copies the whole
buffer for every frame, which is quadratic (codec-spec.md §10 item 5). Here:

* a resumable scanner (:class:`_Scanner`) walks each value once, keeps its position and
  container stack across ``feed`` calls, and never looks at a byte twice;
* the common engine frame (``{"ids": [uints], "done": false}``) is matched in C by one
  possessive regex over a whole run of frames; those boundaries are speculative and only
  kept if msgspec confirms them (see ``_fast_run``);
* all complete frames of one ``feed`` are contiguous, so they are decoded by a single
  ``msgspec`` call on ``array-header + bytes`` instead of one call per frame.

The buffer is compacted once per ``feed`` (after the frames it completed), so every byte
is copied a bounded number of times: total work is linear in the stream length.
"""

from __future__ import annotations

import enum
import functools
import operator
import re

import msgspec

from tokenwire.codec.frames import (
    MAX_FRAME_BYTES,
    MAX_UINT32,
    Frame,
    FrameDecoderBase,
    check_ids,
)
from tokenwire.errors import (
    DataAfterDone,
    FrameTooLarge,
    LocalProtocolError,
    MalformedFrame,
    RemoteProtocolError,
)

__all__ = [
    "MAX_NESTING",
    "FrameDecoder",
    "FrameEncoder",
    "MsgpackStreamDecoder",
]

# Frames nest three deep (map -> tool_calls array -> tool-call map); unknown keys may add a
# little. The cap keeps a hostile body from building an unbounded container stack here or
# hitting msgspec's recursion limit.
MAX_NESTING = 32

_PREFIX_BYTES = 4  # big-endian uint32 length before each frame, when prefixed


def _width_table() -> list[int]:
    """Total byte width of every msgpack value whose size the lead byte alone determines."""
    width = [0] * 256
    for b in range(0x00, 0x80):  # positive fixint
        width[b] = 1
    for b in range(0xE0, 0x100):  # negative fixint
        width[b] = 1
    for b in range(0xA0, 0xC0):  # fixstr: length in the low 5 bits
        width[b] = 1 + (b & 0x1F)
    fixed = {0xC0: 1, 0xC2: 1, 0xC3: 1,  # nil, false, true
             0xCC: 2, 0xCD: 3, 0xCE: 5, 0xCF: 9, 0xD0: 2, 0xD1: 3, 0xD2: 5, 0xD3: 9,
             0xCA: 5, 0xCB: 9,  # float32/64
             0xD4: 3, 0xD5: 4, 0xD6: 6, 0xD7: 10, 0xD8: 18}  # fixext 1/2/4/8/16
    for b, w in fixed.items():
        width[b] = w
    return width


_WIDTH = _width_table()
# Unsigned ints only: the lead bytes a token id may start with (§1.1 rule 4).
_UINT_WIDTH = [w if (b < 0x80 or b in (0xCC, 0xCD, 0xCE, 0xCF)) else 0
               for b, w in enumerate(_WIDTH)]
# bin8/16/32, str8/16/32, ext8/16/32: (bytes of length field, extra bytes before the payload)
_VARLEN = {0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0), 0xD9: (1, 0), 0xDA: (2, 0), 0xDB: (4, 0),
           0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1)}
# array16/32, map16/32: (bytes of count field, items per entry)
_BIGCONTAINER = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}
_MAP_LEADS = frozenset([*range(0x80, 0x90), 0xDE, 0xDF])
# One unsigned msgpack int (any width a token id may use, plus uint64 so that an oversized
# id reaches msgspec and is reported as a validation error rather than a framing one).
_UINT_RE = rb"(?:[\x00-\x7f]|\xcc.|\xcd..|\xce....|\xcf........)"
# _UINT_BLOCKS[k] matches exactly 2**k ints; arrays shorter than _BLOCK_MIN use the loop.
_UINT_BLOCKS = [re.compile(_UINT_RE + b"{%d}+" % (1 << k), re.DOTALL) for k in range(32)]
_BLOCK_MIN = 16


def _container(buf: bytearray, pos: int, b: int, end: int) -> tuple[int, int] | None:
    """(items to follow, header width) for a container lead byte, None if not a container.

    Returns (-1, 0) when the header itself is not complete yet.
    """
    if 0x90 <= b <= 0x9F:
        return b & 0x0F, 1
    if 0x80 <= b <= 0x8F:
        return 2 * (b & 0x0F), 1
    spec = _BIGCONTAINER.get(b)
    if spec is None:
        return None
    size, per = spec
    if pos + 1 + size > end:
        return -1, 0
    return per * int.from_bytes(buf[pos + 1 : pos + 1 + size], "big"), 1 + size


class _Scanner:
    """Finds where one msgpack map ends, resumable across feeds (each byte is read once).

    ``stack`` holds the number of items still expected by each open container. Positions
    are offsets into the decoder's buffer; the decoder shifts them when it compacts.
    """

    __slots__ = ("limit", "max_bytes", "pos", "stack", "start")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.start = self.pos = self.limit = 0
        self.stack: list[int] = []

    def begin(self, start: int) -> None:
        self.start = self.pos = start
        self.limit = start + self.max_bytes
        self.stack = []

    def shift(self, delta: int) -> None:
        self.start -= delta
        self.pos -= delta
        self.limit -= delta

    def _too_large(self, end: int) -> FrameTooLarge:
        return FrameTooLarge(
            f"msgpack frame needs at least {end - self.start} bytes, over the "
            f"{self.max_bytes}-byte limit"
        )

    def scan(self, buf: bytearray) -> int:
        """Return the end offset of the frame begun at ``start``, or -1 if incomplete."""
        end = len(buf)
        pos, stack, limit = self.pos, self.stack, self.limit
        if not stack and pos == self.start:
            if pos >= end:
                return -1
            if buf[pos] not in _MAP_LEADS:
                raise MalformedFrame(f"expected a msgpack map, got lead byte 0x{buf[pos]:02x}")
            count, hdr = _container(buf, pos, buf[pos], end) or (0, 0)
            if count < 0:
                return -1
            if pos + hdr + count > limit:
                raise self._too_large(pos + hdr + count)
            if count == 0:
                return pos + hdr
            stack.append(count)
            pos += hdr
        while stack:
            if pos >= end:
                break
            b = buf[pos]
            w = _WIDTH[b]
            if w:
                if pos + w > limit:
                    raise self._too_large(pos + w)
                if pos + w > end:
                    break
                pos += w
                stack[-1] -= 1
            else:
                pos_after, push = self._compound(buf, pos, b, end)
                if pos_after < 0:
                    break
                pos = pos_after
                stack[-1] -= 1
                if push:
                    if len(stack) >= MAX_NESTING:
                        raise MalformedFrame(f"msgpack nested deeper than {MAX_NESTING} levels")
                    stack.append(push)
                    continue
            while stack and stack[-1] == 0:
                stack.pop()
        self.pos = pos
        return -1 if stack else pos

    def _compound(self, buf: bytearray, pos: int, b: int, end: int) -> tuple[int, int]:
        """Consume a str/bin/ext value or a container header at ``pos``.

        Returns (next position, items the new container still expects), or (-1, 0) if the
        bytes needed are not buffered yet. Arrays of unsigned ints (the ``ids``) are skipped
        in a tight loop here rather than one item per pass of :meth:`scan`.
        """
        spec = _VARLEN.get(b)
        if spec is not None:
            size, extra = spec
            if pos + 1 + size > end:
                return -1, 0
            nxt = pos + 1 + size + extra + int.from_bytes(buf[pos + 1 : pos + 1 + size], "big")
            if nxt > self.limit:
                raise self._too_large(nxt)
            return (nxt, 0) if nxt <= end else (-1, 0)
        head = _container(buf, pos, b, end)
        if head is None:
            raise MalformedFrame(f"byte 0x{b:02x} is not valid MessagePack")
        count, hdr = head
        if count < 0:
            return -1, 0
        if pos + hdr + count > self.limit:  # every item takes at least one byte
            raise self._too_large(pos + hdr + count)
        pos += hdr
        if count and (0x90 <= b <= 0x9F or b in (0xDC, 0xDD)):
            pos, count = _skip_uints(buf, pos, count, end)
            if pos > self.limit:
                raise self._too_large(pos)
        return pos, count


def _skip_uints(buf: bytearray, pos: int, count: int, end: int) -> tuple[int, int]:
    """Skip up to ``count`` complete unsigned ints; stop early at anything else.

    When every remaining item is surely buffered (5 bytes each at most), whole blocks of
    2**k ints are skipped by precompiled regexes, one C call per set bit of ``count``.
    """
    if count >= _BLOCK_MIN and end - pos >= 5 * count:
        for k in range(count.bit_length() - 1, -1, -1):
            if count >> k & 1:
                m = _UINT_BLOCKS[k].match(buf, pos)
                if m is None:
                    break
                pos = m.end()
                count -= 1 << k
    width = _UINT_WIDTH
    while count and pos < end:
        w = width[buf[pos]]
        if not w or pos + w > end:
            break
        pos += w
        count -= 1
    return pos, count

# The frame engines send for every generated token: {"ids": [uints], "done": false}. One
# possessive match covers a whole run of them in C. The regex does not check that an array
# holds as many ints as its header says, so its boundaries are a *speculation*: they are
# used only if msgspec then decodes exactly that many frames from exactly those bytes
# (msgpack parses one way only, so success proves them); otherwise the decoder drops the
# fast path and re-splits with the exact scanner. Valid frames never fail: after the last
# id comes the 0xa4 of "done", which is not a uint lead, so the possessive run stops there.
_FAST_UINT_RE = rb"(?:[\x00-\x7f]|\xcc.|\xcd..|\xce....)"
_FAST_OVERHEAD = 1 + 4 + 5 + 6  # map header, "ids", array32 header, "done" + false


@functools.lru_cache(maxsize=8)
def _fast_run(max_frame_bytes: int) -> re.Pattern[bytes]:
    """The run pattern, with ids capped so a matched frame never exceeds the limit."""
    max_ids = (max_frame_bytes - _FAST_OVERHEAD) // 5
    return re.compile(
        rb"(?:\x82\xa3ids(?:[\x90-\x9f]|\xdc..|\xdd....)" + _FAST_UINT_RE
        + b"{0,%d}+" % max_ids + rb"\xa4done\xc2)++",
        re.DOTALL,
    )


# Counting this marker counts the frames of a valid fast run: it cannot occur inside the
# ids. An 0xa4 there is a payload byte of a 0xcc/0xcd/0xce int, so the 0xc2 five bytes later
# would also have to be a payload byte, but the four bytes between ("done") are not uint
# leads and no uint form carries five or more payload bytes. (If it ever miscounted, the
# msgspec check above would catch it.)
_FAST_MARKER = b"\xa4done\xc2"

_DONE = operator.attrgetter("done")


def _array_header(count: int) -> bytes:
    return b"\xdd" + count.to_bytes(4, "big")


class _Mode(enum.Enum):
    BARE = "bare maps"
    PREFIXED = "4-byte length prefix"


class MsgpackStreamDecoder(FrameDecoderBase):
    """Incremental decoder for a stream of msgpack maps, generic over the wire Struct.

    Subclasses set ``wire_type`` (a ``msgspec.Struct``), may override :meth:`_convert`
    (wire values -> :class:`Frame`) and set ``fast_path`` when ``wire_type`` is ``Frame``.
    The framing is chosen from the first byte and then held for the stream: a fixmap,
    map16 or map32 lead means bare maps (codec-spec.md §1.1); a byte below 0x80 means a
    4-byte big-endian length prefix (its first byte is 0x00 for any frame under 16 MiB).
    """

    wire_type: type = Frame
    fast_path = False

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        super().__init__(max_frame_bytes)
        self._buf = bytearray()
        self._off = 0  # start of the first byte not yet returned as part of a frame
        self._mode: _Mode | None = None
        self._scanner = _Scanner(max_frame_bytes)
        self._scanning = False  # the scanner holds a partially scanned frame
        self._one = msgspec.msgpack.Decoder(self.wire_type)
        self._many = msgspec.msgpack.Decoder(list[self.wire_type])  # type: ignore[name-defined]
        self._fast = (_fast_run(max_frame_bytes)
                      if self.fast_path and max_frame_bytes > _FAST_OVERHEAD else None)

    @property
    def mode(self) -> str | None:
        """The framing detected from the first byte, or None before any byte arrived."""
        return None if self._mode is None else self._mode.value

    def _buffered(self) -> int:
        return len(self._buf) - self._off

    def _convert(self, wire: list) -> list[Frame]:
        return wire

    def _feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        if not data:
            return []
        if self._done:
            raise DataAfterDone(f"{len(data)} bytes after the done frame")
        buf = self._buf
        buf += data
        if self._mode is None:
            self._mode = self._detect(buf[self._off])
        start = self._off
        if self._mode is _Mode.BARE:
            frames, stop, error = self._bare(start)
        else:
            frames, stop, error = self._split_prefixed()
        self._finish(frames, stop, error)
        return frames

    @staticmethod
    def _detect(first: int) -> _Mode:
        if first in _MAP_LEADS:
            return _Mode.BARE
        if first < 0x80:
            return _Mode.PREFIXED
        raise MalformedFrame(
            f"stream starts with 0x{first:02x}: neither a msgpack map nor a length prefix"
        )

    def _finish(self, frames: list[Frame], stop: int, error: RemoteProtocolError | None) -> None:
        """Check the done rule, then drop the consumed bytes (the one compaction per feed)."""
        done_count = sum(map(_DONE, frames)) if frames else 0
        if done_count:
            if (done_count > 1 or not frames[-1].done or stop < len(self._buf)
                    or error is not None):
                raise DataAfterDone("bytes follow the done=true frame")
            self._done = True
        if error is not None:
            raise error
        if stop:
            del self._buf[:stop]
            if self._scanning:
                self._scanner.shift(stop)
        self._off = 0

    def _bare(self, start: int) -> tuple[list[Frame], int, RemoteProtocolError | None]:
        """Split and decode bare maps from ``start``: (frames, end of the last, scan error)."""
        stop, count, error, speculated = self._split_bare()
        wire = self._decode_run(start, stop, count)
        if wire is None and speculated:
            # The regex boundaries were wrong (an array header that lies about its length):
            # forget them and the fast path, and re-split exactly from the same place.
            self._fast = None
            self._scanning = False
            stop, count, error, _ = self._split_bare()
            wire = self._decode_run(start, stop, count)
        if wire is None:
            return self._decode_each(start, stop), stop, error
        return self._convert(wire), stop, error

    def _split_bare(self) -> tuple[int, int, RemoteProtocolError | None, bool]:
        """Find complete frames from ``_off``.

        Returns (end of the last one, how many, scan error, whether the fast regex was used).
        """
        buf, scanner, fast = self._buf, self._scanner, self._fast
        pos, count, end, speculated = self._off, 0, len(self._buf), False
        try:
            while pos < end:
                if not self._scanning:
                    m = fast.match(buf, pos) if fast is not None else None
                    if m is not None:
                        count += buf.count(_FAST_MARKER, pos, m.end())
                        pos = m.end()
                        speculated = True
                        continue
                    scanner.begin(pos)
                    self._scanning = True
                stop = scanner.scan(buf)
                if stop < 0:
                    break
                self._scanning = False
                count += 1
                pos = stop
        except RemoteProtocolError as exc:
            return pos, count, exc, speculated
        return pos, count, None, speculated

    def _decode_run(self, start: int, stop: int, count: int) -> list | None:
        """Decode ``count`` contiguous frames in ``buf[start:stop]`` with one msgspec call.

        Returns the wire values, or None if msgspec rejects the batch.
        """
        if count == 0:
            return []
        with memoryview(self._buf) as view:
            try:
                if count == 1:
                    return [self._one.decode(view[start:stop])]
                return self._many.decode(b"".join((_array_header(count), view[start:stop])))
            except (msgspec.DecodeError, UnicodeDecodeError):
                return None

    def _decode_each(self, start: int, stop: int) -> list[Frame]:
        """Slow path after a failed batch: find the first bad frame and name its error."""
        frames: list[Frame] = []
        scanner = _Scanner(self.max_frame_bytes)
        while start < stop:
            if frames and frames[-1].done:
                raise DataAfterDone("bytes follow the done=true frame")
            scanner.begin(start)
            end = scanner.scan(self._buf)
            frames.extend(self._convert([self._decode_one(start, end)]))
            start = end
        return frames

    def _decode_one(self, start: int, stop: int) -> object:
        with memoryview(self._buf) as view:
            try:
                return self._one.decode(view[start:stop])
            except (msgspec.DecodeError, UnicodeDecodeError) as exc:
                raise MalformedFrame(f"invalid msgpack frame: {exc}") from exc

    def _split_prefixed(self) -> tuple[list[Frame], int, RemoteProtocolError | None]:
        """Decode length-prefixed frames from ``_off``: (frames, end of the last one, error)."""
        buf, pos, frames = self._buf, self._off, []
        try:
            while len(buf) - pos >= _PREFIX_BYTES:
                size = int.from_bytes(buf[pos : pos + _PREFIX_BYTES], "big")
                if size > self.max_frame_bytes:  # checked before buffering the body
                    raise FrameTooLarge(
                        f"length prefix announces {size} bytes, over the "
                        f"{self.max_frame_bytes}-byte limit"
                    )
                if len(buf) - pos - _PREFIX_BYTES < size:
                    break
                body = pos + _PREFIX_BYTES
                frames.extend(self._convert([self._decode_one(body, body + size)]))
                pos = body + size
                if frames[-1].done:
                    break
        except RemoteProtocolError as exc:
            return frames, pos, exc
        return frames, pos, None


class FrameDecoder(MsgpackStreamDecoder):
    """Incremental Mode A decoder: ``feed(bytes) -> list[Frame]``, then ``feed_eof()``."""

    wire_type = Frame
    fast_path = True


class FrameEncoder:
    """Pure Mode A encoder: ``encode(frame) -> bytes``, byte-exact with the engine forks.

    ``length_prefix=True`` writes a 4-byte big-endian length before each map (not what the
    engines send; for peers that follow the website's description). ``validate=False``
    skips the uint32 range check on ids when the caller guarantees it.
    """

    def __init__(self, *, length_prefix: bool = False, validate: bool = True) -> None:
        self.length_prefix = length_prefix
        self.validate = validate
        self._encode = msgspec.msgpack.Encoder().encode

    def encode(self, frame: Frame) -> bytes:
        if self.validate:
            ids = frame.ids
            if len(ids) != 1:
                check_ids(ids)
            elif not 0 <= ids[0] <= MAX_UINT32:
                raise LocalProtocolError(f"token id {ids[0]!r} is not a uint32")
        if frame.tool_calls.__class__ is list and not frame.tool_calls:
            # omit_defaults compares with the default () and would write an empty list.
            frame = msgspec.structs.replace(frame, tool_calls=())
        data = self._encode(frame)
        if self.length_prefix:
            return len(data).to_bytes(_PREFIX_BYTES, "big") + data
        return data
