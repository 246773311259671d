"""Content codings: registry, flush semantics, coalescing windows, bounded decompression."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import zlib

import brotli
import msgspec
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import corpus, fixture_map_path
from tokenwire.codec import compression as comp
from tokenwire.codec.coalescer import DEFAULT_WINDOW_S, Coalescer
from tokenwire.codec.compression import (
    COMPRESSORS,
    DECOMPRESSORS,
    DEFAULT_MAX_DECOMPRESSED,
    ZstdCompressor,
    ZstdDict,
    decompressor_for_response,
    new_compressor,
    new_decompressor,
    train_dictionary,
)
from tokenwire.errors import (
    DecompressionError,
    DecompressionLimitExceeded,
    LocalProtocolError,
    MapHashMismatch,
    MapNotFound,
    RemoteProtocolError,
)

ENCODINGS = ("identity", "gzip", "br", "zstd")
_enc = msgspec.msgpack.Encoder()


def msgpack_frame(ids: list[int], done: bool = False) -> bytes:
    doc: dict = {"ids": ids, "done": done}
    if done:
        doc["finish_reason"] = "length"
    return _enc.encode(doc)


def _corpus_ids() -> list[int]:
    """Real-ish smollm2 ids: split text into words and look each up (byte chars on a miss)."""
    vocab = json.loads(fixture_map_path("huggingfacetb/smollm2").read_text("utf-8"))["vocab"]
    keep = list(range(33, 127)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    b2u = {b: chr(b) for b in keep}
    b2u.update({b: chr(256 + n) for n, b in enumerate(b for b in range(256) if b not in keep)})
    out: list[int] = []
    for word in re.findall(r" ?\w+| ?[^\w\s]+|\s+", "\n".join(corpus()["prose"])):
        sym = "".join(b2u[b] for b in word.encode())
        out.extend([vocab[sym]] if sym in vocab else [vocab[b2u[b]] for b in word.encode()])
    return out


@pytest.fixture(scope="module")
def ids() -> list[int]:
    return _corpus_ids()


@pytest.fixture(scope="module")
def zdict(ids: list[int]) -> ZstdDict:
    samples = [b"".join(msgpack_frame([i]) for i in ids[k : k + 128]) for k in range(0, 20000, 40)]
    return ZstdDict.from_bytes(train_dictionary(samples[::2], size=4096))


def make(encoding: str, zdict: ZstdDict):
    return new_compressor(encoding, dictionary=zdict if encoding == "zstd" else None)


def unmake(encoding: str, zdict: ZstdDict, **kw):
    return new_decompressor(encoding, dictionary=zdict if encoding == "zstd" else None, **kw)


# -- registry ------------------------------------------------------------------------------


def test_registry_is_keyed_by_wire_token():
    assert set(COMPRESSORS) == set(ENCODINGS) == set(DECOMPRESSORS)
    for token, cls in COMPRESSORS.items():
        assert cls.encoding == token
        assert DECOMPRESSORS[token].encoding == token


def test_missing_optional_module_removes_its_entry(monkeypatch):
    # Load a private copy of the module with brotli and zstandard unimportable.
    monkeypatch.setitem(sys.modules, "brotli", None)
    monkeypatch.setitem(sys.modules, "zstandard", None)
    spec = importlib.util.spec_from_file_location("_tw_compression_bare", comp.__file__)
    bare = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bare)  # dataclasses look their module up
    spec.loader.exec_module(bare)
    assert set(bare.COMPRESSORS) == {"identity", "gzip"} == set(bare.DECOMPRESSORS)
    with pytest.raises(LocalProtocolError):
        bare.new_compressor("br")


def test_unknown_encoding_is_an_error_not_identity():
    with pytest.raises(LocalProtocolError):
        new_compressor("lzma")
    with pytest.raises(DecompressionError):
        new_decompressor("lzma")


def test_zstd_requires_a_dictionary():
    with pytest.raises(LocalProtocolError):
        new_compressor("zstd")
    with pytest.raises(LocalProtocolError):
        ZstdCompressor(b"raw dict bytes")  # type: ignore[arg-type]
    with pytest.raises(RemoteProtocolError):
        new_decompressor("zstd")


def test_dictionary_hash_is_sha256_of_raw_bytes_and_verified():
    d = ZstdDict.from_bytes(b"abc")
    assert d.hash == "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert ZstdDict.from_bytes(b"abc", expected_hash=d.hash.upper()[7:]).hash == d.hash
    with pytest.raises(MapHashMismatch):
        ZstdDict.from_bytes(b"abd", expected_hash=d.hash)


def test_trained_dictionary_has_requested_size(zdict):
    assert len(zdict.raw) == 4096


# -- flush semantics -----------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_flush_makes_everything_so_far_decodable(encoding, zdict, ids):
    c, d = make(encoding, zdict), unmake(encoding, zdict)
    sent = b""
    for k in range(40):
        frame = msgpack_frame([ids[k]])
        sent += frame
        got = d.decompress(c.compress(frame) + c.flush())
        assert got == frame, f"frame {k} not decodable after flush"
    assert d.decompress(c.finish()) == b""
    d.finish()


@pytest.mark.parametrize("encoding", ["gzip", "br", "zstd"])
def test_flush_keeps_history(encoding, zdict):
    # A repeat of a 300-byte random block after a flush must be coded as a back-reference;
    # a history reset (Z_FULL_FLUSH, new frame) would cost the whole block again.
    block = bytes(range(256)) + b"tokenwire keeps the window across flushes" * 2
    block = bytes(zlib.crc32(block[:i]) & 0xFF for i in range(300))
    c = make(encoding, zdict)
    first = c.compress(block) + c.flush()
    second = c.compress(block) + c.flush()
    assert len(second) < len(first) // 4


@pytest.mark.parametrize("open_block", [True, False])
def test_gzip_flush_is_not_sync_flush(open_block):
    # No empty stored block (00 00 FF FF), yet the stock decoder has every byte. The one
    # exception is the open block's first flush, zlib's Z_SYNC_FLUSH as it is (once per
    # stream, the first window not walked in Python: codec/deflate_stream.py).
    c = new_compressor("gzip", open_block=open_block)
    stock = zlib.decompressobj(31)
    for i in range(4):
        frame = msgpack_frame([9707 + i])
        out = c.compress(frame) + c.flush()
        assert (out[:2] == b"\x1f\x8b") == (i == 0)
        assert out.endswith(b"\x00\x00\xff\xff") == (open_block and i == 0)
        assert stock.decompress(out) == frame


def test_gzip_for_text_streams_is_zlibs_z_block_on_fixed_blocks():
    # open_block=False (the text APIs' SSE): byte for byte what zlib writes with Z_FIXED and
    # Z_BLOCK; the default keeps one block open and is smaller on token frames.
    frames = [msgpack_frame([i % 7]) for i in range(200)]
    z = zlib.compressobj(6, zlib.DEFLATED, 31, 8, zlib.Z_FIXED)
    text, ours = new_compressor("gzip", open_block=False), new_compressor("gzip")
    want = b"".join(z.compress(f) + z.flush(zlib.Z_BLOCK) for f in frames) + z.flush()
    assert b"".join(text.compress(f) + text.flush() for f in frames) + text.finish() == want
    body = b"".join(ours.compress(f) + ours.flush() for f in frames) + ours.finish()
    assert zlib.decompress(body, 31) == b"".join(frames) and len(body) < 0.8 * len(want)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_compressor_unusable_after_finish(encoding, zdict):
    c = make(encoding, zdict)
    c.finish()
    with pytest.raises(LocalProtocolError):
        c.compress(b"x")


# -- coalescing ----------------------------------------------------------------------------


def simulate(coalescer: Coalescer, frames: list[bytes], rate: float):
    """Feed frames at ``rate`` per second, polling at each deadline; yield (time, bytes)."""
    out: list[tuple[float, bytes]] = []
    for k, frame in enumerate(frames):
        t = k / rate
        dl = coalescer.deadline
        if dl is not None and dl <= t:
            out.append((dl, coalescer.poll(dl)))
        out.append((t, coalescer.add(frame, t)))
    end = len(frames) / rate
    if coalescer.deadline is not None and coalescer.deadline <= end:
        out.append((coalescer.deadline, coalescer.poll(coalescer.deadline)))
    out.append((end, coalescer.close(end)))
    return out


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("window", [0.0, 0.05, DEFAULT_WINDOW_S])
def test_every_frame_decodable_within_one_window(encoding, window, zdict, ids):
    frames = [msgpack_frame([i]) for i in ids[:300]] + [msgpack_frame([], done=True)]
    rate = 70.0
    emitted = simulate(Coalescer(make(encoding, zdict), window=window), frames, rate)
    d = unmake(encoding, zdict)
    decoded = b""
    produced = 0  # bytes of frames the client can decode so far
    ends = []
    total = 0
    for f in frames:
        total += len(f)
        ends.append(total)
    available_at: list[float] = []
    for t, chunk in emitted:
        decoded += d.decompress(chunk)
        while produced < len(frames) and ends[produced] <= len(decoded):
            available_at.append(t)
            produced += 1
    d.finish()
    assert decoded == b"".join(frames)
    for k, t in enumerate(available_at):
        assert t - k / rate <= window + 1e-9, f"frame {k} decodable only after {t - k / rate}s"


def test_first_frame_flushed_at_once(zdict):
    co = Coalescer(make("gzip", zdict), window=1.0)
    out = co.add(msgpack_frame([1]), 0.0)
    assert new_decompressor("gzip").decompress(out) == msgpack_frame([1])
    assert co.add(msgpack_frame([2]), 0.01) == b""
    assert co.deadline == pytest.approx(1.01)
    assert co.poll(0.5) == b""
    assert co.poll(1.01) != b""
    assert co.deadline is None


def test_identity_is_coalesced_like_every_coding():
    co = Coalescer(new_compressor("identity"), window=10.0)
    assert co.add(b"abc", 0.0) == b"abc"  # the first frame at once, as for every coding
    assert co.add(b"def", 0.001) == b""  # then one write per window
    assert co.add(b"gh", 5.0) == b""
    assert co.poll(9.0) == b""
    assert co.poll(10.001) == b"defgh"
    assert co.deadline is None


@pytest.mark.parametrize("encoding", ["identity", "gzip"])
def test_a_frame_added_with_flush_closes_its_window(encoding):
    """A keep-alive goes out with what its window holds, not a window later."""
    co = Coalescer(new_compressor(encoding), window=10.0)
    dec = zlib.decompressobj(31).decompress if encoding == "gzip" else bytes
    first = co.add(b"abc", 0.0)
    assert co.add(b"def", 0.001) == b""
    out = co.add(b": keep-alive\n\n", 5.0, flush=True)
    assert dec(first + out) == b"abcdef: keep-alive\n\n"
    assert co.deadline is None


def test_pending_limit_closes_the_window_early():
    co = Coalescer(new_compressor("gzip"), window=10.0, flush_first=False, max_pending=100)
    co.add(b"x" * 60, 0.0)  # under the limit: may only emit the gzip header
    assert co.add(b"y" * 60, 0.0) != b""
    assert co.deadline is None


def test_coalescer_lifecycle_errors():
    co = Coalescer(new_compressor("gzip"))
    co.close(0.0)
    with pytest.raises(LocalProtocolError):
        co.add(b"x", 1.0)
    with pytest.raises(LocalProtocolError):
        co.close(1.0)
    with pytest.raises(LocalProtocolError):
        Coalescer(new_compressor("gzip"), window=-1)


def test_coalescing_beats_per_frame_flush_and_meets_byte_target(ids):
    # codec-spec §10 item 1 / peer-bench §3: flushing every one-id frame costs more than
    # identity protobuf; the default window brings msgpack+gzip under 2.5 B/token at
    # ~70 tokens/s on a 2,048-token stream.
    frames = [msgpack_frame([i]) for i in ids[:2048]] + [msgpack_frame([], done=True)]
    per_frame = simulate(Coalescer(new_compressor("gzip"), window=0), frames, 70.0)
    windowed = simulate(Coalescer(new_compressor("gzip")), frames, 70.0)
    per_frame_b = sum(len(b) for _, b in per_frame)
    windowed_b = sum(len(b) for _, b in windowed)
    assert windowed_b < per_frame_b / 2  # /3 with Z_SYNC_FLUSH, whose flushes cost more
    assert windowed_b / 2048 <= 2.5


@settings(max_examples=60, deadline=None)
@given(
    frames=st.lists(st.binary(max_size=40), max_size=30),
    gaps=st.lists(st.floats(0, 0.3), min_size=30, max_size=30),
    encoding=st.sampled_from(ENCODINGS),
    window=st.sampled_from([0.0, 0.01, 0.1]),
)
def test_coalesced_stream_round_trips(frames, gaps, encoding, window, zdict):
    co = Coalescer(make(encoding, zdict), window=window)
    t, body = 0.0, b""
    for frame, gap in zip(frames, gaps, strict=False):
        t += gap
        body += co.poll(t) + co.add(frame, t)
    body += co.close(t)
    d = unmake(encoding, zdict)
    assert d.decompress(body) + d.finish() == b"".join(frames)


# -- bounded decompression -----------------------------------------------------------------


def _whole(encoding: str, data: bytes, zdict: ZstdDict) -> bytes:
    return make(encoding, zdict).compress_body(data)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_whole_body_equals_streamed_body_decoded(encoding, zdict, ids):
    data = b"".join(msgpack_frame([i]) for i in ids[:3000])
    c = make(encoding, zdict)
    streamed = c.compress(data[:100]) + c.compress_body(data[100:])  # after streaming: same context
    for body in (_whole(encoding, data, zdict), streamed):
        d = unmake(encoding, zdict)
        assert d.decompress(body) + d.finish() == data
    with pytest.raises(LocalProtocolError):
        c.compress(b"x")


def test_gzip_whole_body_is_not_held_to_fixed_blocks(ids):
    # No flush points in a whole body, so dynamic Huffman blocks are allowed, and smaller.
    data = b"".join(msgpack_frame([i]) for i in ids[:3000])
    streamed = new_compressor("gzip")
    assert len(_whole("gzip", data, None)) < len(streamed.compress(data) + streamed.finish())


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_budget_is_exact_and_rejects_never_truncates(encoding, zdict):
    body = _whole(encoding, b"a" * 1000, zdict)
    d = unmake(encoding, zdict, max_output=1000)
    assert d.decompress(body) == b"a" * 1000
    d.finish()
    over = unmake(encoding, zdict, max_output=999)
    with pytest.raises(DecompressionLimitExceeded):
        over.decompress(body)
    with pytest.raises(DecompressionLimitExceeded):  # the failure is permanent
        over.decompress(b"")


@pytest.mark.parametrize("encoding", ["gzip", "zstd", "br"])
def test_decompression_bomb_is_rejected(encoding, zdict):
    # security/02 sketch: 16 MiB + 1 zero bytes; the default budget is 16 MiB.
    bomb = _whole(encoding, bytes(DEFAULT_MAX_DECOMPRESSED + 1), zdict)
    assert len(bomb) < 64 * 1024
    d = unmake(encoding, zdict)
    with pytest.raises(DecompressionLimitExceeded):
        for i in range(0, len(bomb), 4096):
            d.decompress(bomb[i : i + 4096])
    assert d.total_out <= DEFAULT_MAX_DECOMPRESSED + 4 * 1024 * 1024


@pytest.mark.parametrize("encoding", ["gzip", "br", "zstd"])
def test_truncated_body_fails_at_finish(encoding, zdict):
    body = _whole(encoding, b"hello codec " * 50, zdict)
    d = unmake(encoding, zdict)
    d.decompress(body[:-3])
    with pytest.raises(DecompressionError):
        d.finish()


@pytest.mark.parametrize("encoding", ["gzip", "br", "zstd"])
def test_bytes_after_end_of_stream_are_rejected(encoding, zdict):
    body = _whole(encoding, b"hello", zdict)
    d = unmake(encoding, zdict)
    with pytest.raises(DecompressionError):
        d.decompress(body + b"\x00junk")


def test_zstd_with_wrong_dictionary_fails(zdict, ids):
    other = ZstdDict.from_bytes(
        train_dictionary(
            [b"".join(msgpack_frame([i + 7]) for i in ids[k : k + 64]) for k in range(0, 9000, 30)],
            size=2048,
        )
    )
    body = _whole("zstd", b"".join(msgpack_frame([i]) for i in ids[:200]), zdict)
    with pytest.raises(DecompressionError):
        new_decompressor("zstd", dictionary=other).decompress(body)


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=300), encoding=st.sampled_from(ENCODINGS), bytewise=st.booleans())
def test_fuzz_decoders_yield_bytes_or_remote_protocol_error(data, encoding, bytewise, zdict):
    d = unmake(encoding, zdict, max_output=1 << 20)
    try:
        chunks = [data[i : i + 1] for i in range(len(data))] if bytewise else [data]
        for chunk in chunks:
            assert isinstance(d.decompress(chunk), bytes)
        d.finish()
    except RemoteProtocolError:
        pass


# -- client-side selection (codec-spec §2.7) -----------------------------------------------


def test_zstd_without_dict_header_is_a_protocol_error(zdict):
    with pytest.raises(RemoteProtocolError):
        decompressor_for_response("zstd", None, {zdict.hash: zdict})


def test_dict_header_on_non_zstd_response_is_a_protocol_error(zdict):
    with pytest.raises(RemoteProtocolError):
        decompressor_for_response("gzip", zdict.hash, {zdict.hash: zdict})


def test_unknown_dict_names_the_hash_to_fetch(zdict):
    missing = "sha256:" + "0" * 64
    with pytest.raises(MapNotFound, match=missing):
        decompressor_for_response("zstd", missing, {zdict.hash: zdict})


def test_dict_header_selects_that_dictionary(zdict):
    body = _whole("zstd", b"abc" * 10, zdict)
    d = decompressor_for_response(
        "ZSTD", zdict.hash.upper().replace("SHA256", "sha256"), {zdict.hash: zdict}
    )
    assert d.decompress(body) == b"abc" * 10
    assert decompressor_for_response(None, None, {}).encoding == "identity"


def test_reference_libraries_decode_our_streams(zdict, ids):
    # Real peers: the stdlib/brotli/zstandard one-shot decoders read our flushed streams.
    data = b"".join(msgpack_frame([i]) for i in ids[:500])
    for encoding, decode in [
        ("gzip", lambda b: zlib.decompress(b, 31)),
        ("br", brotli.decompress),
        (
            "zstd",
            lambda b: (
                zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(zdict.raw))
                .decompressobj()
                .decompress(b)
            ),
        ),
    ]:
        co = Coalescer(make(encoding, zdict), window=0.05)
        body = b"".join(
            b for _, b in simulate(co, [data[i : i + 15] for i in range(0, len(data), 15)], 70.0)
        )
        assert decode(body) == data
