"""Discovery (codec-spec §6.3, §4.4, §5.6) against real loopback servers, http and https.

Each failure path of §6.3 must raise its own type (step 7), so every test names the rule
and asserts the exact class.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.client._loopback import have_openssl, self_signed_cert, serve, trust
from tests.conftest import CODEC_FIXTURES
from tokenwire.client.discovery import (
    DiscoveryCache,
    afetch_dict,
    aresolve_map,
    fetch_dict,
    resolve_map,
    resolve_policy,
)
from tokenwire.codec.maps import sha256_hash
from tokenwire.codec.safety_policy import canonicalise
from tokenwire.errors import (
    DiscoveryDocumentInvalid,
    DiscoveryError,
    DiscoveryHashMismatch,
    DiscoveryInsecureURL,
    DiscoveryNotFound,
    DiscoveryPointerError,
    MapValidationError,
)

WK = "/.well-known/codec"


def tiny_map(map_id: str, extra: str = "") -> bytes:
    return json.dumps({"id": map_id, "vocab_size": 3, "vocab": {"a": 0, "b": 1, "c": 2},
                       "encoder": "identity", "note": extra}).encode()


class Scripted:
    """A catch-all app: path -> (status, body); records every path requested."""

    def __init__(self) -> None:
        self.docs: dict[str, tuple[int, bytes]] = {}
        self.log: list[str] = []
        self.app = Starlette(routes=[Route("/{p:path}", self._serve)])

    async def _serve(self, request: Request) -> Response:
        self.log.append(request.url.path)
        status, body = self.docs.get(request.url.path, (404, b"{}"))
        return Response(body, status_code=status, media_type="application/json")

    def put(self, path: str, body: bytes, status: int = 200) -> None:
        self.docs[path] = (status, body)


@pytest.fixture(scope="module")
def site() -> Iterator[tuple[Scripted, str]]:
    scripted = Scripted()
    with serve(scripted.app) as origin:
        yield scripted, origin


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10) as client:
        yield client


def _resolve(origin: str, map_id: str, http: httpx.Client, **kw: object):
    return resolve_map(origin, map_id, allow_http=True, client=http, **kw)


# -- the happy paths -----------------------------------------------------------------------


def test_inline_document_is_returned_when_its_id_matches(site, http) -> None:
    s, origin = site
    raw = tiny_map("t/inline")
    s.put(f"{WK}/maps/t/inline.json", raw)
    tmap = _resolve(origin, "t/inline", http)
    assert tmap.id == "t/inline" and tmap.hash == sha256_hash(raw)


def test_pointer_is_followed_one_hop_and_its_hash_verified(site, http) -> None:
    s, origin = site
    raw = tiny_map("t/ptr")
    s.put("/blobs/ptr.json", raw)
    s.put(f"{WK}/maps/t/ptr.json", json.dumps(
        {"id": "t/ptr", "url": f"{origin}/blobs/ptr.json", "hash": sha256_hash(raw)}).encode())
    assert _resolve(origin, "t/ptr", http).hash == sha256_hash(raw)


def test_known_hash_prefers_the_content_addressed_sibling(site, http) -> None:
    s, origin = site
    raw = tiny_map("t/sib")
    digest = sha256_hash(raw)
    s.put(f"{WK}/maps/sha256/{digest[7:]}.json", raw)
    s.put(f"{WK}/maps/t/sib.json", b"not even json")  # must never be read
    s.log.clear()
    assert _resolve(origin, "t/sib", http, expected_hash=digest).hash == digest
    assert s.log == [f"{WK}/maps/sha256/{digest[7:]}.json"]


def test_missing_sibling_falls_back_to_the_id_document_and_still_checks_the_pin(site, http):
    s, origin = site
    raw = tiny_map("t/nosib")
    s.put(f"{WK}/maps/t/nosib.json", raw)
    assert _resolve(origin, "t/nosib", http, expected_hash=sha256_hash(raw)).id == "t/nosib"
    with pytest.raises(DiscoveryHashMismatch):
        _resolve(origin, "t/nosib", http, expected_hash=sha256_hash(b"other"))


def test_maps_are_cached_by_hash_and_not_fetched_twice(site, http) -> None:
    s, origin = site
    raw = tiny_map("t/cached")
    digest = sha256_hash(raw)
    s.put(f"{WK}/maps/sha256/{digest[7:]}.json", raw)
    cache = DiscoveryCache()
    _resolve(origin, "t/cached", http, expected_hash=digest, cache=cache)
    s.log.clear()
    _resolve(origin, "t/cached", http, expected_hash=digest, cache=cache)
    assert s.log == []


# -- every failure has its own type (§6.3 step 7) ------------------------------------------


def test_missing_document_is_discovery_not_found(site, http) -> None:
    with pytest.raises(DiscoveryNotFound):
        _resolve(site[1], "t/absent", http)


def test_missing_pointer_target_is_discovery_not_found(site, http) -> None:
    s, origin = site
    s.put(f"{WK}/maps/t/dangling.json", json.dumps(
        {"id": "t/dangling", "url": f"{origin}/blobs/gone.json",
         "hash": sha256_hash(b"x")}).encode())
    with pytest.raises(DiscoveryNotFound):
        _resolve(origin, "t/dangling", http)


def test_pointer_target_with_other_bytes_is_a_hash_mismatch(site, http) -> None:
    s, origin = site
    s.put("/blobs/swapped.json", tiny_map("t/swapped", extra="substituted by a CDN"))
    s.put(f"{WK}/maps/t/swapped.json", json.dumps(
        {"id": "t/swapped", "url": f"{origin}/blobs/swapped.json",
         "hash": sha256_hash(tiny_map("t/swapped"))}).encode())
    with pytest.raises(DiscoveryHashMismatch) as info:
        _resolve(origin, "t/swapped", http)
    assert info.value.expected == sha256_hash(tiny_map("t/swapped"))


def test_pointer_naming_another_id_is_a_pointer_error(site, http) -> None:
    s, origin = site
    raw = tiny_map("t/other")
    s.put("/blobs/other.json", raw)
    s.put(f"{WK}/maps/t/asked.json", json.dumps(
        {"id": "t/other", "url": f"{origin}/blobs/other.json", "hash": sha256_hash(raw)}).encode())
    with pytest.raises(DiscoveryPointerError, match="t/other"):
        _resolve(origin, "t/asked", http)


def test_pointer_to_a_pointer_is_refused_one_hop_only(site, http) -> None:
    s, origin = site
    raw = tiny_map("t/hop")
    s.put("/blobs/hop-final.json", raw)
    second = json.dumps({"id": "t/hop", "url": f"{origin}/blobs/hop-final.json",
                         "hash": sha256_hash(raw)}).encode()
    s.put("/blobs/hop-second.json", second)
    s.put(f"{WK}/maps/t/hop.json", json.dumps(
        {"id": "t/hop", "url": f"{origin}/blobs/hop-second.json",
         "hash": sha256_hash(second)}).encode())
    with pytest.raises(DiscoveryPointerError, match="one hop"):
        _resolve(origin, "t/hop", http)


@pytest.mark.parametrize("doc", [
    {"id": "t/badptr", "url": "https://x/y.json"},                    # no hash
    {"id": "t/badptr", "hash": "sha256:" + "0" * 64},                 # no url
    {"url": "https://x/y.json", "hash": "sha256:" + "0" * 64},        # no id
    {"id": "t/badptr", "url": "https://x/y.json", "hash": "md5:abc"},  # not sha256
    {"id": "t/badptr", "url": "ftp://x/y.json", "hash": "sha256:" + "0" * 64},
], ids=["no-hash", "no-url", "no-id", "bad-hash", "ftp-url"])
def test_malformed_pointer_is_a_pointer_error(site, http, doc) -> None:
    s, origin = site
    s.put(f"{WK}/maps/t/badptr.json", json.dumps(doc).encode())
    with pytest.raises(DiscoveryPointerError):
        _resolve(origin, "t/badptr", http)


def test_pinned_hash_differing_from_the_pointer_hash_is_a_mismatch(site, http) -> None:
    s, origin = site
    raw = tiny_map("t/pin")
    s.put("/blobs/pin.json", raw)
    s.put(f"{WK}/maps/t/pin.json", json.dumps(
        {"id": "t/pin", "url": f"{origin}/blobs/pin.json", "hash": sha256_hash(raw)}).encode())
    with pytest.raises(DiscoveryHashMismatch):
        _resolve(origin, "t/pin", http, expected_hash=sha256_hash(b"what I pinned"))


@pytest.mark.parametrize("body", [b"<html>not json", b"[1, 2]",
                                  json.dumps({"id": "t/invalid", "vocab": {}}).encode(),
                                  tiny_map("t/not-this-one")],
                         ids=["not-json", "not-object", "invalid-map", "inline-id-mismatch"])
def test_bad_documents_are_document_invalid(site, http, body) -> None:
    s, origin = site
    s.put(f"{WK}/maps/t/invalid.json", body)
    with pytest.raises(DiscoveryDocumentInvalid):
        _resolve(origin, "t/invalid", http)


@pytest.mark.parametrize("bad_id", ["../etc/passwd", "/t/x", "t/x/", "T/Upper", "t/../x", ""])
def test_ids_are_validated_before_any_url_is_built(site, http, bad_id) -> None:
    s, origin = site
    s.log.clear()
    with pytest.raises(MapValidationError):
        _resolve(origin, bad_id, http)
    assert s.log == []


def test_server_errors_are_discovery_errors_not_not_found(site, http) -> None:
    s, origin = site
    s.put(f"{WK}/maps/t/broken.json", b"oops", status=503)
    with pytest.raises(DiscoveryError) as info:
        _resolve(origin, "t/broken", http)
    assert type(info.value) is DiscoveryError


# -- https only unless allowed (§6.1, §10 item 14) -----------------------------------------


def test_http_origin_needs_allow_http(site, http) -> None:
    s, origin = site
    s.put(f"{WK}/maps/t/plain.json", tiny_map("t/plain"))
    with pytest.raises(DiscoveryInsecureURL):
        resolve_map(origin, "t/plain", client=http)
    assert resolve_map(origin, "t/plain", client=http, allow_http=True).id == "t/plain"


@pytest.fixture(scope="module")
def tls_site(tmp_path_factory) -> Iterator[tuple[Scripted, str, httpx.Client]]:
    if not have_openssl():
        pytest.skip("the openssl CLI is needed to make a test certificate")
    cert, key = self_signed_cert(tmp_path_factory.mktemp("tls"))
    scripted = Scripted()
    with serve(scripted.app, certfile=cert, keyfile=key) as origin, \
            httpx.Client(verify=trust(cert), timeout=10) as client:
        yield scripted, origin, client


def test_https_origin_resolves_without_allow_http(tls_site) -> None:
    s, origin, client = tls_site
    raw = tiny_map("t/tls")
    s.put("/blobs/tls.json", raw)
    s.put(f"{WK}/maps/t/tls.json", json.dumps(
        {"id": "t/tls", "url": f"{origin}/blobs/tls.json", "hash": sha256_hash(raw)}).encode())
    assert resolve_map(origin, "t/tls", client=client).hash == sha256_hash(raw)


def test_https_pointer_to_an_http_target_is_insecure_unless_allowed(tls_site, site) -> None:
    s, origin, client = tls_site
    plain, plain_origin = site
    raw = tiny_map("t/downgrade")
    plain.put("/blobs/downgrade.json", raw)
    s.put(f"{WK}/maps/t/downgrade.json", json.dumps(
        {"id": "t/downgrade", "url": f"{plain_origin}/blobs/downgrade.json",
         "hash": sha256_hash(raw)}).encode())
    with pytest.raises(DiscoveryInsecureURL):
        resolve_map(origin, "t/downgrade", client=client)
    assert resolve_map(origin, "t/downgrade", client=client, allow_http=True).id == "t/downgrade"


def test_untrusted_certificate_is_a_discovery_error(tls_site) -> None:
    _, origin, _ = tls_site
    with httpx.Client(timeout=10) as default_trust, pytest.raises(DiscoveryError):
        resolve_map(origin, "t/tls", client=default_trust)


# -- dictionaries (§4.4) and policies (§5.6) -----------------------------------------------


def test_dict_is_fetched_by_hash_and_verified(site, http) -> None:
    s, origin = site
    raw = b"\x37\xa4\x30\xec" + b"dictionary bytes" * 8
    digest = sha256_hash(raw)
    s.put(f"{WK}/dicts/{digest[7:]}.zstd", raw)
    cache = DiscoveryCache()
    zdict = fetch_dict(origin, digest, allow_http=True, client=http, cache=cache)
    assert zdict.raw == raw and digest in cache.dicts
    s.put(f"{WK}/dicts/{sha256_hash(b'x')[7:]}.zstd", raw)  # served under the wrong address
    with pytest.raises(DiscoveryHashMismatch):
        fetch_dict(origin, sha256_hash(b"x"), allow_http=True, client=http)


def test_dict_missing_everywhere_is_not_found_and_map_url_is_the_fallback(site, http) -> None:
    s, origin = site
    raw = b"another dictionary" * 4
    digest = sha256_hash(raw)
    with pytest.raises(DiscoveryNotFound):
        fetch_dict(origin, digest, allow_http=True, client=http)
    s.put("/cdn/dict.zstd", raw)
    zdict = fetch_dict(origin, digest, url="/cdn/dict.zstd", allow_http=True, client=http)
    assert zdict.hash == digest


def test_policy_inline_and_canonical_flag(site, http) -> None:
    s, origin = site
    example = (CODEC_FIXTURES / "spec" / "examples" / "example-safety-policy.json").read_bytes()
    policy_id = json.loads(example)["id"]
    s.put(f"{WK}/policies/{policy_id}.json", example)
    pol = resolve_policy(origin, policy_id, allow_http=True, client=http)
    assert pol.id == policy_id and not pol.canonical  # the upstream file is not canonical
    canon = canonicalise(example)
    s.put(f"{WK}/policies/sha256/{sha256_hash(canon)[7:]}.json", canon)
    pinned = resolve_policy(origin, policy_id, expected_hash=sha256_hash(canon),
                            allow_http=True, client=http)
    assert pinned.canonical and pinned.hash == sha256_hash(canon)


def test_async_twins_share_the_rules(site) -> None:
    s, origin = site
    raw = tiny_map("t/async")
    s.put(f"{WK}/maps/t/async.json", raw)
    dict_raw = b"async dictionary" * 4
    s.put(f"{WK}/dicts/{sha256_hash(dict_raw)[7:]}.zstd", dict_raw)

    async def go() -> None:
        async with httpx.AsyncClient(timeout=10) as client:
            tmap = await aresolve_map(origin, "t/async", allow_http=True, client=client)
            assert tmap.hash == sha256_hash(raw)
            with pytest.raises(DiscoveryInsecureURL):
                await aresolve_map(origin, "t/async", client=client)
            with pytest.raises(DiscoveryNotFound):
                await aresolve_map(origin, "t/async-absent", allow_http=True, client=client)
            zdict = await afetch_dict(origin, sha256_hash(dict_raw), allow_http=True,
                                      client=client)
            assert zdict.raw == dict_raw

    asyncio.run(go())


def test_discovery_resolves_against_our_own_wellknown_routes(http) -> None:
    from tests.conftest import fixture_map_path
    from tokenwire.codec.maps import load_map_file
    from tokenwire.gateway.http.wellknown import DiscoveryState, wellknown_routes

    tmap = load_map_file(fixture_map_path("anthropic/claude-3-text"))
    app = Starlette(routes=wellknown_routes(DiscoveryState(maps=(tmap,))))
    with serve(app) as origin:
        got = resolve_map(origin, tmap.id, allow_http=True, client=http)
        assert got.hash == tmap.hash
        pinned = resolve_map(origin, tmap.id, expected_hash=tmap.hash, allow_http=True,
                             client=http)
        assert pinned.raw == tmap.raw



