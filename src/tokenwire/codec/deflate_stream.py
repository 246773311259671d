"""gzip for streamed bodies: one fixed-Huffman deflate block that a flush does not end.

Why (issue 15, BENCHMARKS.md "Compression at short windows"). At a 20 ms coalescing window
most flushes carry one token (~3 bytes compressed), so the flush itself is the cost. zlib's
cheapest flush a stock inflater fully outputs is ``Z_BLOCK`` on a fixed-Huffman block: the
7-bit end-of-block code and the next block's 3-bit header, 10 bits per flush. This module
spends nothing on most flushes instead:

* It keeps **one** fixed-Huffman block (RFC 1951 §3.2.6) open across flushes. A streaming
  inflater outputs each literal and each match as soon as its last bit arrives (zlib's
  ``inflate`` does, and with it Python, Node's and the browsers' ``DecompressionStream`` and
  curl, all tested in tests/codec/test_flush_points.py); nothing waits for the end of the
  block.
* A flush must end on a byte, so it pads the last partial byte with ``p`` zero bits
  (``p = 1..7``). Zero bits commit to nothing we cannot honour: fixed codes are sent most
  significant bit first, and ``p`` zeros begin the end-of-block code (``0000000``, symbol
  256); they also begin the 7-bit length codes ``0000001``-``0010111`` (symbols 257-279) up
  to the one whose code has fewer leading zeros: with ``p = 3``, symbols 257-271 (match
  lengths 3-30). The inflater sees an incomplete code and waits. The next window's first
  symbol then either begins with those ``p`` zeros (it "fits": its remaining bits follow, the
  flush cost nothing), or it does not, and the zeros become the end-of-block code (``7 - p``
  more zero bits) followed by a new fixed block's 3-bit header: the same 10 bits ``Z_BLOCK``
  pays (FLUSH_MISS_BITS). With ``p = 7`` the pad is a whole end-of-block code.
* Which ``p`` fits depends on the next window's first symbol, unknown at the flush. What is
  known is how often first symbols began with how many zeros (a token frame usually starts
  with a match of length 6-30, codes that begin with 3-4 zeros), and that the pad can be
  moved: a match's distance can point at an older copy of the same bytes, whose distance code
  has more extra bits (RFC 1951 §3.2.5). Pointing one match of the window ``b`` bits further
  turns a pad of ``p`` into ``p - b``. :meth:`GzipStream.flush` picks the ``b`` with the
  smallest expected cost: ``b`` bits now plus FLUSH_MISS_BITS times the share of first
  symbols so far that would not fit ``p - b`` zeros.

zlib still does the LZ77 matching (in C): each window goes through a raw deflate stream
(``wbits=-15``) with ``Z_FIXED`` and ``Z_BLOCK``. Its fixed blocks use the very codes this
stream does, so a symbol's bits are copied as they are; this module only walks them to find
symbol boundaries, the block ends and the matches. zlib's stored blocks (its choice for
incompressible data) become literals when short and our own stored blocks when long. The gzip
header and the CRC-32/ISIZE trailer (RFC 1952 §2.3) are written here, and the stream ends
with an empty final fixed block.

The first flush is the exception: while zlib has written nothing yet (a stream's first
window, a frame or two), it is zlib's own ``Z_SYNC_FLUSH`` output as it is: its block, ended,
then an empty stored block, so the stream is byte-aligned at a block boundary, where the
reader and the writer above start anyway. It costs 5-6 bytes once per stream (the stored
block's marker and one more block header) and saves walking the first window in Python on
the way to the first token, where nothing is warm: 86 -> 37 µs with the caches evicted
(BENCHMARKS.md, "Session of 2026-12-05 (6)").

Used for Codec token streams (a few bytes per flush); text streams, whose flushes carry
hundreds of bytes, keep zlib's ``Z_BLOCK`` (the rule and its numbers: ``GzipCompressor``).
Sans-IO and pure: bytes in, bytes out, no clock.
"""

from __future__ import annotations

import zlib

from tokenwire.errors import LocalProtocolError

__all__ = ["FLUSH_MISS_BITS", "STORED_MIN_LEN", "GzipStream", "gzip_trailer"]

#: What a pad costs when the next window's first symbol does not begin with its zeros: the
#: rest of the end-of-block code and the next block's header, 7 + 3 bits in all (the pad's own
#: bits are part of the end-of-block code).
FLUSH_MISS_BITS = 10
#: zlib's stored blocks shorter than this are re-emitted as fixed-code literals, longer ones as
#: stored blocks. A stored block costs ~48 bits of framing (end of our block, 3-bit header,
#: byte alignment, LEN/NLEN, the next fixed header); a literal of incompressible data costs
#: 8.44 bits on average (bytes 144-255 take 9 bits), so the two meet near 110 bytes. Long ones
#: are also copied by ``bytes`` rather than coded a byte at a time in Python.
STORED_MIN_LEN = 128
#: Uncoded bits held before they are turned into bytes: big integers cost O(size) per shift,
#: so a large window is committed in slices of this many bits (matches before the last slice
#: can then no longer be re-pointed, which only matters to the last few bits of a window).
_COMMIT_BITS = 4096
#: Matches of a window remembered as candidates for re-pointing at the flush.
_CANDIDATES = 6
#: First symbols seen between two re-rankings of the pads (the ranking only drifts).
_REORDER_EVERY = 8
#: Deflate's window (RFC 1951 §3.2.5: distances up to 32,768) and the history kept for it.
_WINDOW = 32768
_GZIP_MAGIC = b"\x1f\x8b\x08\x00\x00\x00\x00\x00"  # ID1 ID2 CM=deflate FLG=0 MTIME=0
_OS_UNIX = 3  # RFC 1952 §2.3.1, what zlib writes

# -- RFC 1951 tables -------------------------------------------------------------------------

# §3.2.5: length symbols 257..285 and distance codes 0..29, their base values and extra bits.
_LBASE = (3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99,
          115, 131, 163, 195, 227, 258)  # fmt: skip
_LEXTRA = (0,) * 8 + (1,) * 4 + (2,) * 4 + (3,) * 4 + (4,) * 4 + (5,) * 4 + (0,)
_DBASE = tuple([1, 2, 3, 4] + [(1 << (c // 2 - 1)) * (2 + c % 2) + 1 for c in range(4, 30)])
_DEXTRA = (0, 0, 0, 0, *(c // 2 - 1 for c in range(4, 30)))
_MASK = tuple((1 << n) - 1 for n in range(64))


def _reverse(code: int, n: int) -> int:
    """Huffman codes are sent most significant bit first into an LSB-first bit stream
    (§3.1.1), so a code is stored bit-reversed and ORed in like any other field."""
    return int(f"{code:0{n}b}"[::-1], 2) if n else 0


def _fixed_code(sym: int) -> tuple[int, int]:
    """(code, length) of a literal/length symbol in the fixed Huffman code (§3.2.6)."""
    if sym < 144:
        return 0x30 + sym, 8
    if sym < 256:
        return 0x190 + sym - 144, 9
    if sym < 280:
        return sym - 256, 7
    return 0xC0 + sym - 280, 8


# Literal byte -> bit-reversed fixed code and its length (for re-coding stored data).
_LIT_CODE = tuple(_reverse(*_fixed_code(b)) for b in range(256))
_LIT_BITS = tuple(_fixed_code(b)[1] for b in range(256))
# Decoding zlib's fixed blocks: the next 9 bits of the stream -> (symbol, code length). A code
# of n < 9 bits fills every index whose low n bits are it.
_DECODE: list[tuple[int, int]] = [(0, 0)] * 512
for _sym in range(286):
    _code, _n = _fixed_code(_sym)
    for _hi in range(1 << (9 - _n)):
        _DECODE[_reverse(_code, _n) | (_hi << _n)] = (_sym, _n)
_DECODE_T = tuple(_DECODE)
del _DECODE, _sym, _code, _n, _hi
# 5-bit distance code as read LSB-first -> distance code (and back: the map is its inverse).
_DCODE_OF = tuple(_reverse(r, 5) for r in range(32))
# Distances whose code has e extra bits: [_ELO[e], _EHI[e]].
_ELO = (1, *((1 << (e + 1)) + 1 for e in range(1, 14)))
_EHI = (4, *(1 << (e + 2) for e in range(1, 14)))


def gzip_trailer(crc: int, size: int) -> bytes:
    """CRC-32 and ISIZE, the input length modulo 2**32, little-endian (RFC 1952 §2.3.1)."""
    return crc.to_bytes(4, "little") + (size & 0xFFFFFFFF).to_bytes(4, "little")


_HEADER, _FIXED, _STORED_LEN, _STORED, _DONE = range(5)
_FIXED_HEADER = 0b010  # BFINAL=0, BTYPE=01 (fixed Huffman), LSB first (§3.2.3)
_FINAL_FIXED_HEADER = 0b011  # BFINAL=1, BTYPE=01


class GzipStream:
    """One gzip member written across flushes; see the module docstring for the bit layout.

    ``compress(data)`` takes body bytes (returns at most the header before the first flush),
    ``flush()`` returns bytes from which a stock inflater outputs everything compressed so
    far, ``finish()`` ends the member. Not thread-safe; one per response body.
    """

    def __init__(self, level: int = 6, mem_level: int = 8) -> None:
        # Raw deflate: the gzip wrapper is ours. Z_FIXED, so zlib writes no dynamic block.
        self._z = zlib.compressobj(level, zlib.DEFLATED, -15, mem_level, zlib.Z_FIXED)
        xfl = 2 if level == 9 else 4 if level == 1 else 0  # RFC 1952 §2.3.1, as zlib sets it
        self._header = _GZIP_MAGIC + bytes((xfl, _OS_UNIX))
        self._crc = 0
        self._size = 0
        self._finished = False
        self._walked = False  # zlib's output so far went through the reader (or the first flush)
        # Reader of zlib's output: unread bits (LSB first) and where we are in its blocks.
        self._hold = 0
        self._hold_bits = 0
        self._state = _HEADER
        self._stored_left = 0
        self._stored_raw = False  # the current zlib stored block is copied as a stored block
        self._final = 0  # the current zlib block is its last (BFINAL)
        # Writer: committed bytes, then ``_nb`` uncommitted bits in ``_acc``; ``_base`` is the
        # stream bit offset of ``_acc``'s bit 0 (counted from the first deflate bit).
        self._out = bytearray()
        self._acc = 0
        self._nb = 0
        self._base = 0
        self._in_block = False  # our fixed block is open
        self._pad = 0  # zero bits a flush sent as the start of the next code (0..6)
        self._fresh = True  # the next symbol is a window's first: check it against the pad
        # Per window: the matches that may be re-pointed at the flush,
        # (stream bit offset of the distance field, its bits, position, match length).
        self._cands: list[tuple[int, int, int, int]] = []
        # History for re-pointing: the bytes at stream positions _hbase.._pos.
        self._hist = bytearray()
        self._hbase = 0
        self._pos = 0  # uncompressed bytes the reader has walked
        # First symbols seen after a flush, by how many zero bits their code begins with
        # (0..6; index 7 is never hit: only the end-of-block code begins with seven). Seeded
        # with one literal and one mid-length match so the first flushes are not blind.
        self._lead = [1, 0, 0, 1, 0, 0, 0, 0]
        self._lead_n = 2
        self._orders: list[list[int]] = [[]] * 8  # pads to try for each p, cheapest first
        self._orders_at = [0] * 8  # _lead_n at which to re-rank them

    # -- public API ---------------------------------------------------------------------------

    def compress(self, data: bytes) -> bytes:
        self._check_open()
        if data:
            self._crc = zlib.crc32(data, self._crc)
            self._size += len(data)
            self._hist += data
            if len(self._hist) > 4 * _WINDOW:  # a long unflushed body: keep what matches reach
                self._trim_history()
            raw = self._z.compress(data)
            if raw:
                self._read(raw)
        return self._take_header() if self._header else b""

    def flush(self) -> bytes:
        """Everything compressed so far, decodable now; the 32 KiB history is kept."""
        self._check_open()
        if not self._walked and self._size:
            return self._first_flush()
        raw = self._z.flush(zlib.Z_BLOCK)
        if raw:
            self._read(raw)
        p = -self._nb & 7  # (_base is whole bytes)
        if p:  # (p == 0: aligned already; an empty window also keeps the earlier pad)
            p = self._choose_pad(p)
            self._nb += p  # zero bits: nothing to OR in
            if p == 7:  # the pad is a whole end-of-block code: the block is closed
                self._in_block = False
                p = 0
            self._pad = p
        self._fresh = True
        self._cands.clear()
        if len(self._hist) > 2 * _WINDOW:
            self._trim_history()
        n = self._nb >> 3
        out = self._acc.to_bytes(n, "little")
        self._acc = self._nb = 0
        self._base += 8 * n
        if self._out:
            out = bytes(self._out) + out
            self._out.clear()
        return self._take_header() + out if self._header else out

    def _first_flush(self) -> bytes:
        """zlib's ``Z_SYNC_FLUSH`` as it is (see the module docstring). zlib's next output
        opens a new block at a byte boundary: the reader waits for a block header with
        nothing held, the writer has no block open and no pad, as in a new stream; only
        the stream's bit offset and the bytes walked move."""
        raw = self._z.flush(zlib.Z_SYNC_FLUSH)
        self._walked = True
        self._base = 8 * len(raw)
        self._pos = self._size
        return self._take_header() + raw

    def finish(self) -> bytes:
        """End of the body: the last data, an empty final block, CRC-32 and ISIZE."""
        self._check_open()
        self._read(self._z.flush(zlib.Z_FINISH))
        self._finished = True
        if self._in_block:
            self._bits(0, 7 - self._pad)  # end-of-block (its first _pad bits were sent)
        self._bits(_FINAL_FIXED_HEADER, 3)
        self._bits(0, 7)  # end-of-block of the empty final block
        self._nb += -(self._base + self._nb) & 7  # byte-align (RFC 1952: the trailer follows)
        return self._take_header() + self._take_bytes() + gzip_trailer(self._crc, self._size)

    # -- writer ---------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._finished:
            raise LocalProtocolError("gzip stream used after finish()")

    def _trim_history(self) -> None:
        cut = len(self._hist) - _WINDOW
        del self._hist[:cut]
        self._hbase += cut

    def _take_header(self) -> bytes:
        header, self._header = self._header, b""
        return header

    def _bits(self, value: int, n: int) -> None:
        self._acc |= value << self._nb
        self._nb += n

    def _commit(self) -> None:
        """Move the whole bytes of ``_acc`` to ``_out``; earlier matches stop being candidates."""
        q = self._nb >> 3
        if q:
            self._out += (self._acc & ((1 << (8 * q)) - 1)).to_bytes(q, "little")
            self._acc >>= 8 * q
            self._nb -= 8 * q
            self._base += 8 * q
        self._cands.clear()

    def _take_bytes(self) -> bytes:
        self._commit()
        assert self._nb == 0, "flush and finish leave the stream on a byte boundary"
        out = bytes(self._out)
        self._out.clear()
        return out

    def _open_for(self, code: int) -> int:
        """Before the first symbol after a flush or a stored block (``code``: its bits as
        written, LSB first): if the code begins with the pad's zeros, they were its first
        bits, and the number of them is returned (the caller writes only the rest); if not,
        they become an end-of-block code and a new fixed block opens (returns 0)."""
        lead = (code & -code).bit_length() - 1  # zero bits the code begins with (<= 6)
        self._lead[lead] += 1
        self._lead_n += 1
        pad, skip = self._pad, 0
        if pad and lead >= pad:
            skip = pad
        elif pad:
            self._bits(0, 7 - pad)
            self._in_block = False
        if not self._in_block:
            self._bits(_FIXED_HEADER, 3)
            self._in_block = True
        self._pad = 0
        self._fresh = False
        return skip

    # -- choosing the pad -----------------------------------------------------------------------

    def _choose_pad(self, p: int) -> int:
        """The pad to send instead of ``p`` bits: ``p - b`` after pointing a match ``b`` bits
        further, for the ``b`` with the smallest expected cost (see the module docstring)."""
        if self._lead_n >= self._orders_at[p]:
            self._orders[p] = self._pad_order(p)
            self._orders_at[p] = self._lead_n + _REORDER_EVERY
        for q in self._orders[p]:
            if q == p or self._repoint(p - q):
                return q
        return p  # pragma: no cover - q == p always succeeds

    def _pad_order(self, p: int) -> list[int]:
        """Pads 0..p by expected cost in bits: ``p - q`` bits of re-pointing plus
        FLUSH_MISS_BITS times the share of first symbols whose code begins with fewer than
        ``q`` zeros; cheapest first, ties to the larger pad (less searching)."""
        lead, total = self._lead, self._lead_n
        fits, costs = total, []
        for q in range(p + 1):
            costs.append(((p - q) + FLUSH_MISS_BITS * (total - fits) / total, -q))
            fits -= lead[q]
        return [-q for _, q in sorted(costs)]

    def _repoint(self, b: int) -> bool:
        """Point one of the window's matches at an older copy of its bytes whose distance
        code has ``b`` more extra bits. False when no candidate has such a copy."""
        hist, hbase, base = self._hist, self._hbase, self._base
        for off, n, pos, length in reversed(self._cands):
            e = n - 5 + b  # n: the distance field's bits, 5 of them the code
            if e > 13 or off < base or pos < hbase:
                continue
            hi = min(_EHI[e], _WINDOW, pos)
            if _ELO[e] > hi:
                continue
            start = pos - hbase
            # The copy must start at distance lo..hi: positions pos-hi .. pos-lo.
            found = hist.rfind(hist[start : start + length], max(0, start - hi),
                               start - _ELO[e] + length)  # fmt: skip
            if found < 0:
                continue
            d = start - found  # its distance, in class e: code 2e+2 or 2e+3 (§3.2.5)
            code = d - 1 if e == 0 else 2 * e + 2 + (((d - 1) >> e) & 1)
            value, new_n = _DCODE_OF[code] | ((d - _DBASE[code]) << 5), 5 + e
            at = off - base
            acc = self._acc
            low = acc & ((1 << at) - 1)
            self._acc = low | (value << at) | ((acc >> (at + n)) << (at + new_n))
            self._nb += new_n - n
            return True
        return False

    # -- reader of zlib's output ----------------------------------------------------------------

    def _read(self, raw: bytes) -> None:
        """Walk zlib's raw deflate output and write its content into our block."""
        if not raw:  # the reader stopped only where it needed more bits
            return
        self._walked = True
        i, end = 0, len(raw)
        while True:
            state = self._state
            if state == _FIXED:  # the usual case: zlib's symbols, then its end-of-block
                i = self._read_fixed(raw, i)
                if self._state == _FIXED:
                    return
                continue
            if state == _STORED:
                if self._hold_bits:  # whole bytes left in the reader come first
                    take = min(self._stored_left, self._hold_bits >> 3)
                    chunk = (self._hold & ((1 << (8 * take)) - 1)).to_bytes(take, "little")
                    self._drop(8 * take)
                else:  # then straight from zlib's output, no bit shuffling
                    take = min(self._stored_left, end - i)
                    chunk = raw[i : i + take]
                    i += take
                if not take:
                    return
                self._stored_data(chunk)
                continue
            if state == _DONE:  # zlib's final block is over; it writes nothing after it
                return
            # A block header (3 bits) or a stored block's LEN and NLEN (32 bits, aligned).
            need = 3 if state == _HEADER else 32
            if self._hold_bits < need:
                if i == end:
                    return
                take = min(end - i, (need - self._hold_bits + 7) >> 3)
                self._hold |= int.from_bytes(raw[i : i + take], "little") << self._hold_bits
                self._hold_bits += 8 * take
                i += take
                continue
            if state == _HEADER:
                header = self._hold & 7
                self._drop(3)
                self._final = header & 1
                btype = header >> 1
                if btype == 1:
                    self._state = _FIXED
                elif btype == 0:
                    self._drop(self._hold_bits & 7)  # stored: skip to zlib's byte boundary
                    self._state = _STORED_LEN
                else:  # pragma: no cover - Z_FIXED never writes dynamic blocks
                    raise LocalProtocolError(f"zlib wrote a block of type {btype} under Z_FIXED")
            else:  # _STORED_LEN
                length = self._hold & 0xFFFF
                self._drop(32)
                self._start_stored(length)

    def _drop(self, n: int) -> None:
        self._hold >>= n
        self._hold_bits -= n

    def _block_end(self) -> None:
        self._state = _DONE if self._final else _HEADER

    def _start_stored(self, length: int) -> None:
        self._stored_left = length
        self._stored_raw = length >= STORED_MIN_LEN
        if self._stored_raw:
            # End our block (if open), then a stored block header, aligned, LEN and NLEN.
            if self._in_block:
                self._bits(0, 7 - self._pad)
            self._pad = 0
            self._bits(0b000, 3)  # BFINAL=0, BTYPE=00
            self._nb += -(self._base + self._nb) & 7
            self._bits(length | ((length ^ 0xFFFF) << 16), 32)
            self._in_block = False
            self._fresh = True  # the next symbol reopens a fixed block
            self._commit()
        self._state = _STORED if length else _HEADER
        if not length:
            self._block_end()

    def _stored_data(self, chunk: bytes) -> None:
        self._stored_left -= len(chunk)
        self._pos += len(chunk)
        if self._stored_raw:
            self._out += chunk
        else:
            for byte in chunk:
                self._literal(byte)
        if not self._stored_left:
            self._block_end()

    def _literal(self, byte: int) -> None:
        code, n = _LIT_CODE[byte], _LIT_BITS[byte]
        if self._fresh:
            skip = self._open_for(code)
            code, n = code >> skip, n - skip
        self._bits(code, n)
        if self._nb > _COMMIT_BITS:
            self._commit()

    def _read_fixed(self, raw: bytes, i: int) -> int:
        """The hot loop: walk zlib's fixed-code symbols, copying their bits into ``_acc``.

        Returns the input index reached; ``_state`` leaves _FIXED at zlib's end-of-block.
        """
        end = len(raw)
        hold, bits = self._hold, self._hold_bits
        acc, nb = self._acc, self._nb
        pos = self._pos
        cands = self._cands
        decode, mask, lbase, lextra = _DECODE_T, _MASK, _LBASE, _LEXTRA
        dcode_of, dextra = _DCODE_OF, _DEXTRA
        fresh, commit_bits = self._fresh, _COMMIT_BITS
        while True:
            if bits < 40 and i < end:  # 40 >= the longest symbol (8 + 5 + 5 + 13 = 31 bits)
                chunk = raw[i : i + 16]
                hold |= int.from_bytes(chunk, "little") << bits
                bits += 8 * len(chunk)
                i += len(chunk)
            sym, n = decode[hold & 511]
            if n > bits:
                break  # the rest of this code is in zlib's next output
            if sym < 256:
                total = n
            elif sym == 256:  # zlib's end of block: ours goes on
                hold >>= 7
                bits -= 7
                if self._final:
                    self._state = _DONE
                    break
                if bits >= 3 and hold & 7 == _FIXED_HEADER:  # zlib's next block, fixed too
                    hold >>= 3
                    bits -= 3
                    continue
                self._state = _HEADER
                break
            else:
                ls = sym - 257
                le = lextra[ls]
                h = hold >> n
                length = lbase[ls] + (h & mask[le])
                h >>= le
                dc = dcode_of[h & 31]
                de = dextra[dc]
                total = n + le + 5 + de
                if total > bits:
                    break
            code = hold & mask[total]
            hold >>= total
            bits -= total
            skip = 0
            if fresh:
                self._acc, self._nb = acc, nb
                skip = self._open_for(code)
                acc, nb, fresh = self._acc, self._nb, False
                code >>= skip  # those bits went out as the last flush's pad
                total -= skip
            if sym < 256:
                pos += 1
            else:
                cands.append((self._base + nb - skip + n + le, 5 + de, pos, length))
                pos += length
            acc |= code << nb
            nb += total
            if nb > commit_bits:
                self._acc, self._nb = acc, nb
                self._commit()
                acc, nb = self._acc, self._nb
        self._hold, self._hold_bits = hold, bits
        self._acc, self._nb = acc, nb
        self._pos = pos
        if len(cands) > 4 * _CANDIDATES:
            del cands[:-_CANDIDATES]
        return i
