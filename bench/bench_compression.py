"""Compression at short windows: bytes per token of each flush point, on a recorded replay.

The replay is a real greedy SmolLM2 generation with the time of every token
(``tests/fixtures/replay/smollm2-replay.json``, 2,048 tokens, recorded on this VM), so the
figures do not move with the machine's load at bench time. Each row frames it as msgpack or
protobuf (one frame per token, as the server does), drives the :class:`Coalescer` schedule
(first frame at once, then one flush per window) and compresses with one flush point.
``decodable`` checks, after every flush, that the stock streaming decoder (Python's
``zlib.decompressobj``, the ``brotli`` and ``zstandard`` libraries) has output every byte of
every frame sent so far; a flush point that fails it is not acceptable however small.
``shipped`` marks what ``tokenwire serve`` uses (codec/compression.py). The zstd dictionaries
are trained on the replay's 24 other answers, as ``bench_serve`` does.

The second table is CPU: microseconds per token of the shipped gzip (``GzipStream``, Python
over zlib) against zlib's ``Z_BLOCK`` alone, same schedule, best of ``CPU_REPEATS`` runs taken
in turns (figures, not pass/fail: the machine is shared). The third is the case the gzip flush
rule keeps on ``Z_BLOCK``: a JSON-SSE stream of the Chat API's shape (one chunk per token of
the replay, at its times; the content is words of the test corpus), bytes and CPU of both.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import brotli
import zstandard

from tokenwire.codec import frames_msgpack, frames_protobuf
from tokenwire.codec.coalescer import Coalescer
from tokenwire.codec.compression import ZstdDict, new_compressor, train_dictionary
from tokenwire.codec.deflate_stream import GzipStream
from tokenwire.codec.frames import Frame

ROOT = Path(__file__).resolve().parent.parent
REPLAY = ROOT / "tests/fixtures/replay/smollm2-replay.json"
WINDOWS = (0.02, 0.15)
CPU_REPEATS = 9
ENCODERS = {"msgpack": frames_msgpack.FrameEncoder, "protobuf": frames_protobuf.FrameEncoder}

# (label, encoding, step(data) -> wire bytes, end() -> wire bytes) factories per lever.
Lever = tuple[str, str, Callable[[ZstdDict], tuple[Callable, Callable, Callable]]]


def _zlib(flush: int, strategy: int = zlib.Z_DEFAULT_STRATEGY, level: int = 6):
    def make(_: ZstdDict):
        z = zlib.compressobj(level, zlib.DEFLATED, 31, 8, strategy)
        return (lambda d: z.compress(d) + z.flush(flush), lambda: z.flush(zlib.Z_FINISH),
                zlib.decompressobj(31).decompress)
    return make


def _zlib_unmarked(level: int = 6):
    """Z_SYNC_FLUSH with its 4-byte ``00 00 FF FF`` marker cut from every flush, the
    permessage-deflate trick (RFC 7692 §7.2.1): its receivers put the marker back; a stock
    gzip decoder does not, so this row shows what the trick would cost it."""
    def make(_: ZstdDict):
        z = zlib.compressobj(level, zlib.DEFLATED, 31)

        def step(d: bytes) -> bytes:
            out = z.compress(d) + z.flush(zlib.Z_SYNC_FLUSH)
            return out[:-4] if out.endswith(b"\x00\x00\xff\xff") else out
        return step, lambda: z.flush(zlib.Z_FINISH), zlib.decompressobj(31).decompress
    return make


class _NoRepoint(GzipStream):
    """GzipStream without moving the pad: zero pad, block closed when the next symbol does
    not fit (the first prototype)."""

    def _repoint(self, b: int) -> bool:
        return False


def _stream(cls: type[GzipStream] = GzipStream, level: int = 6):
    def make(_: ZstdDict):
        g = cls(level)
        return (lambda d: g.compress(d) + g.flush(), g.finish, zlib.decompressobj(31).decompress)
    return make


def _brotli(**kw):
    def make(_: ZstdDict):
        b = brotli.Compressor(**kw)
        return (lambda d: b.process(d) + b.flush(), b.finish, brotli.Decompressor().process)
    return make


def _zstd(level: int, with_dict: bool = True):
    def make(zd: ZstdDict):
        zdict = zstandard.ZstdCompressionDict(zd.raw) if with_dict else None
        z = zstandard.ZstdCompressor(level=level, dict_data=zdict).compressobj()
        d = zstandard.ZstdDecompressor(dict_data=zdict).decompressobj()
        return (lambda data: z.compress(data) + z.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK),
                lambda: z.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH), d.decompress)
    return make


def _zstd_frames(level: int = 3):
    """A whole zstd frame per window (the other flush zstd has): a frame header per flush
    and no history across windows but the dictionary. Decoded frame by frame, as a stock
    client reading concatenated frames does."""
    def make(zd: ZstdDict):
        zdict = zstandard.ZstdCompressionDict(zd.raw)
        z = zstandard.ZstdCompressor(level=level, dict_data=zdict, write_content_size=False)
        d = zstandard.ZstdDecompressor(dict_data=zdict)

        def decode(data: bytes) -> bytes:
            out, reader = b"", d.decompressobj()
            while data:
                out += reader.decompress(data)
                data, reader = reader.unused_data, d.decompressobj()
            return out
        return (lambda data: z.compress(data) if data else b"", lambda: b"", decode)
    return make


def _shipped(encoding: str):
    def make(zd: ZstdDict):
        c = new_compressor(encoding, dictionary=zd if encoding == "zstd" else None)
        dec = {"gzip": lambda: zlib.decompressobj(31).decompress,
               "br": lambda: brotli.Decompressor().process,
               "zstd": lambda: _zstd(3)(zd)[2]}[encoding]()
        return (lambda d: c.compress(d) + c.flush(), c.finish, dec)
    return make


LEVERS: list[Lever] = [
    ("Z_SYNC_FLUSH (before)", "gzip", _zlib(zlib.Z_SYNC_FLUSH)),
    ("Z_SYNC_FLUSH, 4-byte marker cut", "gzip", _zlib_unmarked()),
    ("Z_FULL_FLUSH", "gzip", _zlib(zlib.Z_FULL_FLUSH)),
    ("Z_PARTIAL_FLUSH", "gzip", _zlib(zlib.Z_PARTIAL_FLUSH)),
    ("Z_BLOCK, default strategy", "gzip", _zlib(zlib.Z_BLOCK)),
    ("Z_BLOCK, Z_FIXED, level 9", "gzip", _zlib(zlib.Z_BLOCK, zlib.Z_FIXED, 9)),
    ("Z_BLOCK, Z_FIXED, level 6 (shipped until 2026-12-04)", "gzip",
     _zlib(zlib.Z_BLOCK, zlib.Z_FIXED)),
    ("one open fixed block, zero pad, no re-pointing", "gzip", _stream(_NoRepoint)),
    ("one open fixed block, pad moved by re-pointing, level 9", "gzip", _stream(level=9)),
    ("shipped: one open fixed block, pad moved by re-pointing", "gzip", _shipped("gzip")),
    ("flush, quality 1", "br", _brotli(quality=1)),
    ("flush, quality 4 (engine's)", "br", _brotli(quality=4)),
    ("shipped: flush, quality 5, lgwin 22", "br", _shipped("br")),
    ("flush, quality 5, MODE_TEXT", "br", _brotli(quality=5, mode=brotli.MODE_TEXT)),
    ("flush, quality 5, lgwin 16, lgblock 16", "br", _brotli(quality=5, lgwin=16, lgblock=16)),
    ("flush, quality 9", "br", _brotli(quality=9)),
    ("flush, quality 11", "br", _brotli(quality=11)),
    ("FLUSH_BLOCK, level 3, no dictionary", "zstd", _zstd(3, with_dict=False)),
    ("shipped: FLUSH_BLOCK, level 3, dictionary", "zstd", _shipped("zstd")),
    ("FLUSH_BLOCK, level 19, dictionary", "zstd", _zstd(19)),
    ("a frame per window, level 3, dictionary", "zstd", _zstd_frames()),
]


def _frames(stream: list, fmt: str) -> list[tuple[float, bytes]]:
    enc = ENCODERS[fmt]()
    out = [(t, enc.encode(Frame(ids=tuple(ids), done=False))) for t, ids in stream]
    return [*out, (stream[-1][0], enc.encode(Frame(ids=(), done=True, finish_reason="length")))]


def _schedule(timed: list[tuple[float, bytes]], window: float) -> list[bytes]:
    """The raw bytes of each flush, on the Coalescer's own schedule (identity is not delayed,
    so gzip stands in for any coding; only the boundaries are taken)."""
    co = Coalescer(new_compressor("gzip"), window=window)
    flushes: list[bytes] = []
    pending: list[bytes] = []
    for t, frame in timed:
        if co.deadline is not None and co.deadline <= t and co.poll(co.deadline):
            flushes.append(b"".join(pending))
            pending.clear()
        pending.append(frame)
        if co.add(frame, t) and co.deadline is None:
            flushes.append(b"".join(pending))
            pending.clear()
    flushes.append(b"".join(pending))  # close(): the rest and the end of the coded stream
    return flushes


def _measure(flushes: list[bytes], make: Callable, zd: ZstdDict) -> tuple[int, bool]:
    step, end, decode = make(zd)
    total, sent, got, ok = 0, b"", b"", True
    for data in flushes[:-1]:
        out = step(data)
        total += len(out)
        sent += data
        try:
            got += decode(out)
        except (zlib.error, brotli.error, zstandard.ZstdError):
            ok, decode = False, lambda _: b""  # the stock decoder gave up: count the rest
        ok &= got == sent
    out = step(flushes[-1]) + end() if flushes[-1] else end()
    total += len(out)
    try:
        got += decode(out)
    except (zlib.error, brotli.error, zstandard.ZstdError):
        ok = False
    return total, ok and got == sent + flushes[-1]


def _cpu(flushes: list[bytes], step_end: Callable) -> float:
    step, end = step_end()
    t0 = time.perf_counter()
    for data in flushes[:-1]:
        step(data)
    step(flushes[-1])
    end()
    return time.perf_counter() - t0


def _cpu_rows(fmt: str, schedules: dict[float, list[bytes]], tokens: int) -> list[dict]:
    def ours():
        c = new_compressor("gzip")
        return (lambda d: c.compress(d) + c.flush()), c.finish

    def plain():
        z = zlib.compressobj(6, zlib.DEFLATED, 31, 8, zlib.Z_FIXED)
        return (lambda d: z.compress(d) + z.flush(zlib.Z_BLOCK)), (lambda: z.flush())

    rows = []
    for w, flushes in schedules.items():
        best = {"shipped": [], "zlib": []}
        for _ in range(CPU_REPEATS):  # in turns, so a burst of load hits both
            best["shipped"].append(_cpu(flushes, ours))
            best["zlib"].append(_cpu(flushes, plain))
        rows.append({"format": fmt, "window ms": int(w * 1000),
                     "µs/token shipped gzip": round(min(best["shipped"]) / tokens * 1e6, 2),
                     "µs/token zlib Z_BLOCK": round(min(best["zlib"]) / tokens * 1e6, 2)})
    return rows


def _sse_chunk(k: int, words: list[str]) -> bytes:
    doc = {"id": "chatcmpl-8a7f3c2e91b4", "object": "chat.completion.chunk",
           "created": 1764864000, "model": "smollm2-135m-instruct",
           "choices": [{"index": 0, "delta": {"content": " " + words[k % len(words)]},
                        "finish_reason": None}]}
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def _sse_rows(stream: list, tokens: int) -> list[dict]:
    corpus = json.loads((ROOT / "tests/fixtures/corpus/corpus.json").read_text("utf-8"))
    words = " ".join(s for texts in corpus.values() for s in texts).split()[:5000]
    timed = [(t, _sse_chunk(k, words)) for k, (t, _) in enumerate(stream)]
    rows = []
    for w in WINDOWS:
        flushes = _schedule(timed, w)
        row: dict = {"JSON-SSE, window ms": int(w * 1000)}
        for label, open_block in (("open block", True), ("Z_BLOCK (shipped for SSE)", False)):
            def make(ob=open_block):
                c = new_compressor("gzip", open_block=ob)
                return (lambda d: c.compress(d) + c.flush()), c.finish

            def with_decoder(_: ZstdDict | None, m=make):
                return (*m(), zlib.decompressobj(31).decompress)
            size, ok = _measure(flushes, with_decoder, None)
            best = min(_cpu(flushes, make) for _ in range(CPU_REPEATS))
            row[f"B/token {label}"] = round(size / tokens, 2) if ok else "**not decodable**"
            row[f"µs/token {label}"] = round(best / tokens * 1e6, 2)
        rows.append(row)
    return rows


def run() -> list[dict]:
    replay = json.loads(REPLAY.read_text("utf-8"))
    stream = replay["main"]["2048"]
    tokens = sum(len(ids) for _, ids in stream)
    rows, cpu = [], []
    for fmt in ENCODERS:
        samples = [b"".join(f for _, f in _frames(s, fmt)) for s in replay["train"]]
        zd = ZstdDict.from_bytes(train_dictionary(samples))
        timed = _frames(stream, fmt)
        schedules = {w: _schedule(timed, w) for w in WINDOWS}
        for label, encoding, make in LEVERS:
            row = {"format": fmt, "encoding": encoding, "flush point": label}
            for w, flushes in schedules.items():
                size, ok = _measure(flushes, make, zd)
                row[f"B/token {int(w * 1000)} ms"] = round(size / tokens, 2)
                row[f"decodable {int(w * 1000)} ms"] = "yes" if ok else "**no**"
            rows.append(row)
        cpu += _cpu_rows(fmt, schedules, tokens)
    return rows + cpu + _sse_rows(stream, tokens)


if __name__ == "__main__":
    for r in run():
        print(r)
