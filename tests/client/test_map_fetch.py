"""Loading maps by URL from a real loopback HTTP server: hash pinning, schemes, size cap."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import fixture_map_path
from tokenwire.client import map_fetch
from tokenwire.client.map_fetch import MapFetchError, afetch_map, fetch_map
from tokenwire.codec.maps import MapCache, sha256_hash
from tokenwire.errors import MapHashMismatch

RAW = fixture_map_path("anthropic/claude-3-text").read_bytes()
HASH = sha256_hash(RAW)


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/map.json":
            body, status = RAW, 200
        elif self.path == "/huge.json":
            body, status = b" " * (map_fetch.MAX_MAP_BYTES + 1), 200
        else:
            body, status = b"not found", 404
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def origin() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_fetch_verifies_the_pinned_hash(origin: str) -> None:
    tmap = fetch_map(f"{origin}/map.json", expected_hash=HASH, allow_http=True, cache=None)
    assert tmap.hash == HASH
    with pytest.raises(MapHashMismatch):
        fetch_map(f"{origin}/map.json", expected_hash="00" * 32, allow_http=True, cache=None)


def test_async_twin_behaves_the_same(origin: str) -> None:
    tmap = asyncio.run(afetch_map(f"{origin}/map.json", expected_hash=HASH, allow_http=True,
                                  cache=None))
    assert tmap.id == "anthropic/claude-3-text"


def test_plain_http_needs_an_explicit_opt_in(origin: str) -> None:
    with pytest.raises(MapFetchError, match="https"):
        fetch_map(f"{origin}/map.json", expected_hash=HASH)


def test_a_hash_is_required_unless_unverified_is_explicit(origin: str) -> None:
    with pytest.raises(MapFetchError, match="expected_hash"):
        fetch_map(f"{origin}/map.json", expected_hash=None, allow_http=True)
    tmap = fetch_map(f"{origin}/map.json", expected_hash=None, unverified=True, allow_http=True,
                     cache=None)
    assert tmap.hash == HASH


def test_http_errors_and_oversized_bodies_are_typed(origin: str) -> None:
    with pytest.raises(MapFetchError, match="404"):
        fetch_map(f"{origin}/missing.json", expected_hash=HASH, allow_http=True, cache=None)
    with pytest.raises(MapFetchError, match="over"):
        fetch_map(f"{origin}/huge.json", expected_hash=HASH, allow_http=True, cache=None)
    with pytest.raises(MapFetchError, match="failed"):
        fetch_map("http://127.0.0.1:9/none.json", expected_hash=HASH, allow_http=True, cache=None)


def test_cache_hit_skips_the_network() -> None:
    cache = MapCache()
    from tokenwire.codec.maps import load_map_bytes

    cache.put(load_map_bytes(RAW))
    # Port 9 (discard) would fail if contacted; the cache answers first.
    assert fetch_map("https://127.0.0.1:9/m.json", expected_hash=HASH, cache=cache).hash == HASH
