"""Decompression bombs in the client (issue 11 item 4): memory stays near the cap.

Discovery and ``fetch_map`` used ``iter_bytes``, which inflates a whole chunk before the
size check: a 1.6 KB brotli body of 1 GiB drove the client to 2 GB. Each body here inflates
to 1 GiB; the assertion is on peak traced memory only (never on time). The transport is
``httpx.MockTransport`` serving the bomb's raw bytes with its ``Content-Encoding``, so the
decoding path is the client's own.
"""

from __future__ import annotations

import tracemalloc
import zlib

import brotli
import httpx
import pytest
import zstandard

from tokenwire.client import discovery
from tokenwire.client.bounded_read import BodyOverBudget, read_bounded
from tokenwire.client.map_fetch import MAX_MAP_BYTES, MapFetchError, fetch_map
from tokenwire.errors import DiscoveryError

GIB = 1 << 30
_MIB = 1 << 20


def _bomb(coding: str) -> bytes:
    chunk, n = b"\0" * _MIB, GIB // _MIB
    if coding == "br":
        c = brotli.Compressor(quality=5)
        return b"".join(c.process(chunk) for _ in range(n)) + c.finish()
    if coding == "zstd":
        z = zstandard.ZstdCompressor(level=3).compressobj()
        return b"".join(z.compress(chunk) for _ in range(n)) + z.flush()
    g = zlib.compressobj(9, zlib.DEFLATED, 31)
    return b"".join(g.compress(chunk) for _ in range(n)) + g.flush()


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    return {c: _bomb(c) for c in ("br", "zstd", "gzip")}


class _Chunks(httpx.SyncByteStream):
    """The body as a server sends it: raw bytes in 64 KiB reads (httpx would read a
    ``content=`` body eagerly)."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    def __iter__(self):
        for i in range(0, len(self._body), 65536):
            yield self._body[i:i + 65536]


def _client(body: bytes, coding: str) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=_Chunks(body), headers={"content-encoding": coding})

    return httpx.Client(transport=httpx.MockTransport(handler))


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("coding", ["br", "zstd", "gzip"])
def test_fetch_map_refuses_a_bomb_within_its_cap_of_memory(bombs, coding) -> None:
    body = bombs[coding]
    assert len(body) < 1_100_000  # a few KB (br, zstd) to ~1 MB (gzip) on the wire

    def fetch() -> None:
        with _client(body, coding) as http, pytest.raises(MapFetchError, match="over"):
            fetch_map("https://x.example/m.json", expected_hash=None, unverified=True,
                      client=http, cache=None)

    # Decoded bytes are counted as they are produced, so memory is bounded by the cap: the
    # output kept so far plus one decoder call's (itself within the cap) and its join.
    assert _peak(fetch) < 2 * MAX_MAP_BYTES + 16 * _MIB  # not the gigabyte (2 GB before)


@pytest.mark.parametrize("coding", ["br", "zstd", "gzip"])
def test_discovery_refuses_a_bomb_within_its_cap_of_memory(bombs, coding) -> None:
    def fetch() -> None:
        with _client(bombs[coding], coding) as http, pytest.raises(DiscoveryError,
                                                                    match="over"):
            discovery.drive(_one_fetch(), http)

    assert _peak(fetch) < 2 * _MIB + 16 * _MIB  # a 1 MiB cap: a few MiB at most


def _one_fetch():
    yield discovery.Fetch("https://x.example/d", 1 << 20)


@pytest.mark.parametrize("coding", ["identity", "br", "zstd", "gzip"])
def test_a_body_within_the_budget_decodes_exactly(coding) -> None:
    data = b"tokenwire " * 1000
    raw = {"identity": lambda d: d, "br": brotli.compress,
           "zstd": lambda d: zstandard.ZstdCompressor().compress(d),
           "gzip": lambda d: zlib.compress(d, wbits=31)}[coding](data)
    with _client(raw, coding) as http, http.stream("GET", "https://x.example/") as resp:
        assert read_bounded(resp, len(data)) == data
    with _client(raw, coding) as http, http.stream("GET", "https://x.example/") as resp, \
            pytest.raises(BodyOverBudget) as info:
        read_bounded(resp, len(data) - 1)
    assert data.startswith(info.value.partial)
