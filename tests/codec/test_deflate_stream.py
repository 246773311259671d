"""GzipStream: one open fixed-Huffman block, every flush fully decodable by stock inflaters.

The rules (codec/deflate_stream.py, RFC 1951 §3.2.6, RFC 1952 §2.3):

* after every ``flush()`` a stock streaming inflater (``zlib.decompressobj(31)``, and the
  repo's own :class:`GzipDecompressor`) has output every byte compressed so far;
* the finished member is a valid gzip file: ``gzip.decompress`` returns the input, the
  trailer holds its CRC-32 and its length mod 2**32;
* any input: incompressible (zlib writes stored blocks), empty windows, huge windows (zlib
  ends blocks mid-window), highly repetitive data, unflushed ``compress`` calls.
"""

from __future__ import annotations

import gzip
import os
import random
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenwire.codec import deflate_stream
from tokenwire.codec.compression import GzipDecompressor
from tokenwire.codec.deflate_stream import STORED_MIN_LEN, GzipStream
from tokenwire.errors import LocalProtocolError


def _frames(ids: list[int]) -> bytes:
    """Codec-like msgpack frames, one id each (codec-spec §1.1)."""
    return b"".join(b"\x81\xa3ids\x91\xcd" + i.to_bytes(2, "big") + b"\xa4done\xc2" for i in ids)


# One window's data: random bytes (incompressible), a short unit repeated (long matches),
# text-like bytes from a small alphabet, Codec-like msgpack frames, or nothing.
_window_data = st.one_of(
    st.binary(max_size=400),
    st.builds(lambda unit, n: unit * n, st.binary(min_size=1, max_size=9), st.integers(1, 300)),
    st.text(alphabet="data: {}\"id,\n", max_size=300).map(str.encode),
    st.lists(st.integers(0, 65535), max_size=20).map(_frames),
    st.just(b""),
)
# (data, flush after it?): a window may be compressed without a flush.
_windows = st.lists(st.tuples(_window_data, st.booleans()), max_size=40)


def _run(windows: list[tuple[bytes, bool]], level: int = 6) -> bytes:
    """Compress ``windows``; after each flush both stock decoders must have every byte."""
    g = GzipStream(level)
    stock, ours = zlib.decompressobj(31), GzipDecompressor()
    body, fed, got, got_ours = b"", b"", b"", b""
    for data, flush in windows:
        out = g.compress(data)
        fed += data
        if flush:
            out += g.flush()
        body += out
        got += stock.decompress(out)
        got_ours += ours.decompress(out)
        if flush:
            assert got == fed, f"{len(got)} of {len(fed)} bytes out after the flush"
            assert got_ours == fed
    end = g.finish()
    body += end
    assert stock.decompress(end) == fed[len(got):] and stock.eof and not stock.unused_data
    assert ours.decompress(end) == fed[len(got_ours):]
    ours.finish()
    assert gzip.decompress(body) == fed
    assert body[-8:] == zlib.crc32(fed).to_bytes(4, "little") + len(fed).to_bytes(4, "little")
    return body


@settings(max_examples=300)
@given(_windows)
def test_every_flush_is_decodable_and_the_member_is_valid(windows):
    _run(windows)


@settings(max_examples=50)
@given(_windows, st.sampled_from([1, 9]))
def test_other_levels(windows, level):
    _run(windows, level)


def test_empty_body_and_finish_without_flush():
    assert gzip.decompress(_run([])) == b""
    assert gzip.decompress(_run([(b"", True), (b"", True)])) == b""
    _run([(b"abc" * 50, False)])  # finish() with data zlib still holds


def test_header_is_zlibs():
    # The same 10 bytes zlib writes for wbits=31 at this level (mtime 0, OS unix).
    for level in (1, 6, 9):
        ref = zlib.compressobj(level, zlib.DEFLATED, 31)
        assert GzipStream(level).compress(b"x") == (ref.compress(b"x") + ref.flush())[:10]


def test_incompressible_windows_long_and_short():
    rng = random.Random(15)
    short = [rng.randbytes(rng.randrange(40, STORED_MIN_LEN)) for _ in range(30)]
    long = [rng.randbytes(rng.randrange(STORED_MIN_LEN, 70000)) for _ in range(5)]
    body = _run([(w, True) for w in short + long + short])
    assert len(body) < sum(map(len, short + long + short)) * 1.07  # stored, not 9-bit literals


def test_huge_windows():
    # MiBs in one call: zlib ends its blocks (fixed and stored) in the middle of the window.
    rng = random.Random(4)
    text = b" ".join(rng.choice([b"token", b"wire", b"gzip", b"frame", b"%d" % i])
                     for i in range(400_000))  # fmt: skip
    _run([(text, True), (os.urandom(3 << 20), True), (b"\0" * (4 << 20), False), (text, True)])


def test_huge_window_in_small_unflushed_pieces():
    # zlib's output between flushes ends wherever its buffer filled: mid-symbol, mid-header,
    # mid-LEN of a stored block. The reader must pick up where it stopped.
    rng = random.Random(7)
    parts = []
    for k in range(3000):
        if k % 3:
            parts.append(b"data: {\"id\": %d, \"token\": %d}\n\n" % (k, rng.randrange(50)))
        else:
            parts.append(rng.randbytes(rng.randrange(1, 700)))
    _run([(p, k % 500 == 499) for k, p in enumerate(parts)])


def test_long_mixed_stream_every_window_flushed():
    # Thousands of short windows over a growing history: pads of every length, matches
    # re-pointed to every distance class, misses, stored blocks in between.
    rng = random.Random(1)
    pool = [rng.randrange(65536) for _ in range(40)]
    windows = []
    for _ in range(4000):
        kind = rng.random()
        if kind < 0.7:
            data = _frames([rng.choice(pool) for _ in range(rng.randrange(1, 4))])
        elif kind < 0.8:
            data = rng.randbytes(rng.randrange(0, 300))
        elif kind < 0.95:
            data = rng.choice([b"the ", b"cat ", b"sat ", b"on ", b"mat "]) * rng.randrange(1, 9)
        else:
            data = b""
        windows.append((data, True))
    _run(windows)


class _Dribble:
    """zlib's raw deflate, handed over a few bytes per ``compress`` call (cut anywhere:
    inside a code, a header, a stored block's LEN), all of it at a flush; ``Z_BLOCK`` is
    replaced with ``Z_SYNC_FLUSH`` to add zlib's empty stored block and byte alignment."""

    def __init__(self, real, sizes: random.Random) -> None:
        self._real, self._sizes, self._held = real, sizes, b""

    def compress(self, data: bytes) -> bytes:
        self._held += self._real.compress(data) + self._real.flush(zlib.Z_BLOCK)
        n = self._sizes.randrange(0, 4)
        out, self._held = self._held[:n], self._held[n:]
        return out

    def flush(self, mode: int) -> bytes:
        mode = zlib.Z_SYNC_FLUSH if mode == zlib.Z_BLOCK else mode
        out, self._held = self._held + self._real.flush(mode), b""
        return out


@pytest.mark.parametrize("seed", range(20))
def test_reader_takes_zlib_output_cut_anywhere(seed, monkeypatch):
    rng = random.Random(seed)
    real_init = GzipStream.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self._z = _Dribble(self._z, rng)

    monkeypatch.setattr(GzipStream, "__init__", init)
    pieces = [rng.choice([b"\x81\xa3ids\x91\x05\xa4done\xc2", rng.randbytes(rng.randrange(200)),
                          b"abc" * rng.randrange(90)]) for _ in range(300)]  # fmt: skip
    _run([(p, rng.random() < 0.2) for p in pieces])


def test_repetitive_windows_take_no_flush_bytes():
    # A frame repeated every window: after the first few, every flush costs at most the
    # bits of one symbol, never a whole new block per window.
    frame = b"\x81\xa3ids\x91\xcd\x01\x02\xa4done\xc2"
    g = GzipStream()
    sizes = [len(g.compress(frame) + g.flush()) for _ in range(500)]
    assert sum(sizes[100:]) <= 3 * 400


def test_trailer_size_is_mod_2_32():
    assert deflate_stream.gzip_trailer(7, (1 << 32) + 5) == b"\x07\0\0\0\x05\0\0\0"


def test_unusable_after_finish():
    g = GzipStream()
    g.finish()
    for call in (lambda: g.compress(b"x"), g.flush, g.finish):
        with pytest.raises(LocalProtocolError):
            call()
