"""HTTP content codings for Codec response bodies: compressors and bounded decompressors.

Sans-IO: nothing here reads the clock or touches a socket. When a streamed body is flushed
is :mod:`tokenwire.codec.coalescer`'s decision.

Rules this module enforces (codec-spec §4):

* One compression context spans the whole response body, never one per frame (§4.1).
* zstd only with a pre-trained dictionary (§4.1): :class:`ZstdCompressor` cannot be built
  without a :class:`ZstdDict`, and the decompressor refuses a zstd body without one.
* Flushing keeps the history: gzip pads its one open fixed-Huffman block to a byte
  (:mod:`tokenwire.codec.deflate_stream`; text streams end a fixed block with ``Z_BLOCK``,
  see :class:`GzipCompressor`), brotli ends a metablock
  (``BROTLI_OPERATION_FLUSH``), zstd a block (``FLUSH_BLOCK``). ``Z_FULL_FLUSH`` (which
  resets the window) is never used (§4.2). The reference engine
  never flushes mid-stream (§9.1 item 9), so a client decodes nothing until the end; the
  :class:`~tokenwire.codec.coalescer.Coalescer` flushes at the end of every coalescing
  window instead (§10 item 1), so each frame is decodable within one window.
* Decompression has a budget of decompressed bytes (§9.1 item 23, §10 item 4): going over it
  raises :class:`DecompressionLimitExceeded`; output is never silently truncated.
* A decompressor hands its output on in pieces of about :data:`PIECE_BYTES`
  (:meth:`Decompressor.pieces`), each made only once the one before it was taken: a few KB
  of gzip that expand to the whole budget are never held, nor decoded into frames, at once.

Registries are keyed by the wire token (STYLE §6 item 8). A missing optional module (brotli,
zstandard) removes its entry instead of failing at import time.
"""

from __future__ import annotations

import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar

from tokenwire.codec.deflate_stream import GzipStream
from tokenwire.codec.maps import parse_hash, sha256_hash
from tokenwire.errors import (
    DecompressionError,
    DecompressionLimitExceeded,
    LocalProtocolError,
    MapHashMismatch,
    MapNotFound,
    RemoteProtocolError,
)

try:  # optional: a missing module removes the "br" entries (STYLE §6 item 8)
    import brotli
except ImportError:  # pragma: no cover - exercised by loading this file without brotli
    brotli = None

try:  # optional: a missing module removes the "zstd" entries
    import zstandard
except ImportError:  # pragma: no cover
    zstandard = None

__all__ = [
    "BROTLI_LGWIN",
    "BROTLI_QUALITY",
    "COMPRESSORS",
    "DECOMPRESSORS",
    "DEFAULT_MAX_DECOMPRESSED",
    "DICT_SIZE",
    "GZIP_LEVEL",
    "GZIP_WBITS",
    "MAX_ZSTD_WINDOW",
    "PIECE_BYTES",
    "ZSTD_LEVEL",
    "BrotliCompressor",
    "BrotliDecompressor",
    "Compressor",
    "Decompressor",
    "GzipCompressor",
    "GzipDecompressor",
    "IdentityCompressor",
    "IdentityDecompressor",
    "ZstdCompressor",
    "ZstdDecompressor",
    "ZstdDict",
    "decompressor_for_response",
    "new_compressor",
    "new_decompressor",
    "train_dictionary",
]

# -- Named parameters and limits -----------------------------------------------------------

#: gzip level of the reference engine (codec-spec §4.2); wbits 31 = gzip header + trailer.
GZIP_LEVEL = 6
GZIP_WBITS = 31
#: Brotli quality. The engine uses 4. Measured at 1 id/frame, 2,048-token msgpack streams with
#: a flush per window (50 / 100 ms): q4 6.0 / 4.35, q5 4.4 / 3.4, q6 4.3 / 3.4 B/token. q4
#: loses 25-35% when flushed; q6 gains ~1% over q5 for more CPU, so 5.
BROTLI_QUALITY = 5
#: Sliding window of brotli, as the engine (§4.2): 4 MiB.
BROTLI_LGWIN = 22
#: zstd level of the reference engine (§4.2).
ZSTD_LEVEL = 3
#: Size of a trained dictionary: the reference set uses 16 KiB (§3.7).
DICT_SIZE = 16384
#: Decompressed-bytes budget per response. 16 MiB is the chat tier of the v0.6 security
#: proposal (§9.3, §10 item 4): a 2K-token msgpack stream is ~28 KB, so this is >500x headroom
#: while a zstd or gzip bomb (a few KB expanding to GBs) is stopped early.
DEFAULT_MAX_DECOMPRESSED = 16 * 1024 * 1024
#: Largest zstd window a decoder accepts. RFC 9659 §3 caps Content-Encoding: zstd windows at
#: 8 MiB, and the engine's level 3 uses 2 MiB, so more is either a bug or a memory attack.
MAX_ZSTD_WINDOW = 8 * 1024 * 1024
#: Compressed input fed to a decoder per call. A zstd/deflate block of a few bytes can expand
#: to 128 KiB, so feeding at most this many bytes at a time bounds one call's output to a few
#: MiB before the budget check runs.
_DECODE_SLICE = 64
#: The most one step of decoding makes before it is handed on (:meth:`Decompressor.pieces`):
#: a gzip bomb's 16 MiB, decoded whole and then into frames, made ~1.2 million frame
#: objects (260 MB) out of one 30 KB network read.
PIECE_BYTES = 64 * 1024


# -- Dictionaries --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ZstdDict:
    """A raw zstd dictionary and its content address ``sha256:<hex>`` of the raw bytes.

    The hash is what ``Codec-Zstd-Dict`` carries (codec-spec §2.5, §3.7).
    """

    raw: bytes
    hash: str

    @classmethod
    def from_bytes(cls, raw: bytes, *, expected_hash: str | None = None) -> ZstdDict:
        """Wrap ``raw``; with ``expected_hash`` verify it first (§4.4: mismatch is fatal)."""
        actual = sha256_hash(raw)
        if expected_hash is not None and parse_hash(expected_hash) != actual:
            raise MapHashMismatch(parse_hash(expected_hash), actual, "zstd dictionary")
        return cls(raw=bytes(raw), hash=actual)


def train_dictionary(samples: Iterable[bytes], size: int = DICT_SIZE) -> bytes:
    """Train a raw zstd dictionary of ``size`` bytes on whole response bodies (§3.7)."""
    if zstandard is None:
        raise LocalProtocolError("zstandard is not installed; cannot train a dictionary")
    return zstandard.train_dictionary(size, list(samples)).as_bytes()


# -- Compressors ---------------------------------------------------------------------------


class Compressor(ABC):
    """One compression context for one response body.

    ``compress`` may return ``b""`` while the codec buffers; ``flush`` forces out everything
    fed so far as decodable bytes without resetting the history; ``finish`` ends the stream.
    """

    encoding: ClassVar[str]

    def __init__(self) -> None:
        self._finished = False

    def compress(self, data: bytes) -> bytes:
        self._check_open()
        return self._compress(data) if data else b""

    def flush(self) -> bytes:
        self._check_open()
        return self._flush()

    def finish(self) -> bytes:
        self._check_open()
        self._finished = True
        return self._finish()

    def compress_body(self, data: bytes) -> bytes:
        """A whole body at once, finished: no flush points, so a codec may code it as it
        would a file (gzip uses zlib's dynamic blocks instead of one fixed block)."""
        out = self.compress(data)
        return out + self.finish()

    def _check_open(self) -> None:
        if self._finished:
            raise LocalProtocolError(f"{self.encoding} compressor used after finish()")

    @abstractmethod
    def _compress(self, data: bytes) -> bytes: ...

    @abstractmethod
    def _flush(self) -> bytes: ...

    @abstractmethod
    def _finish(self) -> bytes: ...


class IdentityCompressor(Compressor):
    """No content coding: bytes pass through unchanged."""

    encoding = "identity"

    def _compress(self, data: bytes) -> bytes:
        return bytes(data)

    def _flush(self) -> bytes:
        return b""

    def _finish(self) -> bytes:
        return b""


class _ZlibBlocks:
    """gzip through zlib alone, each flush ending a fixed-Huffman block (``Z_BLOCK``): the
    block's last bits are its 7-bit end-of-block code, so nothing of the data stays in the
    compressor. Fixed codes (``Z_FIXED``) because after a dynamic block, whose end-of-block
    code can be shorter, ``Z_BLOCK`` can hold back data bits (a 5 s window on the replay did;
    tests/codec/test_flush_points.py). Same methods as :class:`GzipStream`."""

    def __init__(self, level: int) -> None:
        self._z = zlib.compressobj(level, zlib.DEFLATED, GZIP_WBITS, strategy=zlib.Z_FIXED)

    def compress(self, data: bytes) -> bytes:
        return self._z.compress(data)

    def flush(self) -> bytes:
        return self._z.flush(zlib.Z_BLOCK)

    def finish(self) -> bytes:
        return self._z.flush(zlib.Z_FINISH)


class GzipCompressor(Compressor):
    """gzip (RFC 1952), flushed at each window without resetting the history (§4.2).

    The flush rule (issue 15, BENCHMARKS.md "Compression at short windows"): a Codec token
    stream (``open_block``, the default) goes through :class:`GzipStream`, one fixed-Huffman
    block kept open across flushes whose pad bits begin the next code; on the 2,048-token
    replay at 20 ms that is 2.97 B/token for msgpack where zlib's ``Z_BLOCK`` gives 3.79
    (0.72 vs 0.90 at 150 ms), for ~3 µs more CPU per token. A text stream (the SSE of the
    OpenAI and Anthropic APIs, ~200 bytes per token) passes ``open_block=False`` and flushes
    with ``Z_BLOCK`` (:class:`_ZlibBlocks`): there the open block saves 2% of the bytes at
    150 ms (8% at 20 ms) and its Python walk of zlib's many symbols costs 2-5 µs per token
    more, 3x the CPU. A whole body
    (:meth:`compress_body`) keeps zlib's default strategy.
    """

    encoding = "gzip"

    def __init__(self, *, level: int = GZIP_LEVEL, open_block: bool = True) -> None:
        super().__init__()
        self._level = level
        self._used = False
        self._g = GzipStream(level) if open_block else _ZlibBlocks(level)

    def _compress(self, data: bytes) -> bytes:
        self._used = True
        return self._g.compress(data)

    def _flush(self) -> bytes:
        self._used = True
        return self._g.flush()

    def _finish(self) -> bytes:
        return self._g.finish()

    def compress_body(self, data: bytes) -> bytes:
        if self._used:  # part of the body went through the streaming context already
            return super().compress_body(data)
        self._check_open()
        self._finished = True
        # Never flushed, so zlib's default strategy (dynamic blocks) is safe, and smaller.
        whole = zlib.compressobj(self._level, zlib.DEFLATED, GZIP_WBITS)
        return whole.compress(data) + whole.flush()


class BrotliCompressor(Compressor):
    """brotli (RFC 7932); ``flush`` is ``BROTLI_OPERATION_FLUSH`` (ends a metablock)."""

    encoding = "br"

    def __init__(self, *, quality: int = BROTLI_QUALITY) -> None:
        super().__init__()
        if brotli is None:  # pragma: no cover
            raise LocalProtocolError("brotli is not installed")
        self._b = brotli.Compressor(mode=brotli.MODE_GENERIC, quality=quality, lgwin=BROTLI_LGWIN)

    def _compress(self, data: bytes) -> bytes:
        return self._b.process(data)

    def _flush(self) -> bytes:
        return self._b.flush()

    def _finish(self) -> bytes:
        return self._b.finish()


class ZstdCompressor(Compressor):
    """zstd (RFC 8878) with a mandatory trained dictionary; ``flush`` is ``FLUSH_BLOCK``."""

    encoding = "zstd"

    def __init__(self, dictionary: ZstdDict, *, level: int = ZSTD_LEVEL) -> None:
        super().__init__()
        if zstandard is None:  # pragma: no cover
            raise LocalProtocolError("zstandard is not installed")
        if not isinstance(dictionary, ZstdDict):
            # codec-spec §4.1: a server MUST NOT answer zstd without a loaded dictionary.
            raise LocalProtocolError("zstd requires a ZstdDict (codec-spec §4.1)")
        self.dictionary = dictionary
        zdict = zstandard.ZstdCompressionDict(dictionary.raw)
        self._z = zstandard.ZstdCompressor(level=level, dict_data=zdict).compressobj()

    def _compress(self, data: bytes) -> bytes:
        return self._z.compress(data)

    def _flush(self) -> bytes:
        # FLUSH_BLOCK ends the block but keeps the window and the dictionary (§4.2).
        return self._z.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)

    def _finish(self) -> bytes:
        return self._z.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH)


COMPRESSORS: dict[str, type[Compressor]] = {
    "identity": IdentityCompressor,
    "gzip": GzipCompressor,
}
if brotli is not None:
    COMPRESSORS["br"] = BrotliCompressor
if zstandard is not None:
    COMPRESSORS["zstd"] = ZstdCompressor


def new_compressor(encoding: str, *, dictionary: ZstdDict | None = None,
                   open_block: bool = True) -> Compressor:  # fmt: skip
    """Build the compressor for a ``Content-Encoding`` token with the engine parameters.

    ``open_block=False`` is for text streams: gzip then flushes with zlib's ``Z_BLOCK`` (the
    rule is in :class:`GzipCompressor`); the other codings ignore it. Raises
    :class:`LocalProtocolError` for an unknown or uninstalled encoding (never a silent
    identity fall-through, §9.1 item 23) and for zstd without a dictionary (§4.1).
    """
    cls = COMPRESSORS.get(encoding.lower())
    if cls is None:
        raise LocalProtocolError(f"content coding {encoding!r} is not available")
    if cls is ZstdCompressor:
        if dictionary is None:
            raise LocalProtocolError("zstd requires a ZstdDict (codec-spec §4.1)")
        return ZstdCompressor(dictionary)
    if cls is GzipCompressor:
        return GzipCompressor(open_block=open_block)
    return cls()


# -- Decompressors -------------------------------------------------------------------------


class Decompressor(ABC):
    """Decodes one response body with a budget of decompressed bytes.

    ``decompress(data)`` returns the bytes decoded so far; ``finish()`` raises
    :class:`DecompressionError` if the coded stream is incomplete. Any error is permanent.
    """

    encoding: ClassVar[str]

    def __init__(self, *, max_output: int = DEFAULT_MAX_DECOMPRESSED) -> None:
        self.max_output = max_output
        self.total_out = 0
        self._failed: DecompressionError | None = None

    def decompress(self, data: bytes) -> bytes:
        """``data`` decoded whole (up to the budget)."""
        return b"".join(self.pieces(data))

    def pieces(self, data: bytes) -> Iterator[bytes]:
        """``data`` decoded in pieces of at most about :data:`PIECE_BYTES` (brotli's limit
        is a hint, a zstd slice may make a few blocks), each made after the one before it
        was taken: a caller that handles one piece at a time holds one piece."""
        if self._failed is not None:
            raise self._failed
        try:
            for piece in self._pieces(bytes(data)):
                if piece:
                    yield piece
        except DecompressionError as exc:
            self._failed = exc
            raise

    def finish(self) -> bytes:
        if self._failed is not None:
            raise self._failed
        return self._finish()

    def _account(self, out: bytes) -> bytes:
        self.total_out += len(out)
        if self.total_out > self.max_output:
            # Reject, never truncate (§10 item 4).
            raise DecompressionLimitExceeded(
                f"{self.encoding} body decompresses past the {self.max_output}-byte budget"
            )
        return out

    def _room(self) -> int:
        """What the next step may make: a piece, and one byte past the budget at most (that
        byte is how an overrun is seen)."""
        return min(PIECE_BYTES, self.max_output - self.total_out + 1)

    @abstractmethod
    def _pieces(self, data: bytes) -> Iterator[bytes]: ...

    @abstractmethod
    def _finish(self) -> bytes: ...


class IdentityDecompressor(Decompressor):
    encoding = "identity"

    def _pieces(self, data: bytes) -> Iterator[bytes]:
        for i in range(0, len(data), PIECE_BYTES):
            yield self._account(data[i : i + PIECE_BYTES])

    def _finish(self) -> bytes:
        return b""


class GzipDecompressor(Decompressor):
    encoding = "gzip"

    def __init__(self, *, max_output: int = DEFAULT_MAX_DECOMPRESSED) -> None:
        super().__init__(max_output=max_output)
        self._z = zlib.decompressobj(GZIP_WBITS)

    def _pieces(self, data: bytes) -> Iterator[bytes]:
        while data:
            if self._z.eof:
                raise DecompressionError("bytes after the end of the gzip stream")
            try:
                chunk = self._z.decompress(data, self._room())
            except zlib.error as exc:
                raise DecompressionError(f"corrupt gzip body: {exc}") from exc
            yield self._account(chunk)
            data = self._z.unconsumed_tail or self._z.unused_data
            if not chunk and data == self._z.unconsumed_tail and not self._z.eof:
                break  # pragma: no cover - zlib made no progress

    def _finish(self) -> bytes:
        if not self._z.eof:
            raise DecompressionError("gzip body ended before the end of the stream")
        return b""


class BrotliDecompressor(Decompressor):
    encoding = "br"

    def __init__(self, *, max_output: int = DEFAULT_MAX_DECOMPRESSED) -> None:
        super().__init__(max_output=max_output)
        self._b = brotli.Decompressor()

    def _pieces(self, data: bytes) -> Iterator[bytes]:
        if self._b.is_finished() and data:
            raise DecompressionError("bytes after the end of the brotli stream")
        try:
            chunk = self._b.process(data, output_buffer_limit=self._room())
        except brotli.error as exc:
            raise DecompressionError(f"corrupt brotli body: {exc}") from exc
        yield self._account(chunk)
        while not self._b.can_accept_more_data():
            try:
                chunk = self._b.process(b"", output_buffer_limit=self._room())
            except brotli.error as exc:
                raise DecompressionError(f"corrupt brotli body: {exc}") from exc
            yield self._account(chunk)

    def _finish(self) -> bytes:
        if not self._b.is_finished():
            raise DecompressionError("brotli body ended before the end of the stream")
        return b""


class ZstdDecompressor(Decompressor):
    """zstd with the dictionary named by ``Codec-Zstd-Dict`` and an 8 MiB window cap."""

    encoding = "zstd"

    def __init__(self, dictionary: ZstdDict, *, max_output: int = DEFAULT_MAX_DECOMPRESSED) -> None:
        super().__init__(max_output=max_output)
        if not isinstance(dictionary, ZstdDict):
            raise RemoteProtocolError("zstd body without a dictionary (codec-spec §2.7)")
        try:
            zdict = zstandard.ZstdCompressionDict(dictionary.raw)
            dctx = zstandard.ZstdDecompressor(dict_data=zdict, max_window_size=MAX_ZSTD_WINDOW)
        except zstandard.ZstdError as exc:  # e.g. the dictionary magic, then garbage
            raise DecompressionError(
                f"zstd dictionary {dictionary.hash} is not usable: {exc}") from exc
        self._z = dctx.decompressobj()

    def _pieces(self, data: bytes) -> Iterator[bytes]:
        for i in range(0, len(data), _DECODE_SLICE):
            if self._z.eof:
                raise DecompressionError("bytes after the end of the zstd frame")
            try:
                chunk = self._z.decompress(data[i : i + _DECODE_SLICE])
            except zstandard.ZstdError as exc:
                raise DecompressionError(f"corrupt zstd body: {exc}") from exc
            yield self._account(chunk)
            if self._z.eof and self._z.unused_data:
                raise DecompressionError("bytes after the end of the zstd frame")

    def _finish(self) -> bytes:
        if not self._z.eof:
            raise DecompressionError("zstd body ended before the end of the frame")
        return b""


DECOMPRESSORS: dict[str, type[Decompressor]] = {
    "identity": IdentityDecompressor,
    "gzip": GzipDecompressor,
}
if brotli is not None:
    DECOMPRESSORS["br"] = BrotliDecompressor
if zstandard is not None:
    DECOMPRESSORS["zstd"] = ZstdDecompressor


def new_decompressor(
    encoding: str | None,
    *,
    dictionary: ZstdDict | None = None,
    max_output: int = DEFAULT_MAX_DECOMPRESSED,
) -> Decompressor:
    """Decoder for a response ``Content-Encoding`` (absent or empty = identity)."""
    token = (encoding or "identity").strip().lower()
    cls = DECOMPRESSORS.get(token)
    if cls is None:
        raise DecompressionError(f"unsupported Content-Encoding {encoding!r}", status_hint=415)
    if cls is ZstdDecompressor:
        if dictionary is None:
            raise RemoteProtocolError("Content-Encoding: zstd without a dictionary")
        return ZstdDecompressor(dictionary, max_output=max_output)
    return cls(max_output=max_output)


def decompressor_for_response(
    content_encoding: str | None,
    zstd_dict_header: str | None,
    dictionaries: Mapping[str, ZstdDict],
    *,
    max_output: int = DEFAULT_MAX_DECOMPRESSED,
) -> Decompressor:
    """Client side of codec-spec §2.7: pick the decoder and dictionary for a response.

    * zstd without ``Codec-Zstd-Dict`` -> :class:`RemoteProtocolError`;
    * ``Codec-Zstd-Dict`` on a non-zstd response -> :class:`RemoteProtocolError`;
    * a dictionary hash not in ``dictionaries`` (keyed by ``sha256:<hex>``) ->
      :class:`MapNotFound` naming the hash, so the caller can fetch, verify and retry;
    * never another dictionary than the one named (a mismatch is fatal).
    """
    token = (content_encoding or "identity").strip().lower()
    if token != "zstd":
        if zstd_dict_header is not None:
            raise RemoteProtocolError(f"Codec-Zstd-Dict on a {token} response (§2.7)")
        return new_decompressor(token, max_output=max_output)
    if not zstd_dict_header:
        raise RemoteProtocolError("Content-Encoding: zstd without Codec-Zstd-Dict (§2.7)")
    try:
        wanted = parse_hash(zstd_dict_header.strip())
    except ValueError as exc:
        raise RemoteProtocolError(f"bad Codec-Zstd-Dict value {zstd_dict_header!r}") from exc
    zdict = dictionaries.get(wanted)
    if zdict is None:
        raise MapNotFound(f"zstd dictionary {wanted} is not held; fetch and verify it")
    return new_decompressor("zstd", dictionary=zdict, max_output=max_output)
