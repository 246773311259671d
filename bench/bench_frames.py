"""Frame encode/decode throughput (msgpack, protobuf, msgpack-delta) vs codecai 0.4.1.

Ids are pseudo-random in 0..150,000 (a Qwen-sized vocabulary); every stream ends with a
``done=true, finish_reason="length"`` frame. Decode rows feed the whole body in one chunk
to our decoders; codecai's async stream decoders are driven by asyncio over an async
iterator (one frame per chunk, as an engine sends them, or the whole body in one chunk for
the quadratic-behaviour rows). "msgspec, boundaries known" decodes each frame from a
pre-split list: the floor a streaming decoder pays for finding boundaries is the gap to it.
Values are medians of REPEATS runs (time.perf_counter); compare rows within one run.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator, Callable

import codecai.stream as stream
import msgspec

from tokenwire.codec import frames_delta, frames_msgpack, frames_protobuf
from tokenwire.codec.frames import Frame

IDS_PER_RUN = 65_536
IDS_PER_FRAME = (1, 16, 256)
ONE_CHUNK_FRAMES = (1_000, 8_000, 64_000)
REPEATS = 5


def _frames(ids_per_frame: int, total_ids: int) -> list[Frame]:
    n = max(1, total_ids // ids_per_frame)
    frames = [Frame(ids=tuple((k * 2_654_435_761) % 150_001
                              for k in range(i * ids_per_frame, (i + 1) * ids_per_frame)),
                    done=False) for i in range(n)]
    frames.append(Frame(ids=(), done=True, finish_reason="length"))
    return frames


def _median(fn: Callable[[], object], repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


async def _aiter(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def _drive(decoder: Callable, chunks: list[bytes]) -> int:
    async def collect() -> int:
        return sum([1 async for _ in decoder(_aiter(chunks))])

    return asyncio.run(collect())


def _ours(module, body: bytes) -> Callable[[], object]:
    def run() -> None:
        dec = module.FrameDecoder()
        dec.feed(body)
        dec.feed_eof()

    return run


def _row(op: str, impl: str, ipf: int | str, frames: int, seconds: float) -> dict:
    return {"op": op, "implementation": impl, "ids_per_frame": ipf,
            "value": round(frames / seconds), "unit": "frames/s"}


def _encode_rows(ipf: int, frames: list[Frame]) -> list[dict]:
    n = len(frames)
    mp, pb = frames_msgpack.FrameEncoder(), frames_protobuf.FrameEncoder()
    engine = msgspec.msgpack.Encoder().encode
    dicts = [{"ids": list(f.ids), "done": f.done} for f in frames]
    cases = [
        ("encode msgpack", "tokenwire FrameEncoder", lambda: list(map(mp.encode, frames))),
        ("encode msgpack", "tokenwire FrameEncoder(validate=False)",
         lambda: list(map(frames_msgpack.FrameEncoder(validate=False).encode, frames))),
        ("encode msgpack", "msgspec encode(dict) (engine forks)",
         lambda: list(map(engine, dicts))),
        ("encode protobuf", "tokenwire FrameEncoder", lambda: list(map(pb.encode, frames))),
        ("encode msgpack-delta", "tokenwire FrameEncoder",
         lambda: list(map(frames_delta.FrameEncoder().encode, frames))),
    ]
    return [_row(op, impl, ipf, n, _median(fn)) for op, impl, fn in cases]


def _decode_rows(ipf: int, frames: list[Frame]) -> list[dict]:
    n = len(frames)
    mp_parts = [frames_msgpack.FrameEncoder().encode(f) for f in frames]
    pb_parts = [frames_protobuf.FrameEncoder().encode(f) for f in frames]
    delta_enc = frames_delta.FrameEncoder()
    delta_body = b"".join(delta_enc.encode(f) for f in frames)
    known = msgspec.msgpack.Decoder(Frame)
    cases = [
        ("decode msgpack", "tokenwire, one chunk", _ours(frames_msgpack, b"".join(mp_parts))),
        ("decode msgpack", "codecai decode_msgpack_stream, frame per chunk",
         lambda: _drive(stream.decode_msgpack_stream, mp_parts)),
        ("decode msgpack", "msgspec Decoder(Frame), boundaries known",
         lambda: list(map(known.decode, mp_parts))),
        ("decode protobuf", "tokenwire, one chunk", _ours(frames_protobuf, b"".join(pb_parts))),
        ("decode protobuf", "codecai decode_protobuf_stream, frame per chunk",
         lambda: _drive(stream.decode_protobuf_stream, pb_parts)),
        ("decode protobuf", "codecai decode_protobuf_frame (sync), boundaries known",
         lambda: [stream.decode_protobuf_frame(p[4:]) for p in pb_parts]),
        ("decode msgpack-delta", "tokenwire, one chunk", _ours(frames_delta, delta_body)),
    ]
    return [_row(op, impl, ipf, n, _median(fn, 3)) for op, impl, fn in cases]


def _one_chunk_rows() -> list[dict]:
    """Many one-id frames arriving in a single chunk: codecai re-copies its buffer per frame."""
    rows = []
    for count in ONE_CHUNK_FRAMES:
        frames = _frames(1, count - 1)
        body = b"".join(map(frames_msgpack.FrameEncoder().encode, frames))
        for impl, fn in (("tokenwire", _ours(frames_msgpack, body)),
                         ("codecai decode_msgpack_stream",
                          lambda body=body: _drive(stream.decode_msgpack_stream, [body]))):
            seconds = _median(fn, 3)
            rows.append({"op": f"decode {len(frames):,} one-id frames in one chunk",
                         "implementation": impl, "ids_per_frame": 1,
                         "value": round(seconds * 1000, 2), "unit": "ms"})
    return rows


def run() -> list[dict]:
    rows: list[dict] = []
    for ipf in IDS_PER_FRAME:
        frames = _frames(ipf, IDS_PER_RUN)
        rows += _encode_rows(ipf, frames)
        rows += _decode_rows(ipf, frames)
    rows += _one_chunk_rows()
    return rows


def _table(rows: list[dict]) -> str:
    cols = ["op", "implementation", "ids_per_frame", "value", "unit"]
    widths = [max(len(str(r[c])) for r in [*rows, dict(zip(cols, cols, strict=True))])
              for c in cols]
    line = "  ".join(f"{{:{'>' if c == 'value' else '<'}{w}}}" for c, w in zip(cols, widths,
                                                                              strict=True))
    out = [line.format(*cols)]
    out += [line.format(*(f"{r[c]:,}" if c == "value" else r[c] for c in cols)) for r in rows]
    return "\n".join(out)


if __name__ == "__main__":
    print(_table(run()))
