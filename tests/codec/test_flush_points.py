"""Every flush point is decodable by stock streaming decoders (issue 15, codec-spec §10 item 1).

A real SmolLM2 generation (token ids with their generation times,
``tests/fixtures/replay/smollm2-replay.json``) is framed as msgpack and protobuf and pushed
through the :class:`Coalescer` at several windows. After every chunk the server would send,
each stock decoder must have output every byte of every frame fed so far: a flush point that
leaves a bit of the last frame inside the decoder (zlib's ``Z_BLOCK`` on a dynamic-Huffman
block does) would delay a token past its window.

Stock decoders: Python's ``zlib.decompressobj`` (what ``gzip``/``httpx``/``requests`` use),
the ``brotli`` and ``zstandard`` libraries, the WHATWG ``DecompressionStream`` in Node (the
browsers' API; gzip only there) and ``curl --compressed`` reading a paced HTTP response.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import zlib
from collections.abc import Callable
from pathlib import Path

import brotli
import pytest
import zstandard

from tokenwire.codec import frames_msgpack, frames_protobuf
from tokenwire.codec.coalescer import Coalescer
from tokenwire.codec.compression import (
    Compressor,
    ZstdDict,
    new_compressor,
    train_dictionary,
)
from tokenwire.codec.frames import Frame

REPLAY = Path(__file__).resolve().parent.parent / "fixtures" / "replay" / "smollm2-replay.json"
WINDOWS = (0.0, 0.02, 0.15, 5.0)  # 5 s: large blocks, where zlib would pick dynamic codes
ENCODERS = {"msgpack": frames_msgpack.FrameEncoder, "protobuf": frames_protobuf.FrameEncoder}
#: Safety net for the external decoders (never the thing measured): they answer in ms.
EXTERNAL_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def replay() -> dict:
    return json.loads(REPLAY.read_text("utf-8"))


def _frames(stream: list, fmt: str) -> list[tuple[float, bytes]]:
    enc = ENCODERS[fmt]()
    out = [(t, enc.encode(Frame(ids=tuple(ids), done=False))) for t, ids in stream]
    end = stream[-1][0]
    return [*out, (end, enc.encode(Frame(ids=(), done=True, finish_reason="length")))]


@pytest.fixture(scope="module")
def zdicts(replay: dict) -> dict[str, ZstdDict]:
    out = {}
    for fmt in ENCODERS:
        samples = [b"".join(f for _, f in _frames(s, fmt)) for s in replay["train"]]
        out[fmt] = ZstdDict.from_bytes(train_dictionary(samples))
    return out


def _chunks(timed: list[tuple[float, bytes]], encoding: str, window: float,
            zdict: ZstdDict | None, compressor: Compressor | None = None,
            ) -> list[tuple[bytes, int]]:  # fmt: skip
    """(wire chunk, raw bytes of every frame fed so far) per send, the server's schedule."""
    if compressor is None:  # "gzip-text": the flush the text APIs' SSE streams use
        compressor = new_compressor(encoding.removesuffix("-text"), dictionary=zdict,
                                    open_block=not encoding.endswith("-text"))
    co = Coalescer(compressor, window=window)
    sent: list[tuple[bytes, int]] = []
    fed = 0
    for t, frame in timed:
        deadline = co.deadline
        if deadline is not None and deadline <= t:
            out = co.poll(deadline)
            if out:
                sent.append((out, fed))
        fed += len(frame)
        out = co.add(frame, t)
        if out:
            sent.append((out, fed))
    sent.append((co.close(timed[-1][0]), fed))
    return sent


class _ZlibFlush(Compressor):
    """gzip through zlib alone with one flush mode: the flush points GzipStream replaced."""

    encoding = "gzip"

    def __init__(self, flush: int, strategy: int = zlib.Z_FIXED) -> None:
        super().__init__()
        self._mode = flush
        self._z = zlib.compressobj(6, zlib.DEFLATED, 31, 8, strategy)

    def _compress(self, data: bytes) -> bytes:
        return self._z.compress(data)

    def _flush(self) -> bytes:
        return self._z.flush(self._mode)

    def _finish(self) -> bytes:
        return self._z.flush(zlib.Z_FINISH)


def _stock(encoding: str, zdict: ZstdDict | None) -> Callable[[bytes], bytes]:
    if encoding.startswith("gzip"):
        return zlib.decompressobj(31).decompress
    if encoding == "br":
        return brotli.Decompressor().process
    assert zdict is not None
    dctx = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(zdict.raw))
    return dctx.decompressobj().decompress


@pytest.mark.parametrize("fmt", sorted(ENCODERS))
@pytest.mark.parametrize("encoding", ["gzip", "gzip-text", "br", "zstd"])
@pytest.mark.parametrize("window", WINDOWS)
def test_stock_decoder_has_every_frame_at_every_flush(replay, zdicts, fmt, encoding, window):
    for stream in (replay["main"]["2048"], *replay["train"][:6]):
        timed = _frames(stream, fmt)
        raw = b"".join(f for _, f in timed)
        zdict = zdicts[fmt] if encoding == "zstd" else None
        decode, got = _stock(encoding, zdict), b""
        for k, (chunk, fed) in enumerate(_chunks(timed, encoding, window, zdict)):
            got += decode(chunk)
            assert got == raw[:fed], f"send {k}: {len(got)} of {fed} bytes decodable"
        assert got == raw


def test_default_strategy_z_block_would_strand_bits(replay):
    # Why the streamed body is all fixed-Huffman: zlib's Z_BLOCK (the flush shipped before
    # GzipStream) after a large dynamic-Huffman block, zlib's default strategy, leaves data
    # bits inside the compressor on this replay.
    stranded = False
    for stream in (replay["main"]["2048"], *replay["train"][:6]):
        timed = _frames(stream, "msgpack")
        raw = b"".join(f for _, f in timed)
        decode, got = zlib.decompressobj(31).decompress, b""
        old = _ZlibFlush(zlib.Z_BLOCK, zlib.Z_DEFAULT_STRATEGY)
        for chunk, fed in _chunks(timed, "gzip", 5.0, None, old):
            got += decode(chunk)
            stranded |= got != raw[:fed]
    assert stranded


def _size(timed: list[tuple[float, bytes]], window: float, c: Compressor | None = None) -> int:
    return sum(len(chunk) for chunk, _ in _chunks(timed, "gzip", window, None, c))


@pytest.mark.parametrize("fmt", sorted(ENCODERS))
def test_one_open_block_beats_the_old_flush_points(replay, fmt):
    # Issue 15's aim, pinned on the byte counts of the recorded replay (deterministic for a
    # given zlib; 1.2.13 here): at 20 ms at most 3.0 B/token, and less than zlib's Z_BLOCK
    # on fixed blocks (3.79 / 3.50 B/token, shipped before) and Z_SYNC_FLUSH (8.77 / 7.93);
    # at 150 ms no worse than Z_BLOCK.
    stream = replay["main"]["2048"]
    tokens = sum(len(ids) for _, ids in stream)
    timed = _frames(stream, fmt)
    ours = _size(timed, 0.02)
    assert ours <= 3.0 * tokens
    assert ours < 0.85 * _size(timed, 0.02, _ZlibFlush(zlib.Z_BLOCK))
    assert ours < 0.4 * _size(timed, 0.02, _ZlibFlush(zlib.Z_SYNC_FLUSH, zlib.Z_DEFAULT_STRATEGY))
    assert _size(timed, 0.15) <= _size(timed, 0.15, _ZlibFlush(zlib.Z_BLOCK))


# -- browsers' DecompressionStream (Node's implementation of the WHATWG API) ----------------

_NODE_SCRIPT = r"""
const input = JSON.parse(require('fs').readFileSync(0, 'utf8'));
(async () => {
  const ds = new DecompressionStream('gzip');
  const writer = ds.writable.getWriter(), reader = ds.readable.getReader();
  let have = 0;
  for (const [hex, want] of input) {
    writer.write(Buffer.from(hex, 'hex'));
    while (have < want) {
      const {value, done} = await reader.read();
      if (done) break;
      have += value.length;
    }
    if (have !== want) { console.log(`short: ${have} of ${want}`); process.exit(1); }
  }
  console.log('ok');
  process.exit(0);
})();
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
@pytest.mark.parametrize("window", [0.02, 0.15, 5.0])
def test_decompression_stream_has_every_frame_at_every_flush(replay, window):
    timed = _frames(replay["main"]["2048"], "msgpack")[:600]
    sent = _chunks(timed, "gzip", window, None)
    # A chunk whose frames the decoder cannot finish leaves reader.read() waiting forever;
    # the timeout turns that into a failure.
    proc = subprocess.run(["node", "-e", _NODE_SCRIPT], input=json.dumps(
        [[c.hex(), fed] for c, fed in sent]), capture_output=True, text=True,
        timeout=EXTERNAL_TIMEOUT_S)  # fmt: skip
    assert proc.stdout.strip() == "ok", proc.stdout + proc.stderr


# -- curl --compressed against a paced HTTP response -----------------------------------------


def _serve_paced(sock: socket.socket, encoding: str, sent: list[tuple[bytes, int]],
                 curl_out, errors: list[str]) -> None:
    """One HTTP/1.1 response, chunk by chunk; the next chunk goes only once curl has written
    every byte the previous one completes."""
    conn, _ = sock.accept()
    with conn:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-msgpack\r\n"
                     + f"Content-Encoding: {encoding}\r\n".encode()
                     + b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        have = 0
        for chunk, fed in sent:
            if chunk:
                conn.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            while have < fed:
                data = curl_out.read1(65536)
                if not data:
                    errors.append(f"curl stopped at {have} of {fed} bytes")
                    return
                have += len(data)
        conn.sendall(b"0\r\n\r\n")


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@pytest.mark.parametrize("encoding", ["gzip", "br"])
def test_curl_outputs_every_frame_at_every_flush(replay, encoding):
    timed = _frames(replay["main"]["2048"], "msgpack")[:400]
    sent = _chunks(timed, encoding, 0.02, None)
    with socket.create_server(("127.0.0.1", 0)) as sock:
        port = sock.getsockname()[1]
        curl = subprocess.Popen(
            ["curl", "-sS", "-N", "--compressed", f"http://127.0.0.1:{port}/"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        errors: list[str] = []
        server = threading.Thread(target=_serve_paced, args=(sock, encoding, sent, curl.stdout,
                                                             errors), daemon=True)
        server.start()
        server.join(EXTERNAL_TIMEOUT_S)
        stalled = server.is_alive()
        curl.kill() if stalled else curl.wait(EXTERNAL_TIMEOUT_S)
        curl.stdout.close()
        curl.stderr.close()
    assert not stalled, "curl never output the frames of a flushed chunk"
    assert not errors, errors
