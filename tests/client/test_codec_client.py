"""The Codec client against a scripted loopback server (codec-spec §2.1-§2.7, §4, §5.4).

Fault cases first (every mismatch of §2.7 is fatal and typed), then round trips of every
stream_format x encoding x path. End-to-end runs against the real server are in
``test_codec_client_e2e.py``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import httpx
import pytest

from tests.client._loopback import serve
from tests.client._scripted import (
    ANSWER,
    ANSWER_IDS,
    DICTS,
    MAP,
    ScriptedCodecServer,
    compressed_chunks,
    frame_bytes,
    stock_decode,
)
from tokenwire.client._base import ResponseDecoder, ResponseHead, default_accept_encoding
from tokenwire.client.codec_client import AsyncCodecClient, CodecClient
from tokenwire.codec.compression import new_decompressor
from tokenwire.codec.detokenizer import Detokenizer
from tokenwire.codec.finish_reason import ClientFinishReason
from tokenwire.codec.frames import StreamFormat
from tokenwire.codec.maps import sha256_hash
from tokenwire.codec.requests import decode_request
from tokenwire.errors import (
    CodecHTTPError,
    CodecTransportError,
    CodecVersionRequired,
    ContentTypeMismatch,
    DataAfterDone,
    DecompressionLimitExceeded,
    DiscoveryNotFound,
    RemoteProtocolError,
    TokenizerMapMismatch,
    TruncatedStream,
    ZstdDictError,
)

ENCODINGS = ("identity", "gzip", "br", "zstd")


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[ScriptedCodecServer, str]]:
    scripted = ScriptedCodecServer()
    with serve(scripted.app) as origin:
        yield scripted, origin


def make(origin: str, scenario: str = "ok", **kw: object) -> CodecClient:
    return CodecClient(f"{origin}/s/{scenario}", **kw)


# -- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize(("fmt", "encoding", "path"), list(itertools.product(
    [f.value for f in StreamFormat], ENCODINGS, ["a", "b", "c"])))
def test_every_format_encoding_and_path_round_trips(server, fmt, encoding, path) -> None:
    _, origin = server
    with make(origin, stream_format=fmt, accept_encoding=encoding) as client, \
            client.stream(ANSWER if path != "b" else list(ANSWER_IDS), path=path) as stream:
        texts = [chunk.text for chunk in stream]
    assert tuple(stream.ids) == ANSWER_IDS
    assert "".join(texts) == Detokenizer(MAP).decode(ANSWER_IDS)
    assert stream.finish_reason is ClientFinishReason.EOS_TOKEN
    stats = stream.stats
    assert stats.content_encoding == encoding and stats.path == path
    assert stats.zstd_dict == (DICTS[fmt].hash if encoding == "zstd" else None)
    expected_wire = b"".join(compressed_chunks(frame_bytes(StreamFormat(fmt)), encoding,
                                               DICTS[fmt] if encoding == "zstd" else None))
    assert stats.wire_bytes == len(expected_wire)
    assert stats.body_bytes == len(b"".join(frame_bytes(StreamFormat(fmt))))
    assert stats.tokens == len(ANSWER_IDS) == stats.frames


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_served_bodies_also_decode_with_the_stock_decoders(encoding) -> None:
    frames = frame_bytes(StreamFormat.MSGPACK)
    zdict = DICTS["msgpack"] if encoding == "zstd" else None
    body = b"".join(compressed_chunks(frames, encoding, zdict))
    assert stock_decode(encoding, body, zdict) == b"".join(frames)


def test_text_arrives_as_the_stream_arrives_not_at_the_end() -> None:
    # Fed one wire chunk at a time, every frame is decoded from its own flushed chunk.
    zdict = DICTS["msgpack"]
    for encoding in ENCODINGS:
        chunks = compressed_chunks(frame_bytes(StreamFormat.MSGPACK), encoding,
                                   zdict if encoding == "zstd" else None)
        head = ResponseHead("application/x-msgpack", encoding, None, None)
        dec = ResponseDecoder(path="a", stream_format=StreamFormat.MSGPACK, head=head,
                              decompressor=new_decompressor(encoding, dictionary=zdict),
                              detokenizer=Detokenizer(MAP).stream())
        per_chunk = [len(list(dec.feed(c))) for c in chunks]
        assert sum(per_chunk) == len(ANSWER_IDS), encoding
        assert min(per_chunk[:-1]) >= 1, f"{encoding}: a flushed chunk decoded no frame"


def test_path_c_sends_a_binary_request_body(server) -> None:
    scripted, origin = server
    for fmt, ctype in (("msgpack", "application/x-msgpack"),
                       ("protobuf", "application/x-protobuf")):
        scripted.seen.requests.clear()
        with make(origin, stream_format=fmt) as client:
            done = client.complete(list(ANSWER_IDS[:5]), path="c", max_tokens=7)
        assert done.ids == ANSWER_IDS
        [(url, headers, body)] = scripted.seen.requests
        assert url.endswith("/v1/completions/codec") and headers["content-type"] == ctype
        req = decode_request(body, fmt)
        assert req.prompt_ids == ANSWER_IDS[:5] and req.max_tokens == 7


def test_path_c_404_falls_back_to_path_b(server) -> None:
    scripted, origin = server
    scripted.seen.requests.clear()
    with make(origin, "no-path-c") as client:
        done = client.complete("Hello there", path="c")
    assert done.stats.path == "b" and done.ids == ANSWER_IDS
    [(url, _, body)] = scripted.seen.requests
    assert url.endswith("/v1/completions") and b'"prompt": [' in body


def test_requests_declare_the_client_version_and_a_zstd_free_default_offer(server) -> None:
    scripted, origin = server
    scripted.seen.requests.clear()
    with make(origin) as client:
        client.complete("Hi")
    headers = scripted.seen.requests[-1][1]
    assert headers["codec-client-version"] == "0.5"
    assert "zstd" not in headers["accept-encoding"]
    assert "zstd" in default_accept_encoding(zstd=True)
    with make(origin, zstd_dicts=[DICTS["msgpack"]]) as client:  # a held dict opts in
        assert client.accept_encoding().startswith("zstd")


def test_pinned_map_is_sent_and_enforced(server) -> None:
    scripted, origin = server
    with make(origin, tokenizer_map=MAP) as client:
        assert client.complete("Hi").text == Detokenizer(MAP).decode(ANSWER_IDS)
    assert scripted.seen.requests[-1][1]["x-codec-map"] == MAP.hash


def test_unknown_dictionary_is_fetched_verified_and_cached(server) -> None:
    _, origin = server
    with make(origin, stream_format="protobuf", zstd=True) as client:
        assert DICTS["protobuf"].hash not in client.cache.dicts
        client.complete("Hi")
        assert DICTS["protobuf"].hash in client.cache.dicts
        assert MAP.hash in client.cache.maps


def test_async_twin_round_trips_and_fails_the_same_way(server) -> None:
    _, origin = server

    async def go() -> None:
        async with AsyncCodecClient(f"{origin}/s/ok", stream_format="msgpack-delta",
                                    zstd=True) as client:
            async with client.stream("Hi", path="c") as stream:
                texts = [chunk.text async for chunk in stream]
            assert tuple(stream.ids) == ANSWER_IDS and "".join(texts) == stream.text
            assert stream.stats.content_encoding == "zstd"
        async with AsyncCodecClient(f"{origin}/s/wrong-map", tokenizer_map=MAP) as client:
            with pytest.raises(TokenizerMapMismatch):
                await client.complete("Hi")
        async with AsyncCodecClient(f"{origin}/s/426") as client:
            with pytest.raises(CodecVersionRequired):
                await client.complete("Hi")

    asyncio.run(go())


# -- every §2.7 mismatch is fatal and typed ------------------------------------------------


def test_426_raises_codec_version_required_with_the_body_fields(server) -> None:
    with make(server[1], "426", client_version="0.3") as client, \
            pytest.raises(CodecVersionRequired) as info:
        client.complete("Hi")
    assert info.value.minimum_version == "0.4" and info.value.client_version == "0.3"
    assert info.value.deployment_id == "scripted"


def test_426_with_an_unrecognised_body_still_raises(server) -> None:
    with make(server[1], "426-garbage") as client, pytest.raises(RemoteProtocolError):
        client.complete("Hi")


def test_json_sse_fallback_is_reported_not_misparsed(server) -> None:
    with make(server[1], "json-sse") as client, pytest.raises(ContentTypeMismatch) as info:
        client.complete("Hi")
    assert info.value.is_json_sse and info.value.expected == "application/x-msgpack"


def test_tokenizer_map_mismatch_is_fatal(server) -> None:
    with make(server[1], "wrong-map", tokenizer_map=MAP) as client, \
            pytest.raises(TokenizerMapMismatch):
        client.complete("Hi")


def test_map_mismatch_against_the_map_used_for_the_prompt_is_fatal(server) -> None:
    # Path B tokenizes with the index map; the server then names another one.
    with make(server[1], "wrong-map") as client, pytest.raises(TokenizerMapMismatch):
        client.complete("Hi", path="b")


def test_zstd_without_codec_zstd_dict_is_a_protocol_error(server) -> None:
    with make(server[1], "zstd-without-dict-header", accept_encoding="zstd") as client, \
            pytest.raises(ZstdDictError):
        client.complete("Hi")


def test_codec_zstd_dict_on_a_non_zstd_response_is_a_protocol_error(server) -> None:
    with make(server[1], "dict-header-on-gzip", accept_encoding="gzip") as client, \
            pytest.raises(ZstdDictError):
        client.complete("Hi")


def test_unresolvable_dictionary_aborts_with_discovery_not_found(server) -> None:
    with make(server[1], "unknown-dict", accept_encoding="zstd") as client, \
            pytest.raises(DiscoveryNotFound):
        client.complete("Hi")


def test_error_status_is_codec_http_error(server) -> None:
    with make(server[1], "500") as client, pytest.raises(CodecHTTPError) as info:
        client.complete("Hi")
    assert info.value.status == 500


def test_truncated_stream_and_bytes_after_done_are_rejected(server) -> None:
    for scenario, error in (("truncated", TruncatedStream), ("trailing", DataAfterDone)):
        for encoding in ("identity", "gzip"):
            with make(server[1], scenario, accept_encoding=encoding) as client, \
                    pytest.raises(error):
                client.complete("Hi")


def test_decompression_budget_rejects_a_bomb(server) -> None:
    with make(server[1], "gzip-bomb", max_decompressed=1024 * 1024) as client, \
            pytest.raises(DecompressionLimitExceeded):
        client.complete("Hi")


def test_connection_failure_is_a_transport_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with CodecClient("http://127.0.0.1:9", transport=httpx.MockTransport(refuse)) as client, \
            pytest.raises(CodecTransportError):
        client.complete("Hi")


def test_map_hash_header_with_garbage_is_a_protocol_error() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"Content-Type": "application/x-msgpack",
                                            "Codec-Tokenizer-Map": "md5:abc"}, content=b"")

    with CodecClient("http://127.0.0.1:9", transport=httpx.MockTransport(answer)) as client, \
            pytest.raises(RemoteProtocolError, match="Codec-Tokenizer-Map"):
        client.complete("Hi")


def test_missing_map_header_without_a_pinned_map_yields_ids_only(server) -> None:
    with make(server[1], "no-map-header") as client:
        done = client.complete("Hi")
    assert done.ids == ANSWER_IDS and done.text == "" and done.stats.tokenizer_map is None


def test_sha256_of_served_map_matches_header(server) -> None:
    # The map the client fetched by the header's hash is byte-identical to the bundled map.
    with make(server[1]) as client:
        client.complete("Hi")
        assert client.cache.maps.get(MAP.hash).raw == MAP.raw
    assert sha256_hash(MAP.raw) == MAP.hash
