"""``/.well-known/codec/`` serving (codec-spec §6.1-§6.4, §4.4, §5.4, §5.6)."""

from __future__ import annotations

import asyncio
import hashlib
import json

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.testclient import TestClient

from tests.conftest import CODEC_FIXTURES, fixture_map_path
from tokenwire.codec.compression import ZstdDict
from tokenwire.codec.maps import load_map_bytes, load_map_file, sha256_hash
from tokenwire.codec.safety_policy import canonicalise, parse_policy
from tokenwire.codec.versioning import VersionPolicy, VersionPolicyMode
from tokenwire.gateway.http.wellknown import (
    CACHE_CONTROL,
    DiscoveryState,
    PublishedPolicy,
    advertise_dictionaries,
    wellknown_routes,
)

WK = "/.well-known/codec"
MAP = load_map_file(fixture_map_path("anthropic/claude-3-text"))
DICT = ZstdDict.from_bytes(b"\x37\xa4\x30\xec" + bytes(range(256)) * 4)
POLICY = PublishedPolicy.from_descriptor(parse_policy(
    (CODEC_FIXTURES / "spec" / "examples" / "example-safety-policy.json").read_bytes()))


def client(**state: object) -> TestClient:
    defaults: dict[str, object] = {"maps": (MAP,), "dicts": {"msgpack": DICT},
                                   "policies": (POLICY,)}
    defaults.update(state)
    return TestClient(Starlette(routes=wellknown_routes(DiscoveryState(**defaults))))


def assert_discovery_headers(resp: httpx.Response, content_type: str = "application/json"):
    assert resp.headers["content-type"].split(";")[0] == content_type
    assert resp.headers["access-control-allow-origin"] == "*"
    assert resp.headers["cache-control"] == CACHE_CONTROL


def test_map_by_id_keeps_its_slash_and_serves_the_exact_loaded_bytes() -> None:
    resp = client().get(f"{WK}/maps/anthropic/claude-3-text.json")
    assert resp.status_code == 200
    assert resp.content == MAP.raw and sha256_hash(resp.content) == MAP.hash
    assert_discovery_headers(resp)


def test_map_content_addressed_sibling_hashes_to_its_path() -> None:
    resp = client().get(f"{WK}/maps/sha256/{MAP.hash[7:]}.json")
    assert resp.status_code == 200
    assert hashlib.sha256(resp.content).hexdigest() == MAP.hash[7:]
    assert_discovery_headers(resp)
    assert resp.headers["etag"] == f'"{MAP.hash[7:]}"'


def test_content_addressed_documents_answer_if_none_match_with_304() -> None:
    resp = client().get(f"{WK}/maps/sha256/{MAP.hash[7:]}.json",
                        headers={"If-None-Match": f'"{MAP.hash[7:]}"'})
    assert resp.status_code == 304 and resp.content == b""


def test_dict_is_served_raw_by_content_address_only() -> None:
    c = client()
    resp = c.get(f"{WK}/dicts/{DICT.hash[7:]}.zstd")
    assert resp.status_code == 200 and resp.content == DICT.raw
    assert_discovery_headers(resp, "application/octet-stream")
    assert c.get(f"{WK}/dicts/msgpack.zstd").status_code == 404  # no mutable id form (§4.4)
    assert c.get(f"{WK}/dicts/{'0' * 64}.zstd").status_code == 404


def test_policy_is_published_as_canonical_bytes_so_fetch_hash_equals_header_hash() -> None:
    c = client()
    by_id = c.get(f"{WK}/policies/{POLICY.id}.json")
    by_hash = c.get(f"{WK}/policies/sha256/{POLICY.hash[7:]}.json")
    assert by_id.content == by_hash.content == POLICY.raw
    assert sha256_hash(by_id.content) == POLICY.hash
    assert canonicalise(by_id.content) == by_id.content  # §10 item 15
    assert_discovery_headers(by_id)


def test_version_policy_is_404_when_nothing_is_mandatory() -> None:
    assert client().get(f"{WK}/version-policy.json").status_code == 404
    advisory = VersionPolicy(version_policy=VersionPolicyMode.ADVISORY)
    assert client(version_policy=advisory).get(f"{WK}/version-policy.json").status_code == 404


def test_version_policy_is_published_when_something_is_mandatory() -> None:
    strict = VersionPolicy(safety_policy_id="acme/strict-v3", safety_policy_required=True,
                           deployment_id="test-dep")
    resp = client(version_policy=strict).get(f"{WK}/version-policy.json")
    assert resp.status_code == 200
    doc = resp.json()
    assert doc["minimum_version"] == "0.4"
    assert doc["required_features"] == ["safety-policy-enforcement"]
    assert doc["deployment_id"] == "test-dep"
    assert_discovery_headers(resp)


def test_index_lists_maps_with_absolute_content_addressed_urls() -> None:
    resp = client().get(f"{WK}/index.json")
    assert resp.status_code == 200
    assert_discovery_headers(resp)
    doc = resp.json()
    assert doc["codec_version"] == "0.5"
    [entry] = doc["maps"]
    assert entry["id"] == MAP.id and entry["hash"] == MAP.hash
    assert entry["url"] == f"http://testserver{WK}/maps/sha256/{MAP.hash[7:]}.json"
    assert doc["dicts"][0]["hash"] == DICT.hash and doc["dicts"][0]["format"] == "msgpack"
    assert doc["policies"][0]["hash"] == POLICY.hash


@pytest.mark.parametrize("path", [
    "maps/../maps/anthropic/claude-3-text.json", "maps/%2e%2e/etc/passwd.json",
    "maps/Anthropic/Claude-3-text.json", "maps/anthropic/claude-3-text/.json",
    "maps/anthropic/claude-3-text", "maps/sha256/XYZ.json", "maps/.json",
    "policies/../../etc.json", "dicts/../../etc/passwd", "dicts/" + "0" * 63 + ".zstd",
])
def test_bad_ids_and_paths_are_404_never_traversal(path: str) -> None:
    # Sent as a raw ASGI path: an HTTP client would normalise the dots away first.
    assert raw_get(f"{WK}/{path}") == 404


def raw_get(path: str) -> int:
    app = Starlette(routes=wellknown_routes(DiscoveryState(maps=(MAP,), dicts={"msgpack": DICT},
                                                           policies=(POLICY,))))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
             "root_path": "", "query_string": b"", "headers": [(b"host", b"testserver")],
             "server": ("testserver", 80), "client": ("127.0.0.1", 1)}
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent[0]["status"]


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet="abcz09./-_%A~\\", min_size=0, max_size=40))
def test_arbitrary_map_paths_serve_only_known_documents(tail: str) -> None:
    resp = _FUZZ_CLIENT.get(f"{WK}/maps/{tail}.json")
    assert resp.status_code in (200, 404)
    if resp.status_code == 200:
        assert resp.content == MAP.raw


_FUZZ_CLIENT = client()


def test_unknown_map_id_is_404_with_cors() -> None:
    resp = client().get(f"{WK}/maps/nobody/nothing.json")
    assert resp.status_code == 404
    assert resp.headers["access-control-allow-origin"] == "*"


@pytest.mark.parametrize("path", ["maps/{}.json", "policies/{}.json", "{}"])
def test_a_404_never_repeats_a_huge_id_whole(path: str) -> None:
    # A 10,000-character id came back whole in the 404's message: now its start, cut.
    huge = "a" * 10_000
    resp = client().get(f"{WK}/{path.format(huge)}")
    assert resp.status_code == 404
    message = resp.json()["error"]["message"]
    assert len(message) < 200 and "a" * 100 in message
    assert message.endswith(" characters)") and "... (10," in message
    short = client().get(f"{WK}/maps/nobody/nothing.json").json()["error"]["message"]
    assert short == "no map nobody/nothing"  # a short id is still named whole


# -- advertising dictionaries in the map (§3.7) --------------------------------------------


def test_advertised_map_lists_each_dict_and_is_a_new_map() -> None:
    adv = advertise_dictionaries(MAP, {"msgpack": DICT}, base_url="https://codec.example")
    assert adv.hash != MAP.hash and adv.id == MAP.id and adv.vocab == MAP.vocab
    [entry] = adv.zstd_dictionaries
    assert entry == {"format": "msgpack", "hash": DICT.hash, "size_bytes": len(DICT.raw),
                     "url": f"https://codec.example{WK}/dicts/{DICT.hash[7:]}.zstd"}
    # Spliced in before the closing brace: the original document is a prefix of the new one.
    assert adv.raw.startswith(MAP.raw.rstrip()[:-1].rstrip())


def test_advertising_replaces_entries_of_the_same_format_and_keeps_others() -> None:
    other = ZstdDict.from_bytes(b"protobuf dictionary" * 8)
    first = advertise_dictionaries(MAP, {"msgpack": DICT, "protobuf": other})
    newer = ZstdDict.from_bytes(b"newer msgpack dictionary" * 8)
    second = advertise_dictionaries(first, {"msgpack": newer})
    hashes = {e["format"]: e["hash"] for e in second.zstd_dictionaries}
    assert hashes == {"msgpack": newer.hash, "protobuf": other.hash}
    assert all(e["url"].startswith(f"{WK}/dicts/") for e in second.zstd_dictionaries)
    load_map_bytes(second.raw)  # still a valid map


def test_served_advertised_map_and_original_both_resolve() -> None:
    adv = advertise_dictionaries(MAP, {"msgpack": DICT})
    c = client(maps=(adv, MAP))
    assert c.get(f"{WK}/maps/{MAP.id}.json").content == adv.raw
    assert c.get(f"{WK}/maps/sha256/{MAP.hash[7:]}.json").content == MAP.raw
    assert c.get(f"{WK}/maps/sha256/{adv.hash[7:]}.json").content == adv.raw
    index = json.loads(c.get(f"{WK}/index.json").content)
    assert [m["hash"] for m in index["maps"]] == [adv.hash]


def test_index_urls_use_the_public_url_when_one_is_configured_never_the_host_header() -> None:
    # Any client may send any Host, and the index is public and cacheable (§6.4): with
    # --public-url set, a request with "Host: evil.example" got URLs on evil.example.
    resp = client(public_base_url="https://codec.example/").get(
        f"{WK}/index.json", headers={"host": "evil.example"})
    doc = resp.json()
    assert doc["maps"][0]["url"] == f"https://codec.example{WK}/maps/sha256/{MAP.hash[7:]}.json"
    assert doc["policies"][0]["url"].startswith(f"https://codec.example{WK}/policies/sha256/")
    assert doc["dicts"][0]["url"] == f"https://codec.example{WK}/dicts/{DICT.hash[7:]}.zstd"


def test_the_served_index_follows_the_public_url_setting(serve) -> None:
    from tokenwire.gateway.ir import Finish, FinishKind

    from .conftest import ScriptedUpstream

    served = serve(ScriptedUpstream([(0.0, Finish(reason=FinishKind.EOS))]),
                   public_base_url="https://codec.example")
    doc = httpx.get(served.url + f"{WK}/index.json", headers={"host": "evil.example"}).json()
    assert doc["maps"][0]["url"].startswith(f"https://codec.example{WK}/maps/sha256/")
