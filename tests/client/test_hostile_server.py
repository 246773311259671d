"""The Codec client against a hostile server: every answer is one a user pointed the client
at without controlling it. Each must end in a typed error of the client's own hierarchy
(a :class:`~tokenwire.errors.TokenwireError`), never a ``RecursionError``, a library's own
exception or gigabytes of memory.

The server is a real loopback one (``_loopback.serve``) of canned answers
(``_canned.canned_app``): :data:`ANSWERS` sets each path's status, headers and body.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.client._canned import Answer, Trickle, canned_app
from tests.client._loopback import serve
from tokenwire.client.codec_client import AsyncCodecClient, CodecClient
from tokenwire.client.discovery import aresolve_map, resolve_map, resolve_policy
from tokenwire.client.map_fetch import afetch_map, fetch_map
from tokenwire.codec.byte_level import BYTE_TO_CHAR
from tokenwire.codec.frames import Frame
from tokenwire.codec.frames_msgpack import FrameEncoder
from tokenwire.codec.maps import MAX_TOKEN_ID, sha256_hash
from tokenwire.codec.versioning import VersionPolicy, upgrade_required_response
from tokenwire.errors import (
    CodecDeadlineExceeded,
    CodecHTTPError,
    CodecTransportError,
    CodecVersionRequired,
    DecompressionError,
    DiscoveryDocumentInvalid,
    PatternTimeout,
    RemoteProtocolError,
    UnsupportedProgram,
)

MSGPACK = "application/x-msgpack"
#: Past Python's recursion limit (1000) by far, and 100 KB: within every body cap.
DEEP = b"[" * 100_000
FRAMES = FrameEncoder().encode(Frame(ids=(1,), done=True, finish_reason="stop"))
DEEP_MAP = b'{"id": "hostile/map", "vocab_size": 1, "vocab": {"a": 0}, "x": ' + DEEP
SPARSE_MAP = json.dumps({"id": "hostile/map", "vocab_size": 2,  # 70 bytes, two 64 MiB lists
                         "vocab": {"a": 0, "b": MAX_TOKEN_ID + 1}}).encode()
# A zstd dictionary's magic, then bytes zstd cannot read: hash-verified, still unusable.
BAD_DICT = b"\x37\xa4\x30\xec" + b"\xff" * 100



def _pattern_map(pattern: str) -> bytes:
    """A byte_level map of the 256 bytes whose pre-tokenizer is ``pattern`` alone."""
    return json.dumps({"id": "hostile/redos", "vocab_size": 256, "encoder": "byte_level",
                       "vocab": {BYTE_TO_CHAR[b]: b for b in range(256)},
                       "pre_tokenizer_pattern": pattern}).encode()


#: Exponential in the regex module: (a|aa)+ splits a run of n a's in Fibonacci(n) ways.
EXPONENTIAL_MAP = _pattern_map(r"(a|aa)+b|.")
#: Past the refusal of repeated repeats, yet a power of the text's length (n^8): on 20,000
#: spaces, 10^34 steps. Its look-ahead makes tiktoken's fancy-regex give up (and panic).
POLYNOMIAL_MAP = _pattern_map(r"\s*\s*\s*\s*\s*\s*\s*\s*(?!y)x|\S+|\s")

TRICKLED_MAP = b"a map whose document never ends"
_, _, REAL_426 = upgrade_required_response(VersionPolicy(version_policy="strict"), "0.1")
GZIP_JSON = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
ENDLESS_FRAME = FrameEncoder().encode(Frame(ids=(1,), done=False))

ANSWERS: dict[str, Answer] = {
    # Error answers compressed as the client's Accept-Encoding allows (a proxy's gzip).
    "/gzip-400/v1/completions": (400, GZIP_JSON, gzip.compress(
        json.dumps({"error": {"message": "the prompt is too long"}}).encode())),
    "/gzip-426/v1/completions": (426, GZIP_JSON, gzip.compress(REAL_426)),
    **{f"/.well-known/codec/maps/sha256/{sha256_hash(m)[7:]}.json": (200, {}, m)
       for m in (EXPONENTIAL_MAP, POLYNOMIAL_MAP)},
    "/426-deep/v1/completions": (426, {"Content-Type": "application/json"}, DEEP),
    "/500-deep/v1/completions": (500, {"Content-Type": "application/json"}, DEEP),
    "/.well-known/codec/index.json": (200, {"Content-Type": "application/json"}, DEEP),
    "/.well-known/codec/maps/hostile/deep.json": (200, {}, DEEP),
    "/.well-known/codec/policies/hostile/deep.json": (200, {}, DEEP),
    f"/.well-known/codec/maps/sha256/{sha256_hash(DEEP_MAP)[7:]}.json": (200, {}, DEEP_MAP),
    "/names-deep-map/v1/completions": (
        200, {"Content-Type": MSGPACK, "Codec-Tokenizer-Map": sha256_hash(DEEP_MAP)}, FRAMES),
    f"/.well-known/codec/maps/sha256/{sha256_hash(SPARSE_MAP)[7:]}.json": (200, {}, SPARSE_MAP),
    "/names-sparse-map/v1/completions": (
        200, {"Content-Type": MSGPACK, "Codec-Tokenizer-Map": sha256_hash(SPARSE_MAP)}, FRAMES),
    f"/.well-known/codec/dicts/{sha256_hash(BAD_DICT)[7:]}.zstd": (200, {}, BAD_DICT),
    "/names-bad-dict/v1/completions": (
        200, {"Content-Type": MSGPACK, "Content-Encoding": "zstd",
              "Codec-Zstd-Dict": sha256_hash(BAD_DICT)}, b"\x28\xb5\x2f\xfd" + bytes(20)),
    "/silent/v1/completions": (200, {"Content-Type": MSGPACK}, None),  # the head, then nothing
    # A frame every 50 ms, for ever: never silent for a read timeout, never done.
    "/trickle/v1/completions": (200, {"Content-Type": MSGPACK}, Trickle(ENDLESS_FRAME)),
    f"/.well-known/codec/maps/sha256/{sha256_hash(TRICKLED_MAP)[7:]}.json": (
        200, {}, Trickle(b" ")),  # JSON's whitespace, within the map's 64 MiB for days
    "/.well-known/codec/maps/hostile/trickled.json": (200, {}, Trickle(b" ")),
}


@pytest.fixture(scope="module")
def origin() -> Iterator[str]:
    with serve(canned_app(ANSWERS)) as url:
        yield url


def _complete(origin: str, scenario: str, path: str = "a") -> None:
    with CodecClient(f"{origin}/{scenario}") as client:
        client.complete("Hi", path=path)


# -- JSON nested past the recursion limit --------------------------------------------------


def test_a_426_nested_past_the_recursion_limit_is_a_protocol_error(origin) -> None:
    with pytest.raises(RemoteProtocolError, match="426 with a body that is not JSON"):
        _complete(origin, "426-deep")


def test_an_error_body_nested_past_the_recursion_limit_is_shown_as_text(origin) -> None:
    with pytest.raises(CodecHTTPError) as info:
        _complete(origin, "500-deep")
    assert info.value.status == 500 and info.value.message.startswith("[[[[")


@pytest.mark.parametrize("resolve", [
    pytest.param(lambda origin: _complete(origin, "x", path="b"), id="index.json"),
    pytest.param(lambda origin: resolve_map(origin, "hostile/deep", allow_http=True),
                 id="map-id-document"),
    pytest.param(lambda origin: resolve_policy(origin, "hostile/deep", allow_http=True),
                 id="policy-id-document"),
    pytest.param(lambda origin: _complete(origin, "names-deep-map"), id="map-by-hash"),
])
def test_discovery_documents_nested_past_the_recursion_limit_are_invalid(origin,
                                                                         resolve) -> None:
    with pytest.raises(DiscoveryDocumentInvalid, match="nests deeper"):
        resolve(origin)


# -- error answers in a Content-Encoding -------------------------------------------------------


def test_a_compressed_error_body_is_shown_decoded(origin) -> None:
    with pytest.raises(CodecHTTPError, match="the prompt is too long"):
        _complete(origin, "gzip-400")


def test_a_compressed_426_is_the_upgrade_it_says(origin) -> None:
    with pytest.raises(CodecVersionRequired):
        _complete(origin, "gzip-426")


# -- maps and dictionaries the server names --------------------------------------------------


def test_a_map_with_an_id_past_the_limit_is_refused_before_its_tables_are_built(origin):
    with pytest.raises(DiscoveryDocumentInvalid, match=f"ids go up to {MAX_TOKEN_ID}"):
        _complete(origin, "names-sparse-map")


def test_a_dictionary_zstd_cannot_load_is_a_decompression_error(origin) -> None:
    with pytest.raises(DecompressionError, match=r"zstd dictionary .* is not usable"):
        _complete(origin, "names-bad-dict")


# -- a map whose pattern backtracks catastrophically -----------------------------------------


@pytest.mark.parametrize(("hostile_map", "error", "says"), [
    (EXPONENTIAL_MAP, UnsupportedProgram, "repeats a repeat or an alternation"),
    (POLYNOMIAL_MAP, PatternTimeout, "backtracks catastrophically"),
])
def test_a_map_whose_pattern_backtracks_for_ever_ends_the_first_encode(
        origin, hostile_map, error, says) -> None:
    # Path B tokenizes the prompt with the map the server names; a text the pattern can
    # never finish on (the first encode runs in Python, then tiktoken once built: both end).
    with CodecClient(f"{origin}/x", map_hash=sha256_hash(hostile_map)) as client, \
            pytest.raises(error, match=says):
        client.complete("a" * 60 + " " * 20_000 + "y", path="b")


# -- a stream that never ends -------------------------------------------------------------


def test_a_stream_that_goes_silent_fails_after_the_read_timeout(origin) -> None:
    with CodecClient(f"{origin}/silent", timeout=0.5) as client, \
            pytest.raises(CodecTransportError, match=r"the server sent nothing for 0\.5 s"):
        client.complete("Hi")


# A read timeout of 5 s, a piece every 50 ms: only the deadline can end these. The map
# download is Path B's: the prompt is tokenized with the pinned map, fetched by its hash.
TRICKLES = [pytest.param({}, "a", id="stream"),
            pytest.param({"map_hash": sha256_hash(TRICKLED_MAP)}, "b", id="map-download")]


@pytest.mark.parametrize(("options", "path"), TRICKLES)
def test_a_server_that_trickles_for_ever_is_stopped_by_the_deadline(origin, options,
                                                                     path) -> None:
    with CodecClient(f"{origin}/trickle", timeout=5.0, deadline=0.5, **options) as client, \
            pytest.raises(CodecDeadlineExceeded, match=r"deadline of 0\.5 s"):
        client.complete("Hi", path=path)


@pytest.mark.parametrize(("options", "path"), TRICKLES)
def test_the_async_twin_stops_a_trickle_at_the_deadline(origin, options, path) -> None:
    async def go() -> None:
        async with AsyncCodecClient(f"{origin}/trickle", timeout=5.0, deadline=0.5,
                                    **options) as client:
            await client.complete("Hi", path=path)

    with pytest.raises(CodecDeadlineExceeded, match=r"deadline of 0\.5 s"):
        asyncio.run(go())


@pytest.fixture
def endless_continue() -> Iterator[str]:
    """A server that answers every request with ``100 Continue`` heads, one every 50 ms,
    and never a final head (httpx reads them all inside one call)."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def run() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            while not stop.is_set():
                try:
                    conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                except OSError:
                    return
                time.sleep(0.05)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    listener.close()
    thread.join(5)


def test_the_async_client_stops_endless_1xx_heads_at_the_deadline(endless_continue) -> None:
    # (The sync client cannot: README says so.)
    async def go() -> None:
        async with AsyncCodecClient(endless_continue, timeout=5.0, deadline=0.5) as client:
            await client.complete("Hi")

    with pytest.raises(CodecDeadlineExceeded, match=r"deadline of 0\.5 s"):
        asyncio.run(go())


@pytest.mark.parametrize("fetch", [
    pytest.param(lambda origin: fetch_map(
        f"{origin}/.well-known/codec/maps/hostile/trickled.json", allow_http=True,
        expected_hash=sha256_hash(TRICKLED_MAP), deadline=0.5, cache=None), id="fetch_map"),
    pytest.param(lambda origin: asyncio.run(afetch_map(
        f"{origin}/.well-known/codec/maps/hostile/trickled.json", allow_http=True,
        expected_hash=sha256_hash(TRICKLED_MAP), deadline=0.5, cache=None)), id="afetch_map"),
    pytest.param(lambda origin: resolve_map(origin, "hostile/trickled", allow_http=True,
                                            deadline=0.5), id="resolve_map"),
    pytest.param(lambda origin: asyncio.run(aresolve_map(
        origin, "hostile/trickled", allow_http=True, deadline=0.5)), id="aresolve_map"),
])
def test_the_map_functions_stop_a_trickle_at_their_deadline(origin, fetch) -> None:
    # Their own clients wait 30 s per read; a byte every 50 ms never lets that fire.
    with pytest.raises(CodecDeadlineExceeded, match=r"deadline of 0\.5 s"):
        fetch(origin)


@pytest.mark.parametrize(("scenario", "error"), [
    ("426-deep", RemoteProtocolError), ("names-deep-map", DiscoveryDocumentInvalid),
    ("gzip-426", CodecVersionRequired),
    ("names-bad-dict", DecompressionError)])
def test_the_async_twin_fails_the_same_way(origin, scenario, error) -> None:
    async def go() -> None:
        async with AsyncCodecClient(f"{origin}/{scenario}") as client:
            await client.complete("Hi")

    with pytest.raises(error):
        asyncio.run(go())
