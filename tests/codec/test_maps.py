"""Tokenizer maps: content addressing, hash strings, validation, aliases, cache (codec-spec 3)."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import httpx
import msgspec
import pytest

from tests.conftest import MAPS, fixture_map_path
from tokenwire.codec.maps import (
    KNOWN_PREPEND_SCHEMES,
    MAX_TOKEN_ID,
    MapCache,
    load_map_bytes,
    load_map_file,
    parse_hash,
    resolve_alias,
    sha256_hash,
    validate_map_id,
)
from tokenwire.errors import HashFormatError, MapHashMismatch, MapNotFound, MapValidationError

# sha256 of each copied file, as listed in tests/fixtures/maps/README.md.
FIXTURE_HASHES = {
    "huggingfacetb/smollm2": "8bb91e72d05775a013139783577dbc9f4930a2db19704fc90f2ca17c7bef9f60",
    "openai/cl100k_base": "6b78c1733c1eee157b2eced71d6d5ccc47e3e9454f9d8d62a90bd482493a9a80",
    "openai/r50k_base": "bbbb06e4f44c0317b3282ec98fb07991694ba3d4e82b88d7e77fb44b9209ff32",
    "microsoft/phi-3": "2c2449955329eb87d513c3a86acef9eb70f4a5abb09c983564450ae8ab478336",
    "tiiuae/falcon": "29831a3d6c40834686db1915f1345909369a062b74310a88b8fd9c191f3c8f82",
    "anthropic/claude-3-text": "5fa4892803d536f057912a0c6f296302933559185ca2ee2bae668bb1be795ec7",
}

MINIMAL = {"id": "test/tiny", "version": "2", "vocab_size": 2, "vocab": {"a": 0, "b": 1}}


def _doc(**changes: object) -> bytes:
    doc = dict(MINIMAL)
    for key, value in changes.items():
        if value is None:
            doc.pop(key, None)
        else:
            doc[key] = value
    return json.dumps(doc).encode()


@pytest.mark.parametrize("map_id", sorted(FIXTURE_HASHES))
def test_map_hash_is_sha256_of_raw_bytes(map_id: str) -> None:
    tmap = load_map_file(fixture_map_path(map_id))
    assert tmap.hash == "sha256:" + FIXTURE_HASHES[map_id]
    assert tmap.id == map_id


def test_one_added_byte_is_a_different_map() -> None:
    raw = fixture_map_path("anthropic/claude-3-text").read_bytes()
    assert load_map_bytes(raw + b"\n").hash != load_map_bytes(raw).hash


@pytest.mark.parametrize(
    "text",
    [
        "sha256:" + "ab" * 32,
        "ab" * 32,
        "AB" * 32,
        "sha256:" + "AB" * 32,
        "SHA256:" + "ab" * 32,
        "  sha256:" + "ab" * 32 + " ",
    ],
)
def test_hash_strings_accept_bare_and_uppercase_hex(text: str) -> None:
    assert parse_hash(text) == "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    "text, needle",
    [
        ("md5:" + "ab" * 16, "algorithm"),
        ("sha512:" + "ab" * 32, "algorithm"),
        ("sha256:" + "ab" * 31, "sha256"),
        ("sha256:" + "zz" * 32, "sha256"),
        ("", "sha256"),
    ],
)
def test_hash_strings_reject_other_shapes(text: str, needle: str) -> None:
    with pytest.raises(HashFormatError, match=needle):
        parse_hash(text)


def test_pinned_hash_mismatch_is_refused_before_parsing() -> None:
    with pytest.raises(MapHashMismatch) as info:
        load_map_bytes(b"not even json", expected_hash="sha256:" + "00" * 32)
    assert info.value.actual == sha256_hash(b"not even json")


def test_pinned_hash_accepts_any_spelling() -> None:
    raw = _doc()
    assert load_map_bytes(raw, expected_hash=sha256_hash(raw)[7:].upper()).id == "test/tiny"


@pytest.mark.parametrize(
    "raw, field",
    [
        (b"[]", "<document>"),
        (b"{", "<document>"),
        (_doc(id=None), "id"),
        (_doc(id="Upper/Case"), "id"),
        (_doc(id="a/../b"), "id"),
        (_doc(id="/lead"), "id"),
        (_doc(id="trail/"), "id"),
        (_doc(vocab_size=0), "vocab_size"),
        (_doc(vocab_size=True), "vocab_size"),
        (_doc(vocab=None), "vocab"),
        (_doc(vocab={"a": -1}), "vocab['a']"),
        (_doc(encoder="wordpiece"), "encoder"),
        (_doc(merges="a b"), "merges"),
        (_doc(encoder="byte_level"), "pre_tokenizer_program"),
        (_doc(pre_tokenizer_program={"ops": []}), "pre_tokenizer_program"),
        (_doc(byte_fallback_start=3), "byte_fallback_start"),
        (_doc(byte_fallback_start=3, byte_fallback_end=200), "byte_fallback_end"),
        (_doc(special_tokens={"<s>": "1"}), "special_tokens"),
        (_doc(tool_calling={"markers": {"start": "<a>", "end": "<b>"}}),
         "tool_calling.markers.start"),
        (_doc(zstd_dictionaries=[{"format": "msgpack", "url": "x", "hash": "no"}]),
         "zstd_dictionaries[0].hash"),
        (_doc(metaspace_prepend_scheme="sometimes"), "metaspace_prepend_scheme"),
        # A peer's map: nesting past the recursion limit, ids that would size huge tables.
        (b'{"id": "a/b", "x": ' + b"[" * 100_000, "<document>"),
        (b'{"id": "a/b", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "<document>"),
        (_doc(vocab={"a": 0, "b": MAX_TOKEN_ID + 1}), "vocab"),
        (_doc(special_tokens={"<s>": MAX_TOKEN_ID + 1}), "special_tokens"),
        (_doc(vocab=None, tokens={str(MAX_TOKEN_ID + 1): "a"}), "vocab"),
    ],
)
def test_validation_errors_name_the_field(raw: bytes, field: str) -> None:
    with pytest.raises(MapValidationError) as info:
        load_map_bytes(raw)
    assert info.value.field == field


def test_unknown_keys_are_tolerated_and_kept() -> None:
    tmap = load_map_file(fixture_map_path("anthropic/claude-3-text"))
    assert tmap.extra["_synthetic"] is True
    assert tmap.encoder == "identity"


def test_legacy_tokens_field_is_read_as_vocab() -> None:
    tmap = load_map_bytes(_doc(vocab=None, tokens={"0": "a", "1": "b"}))
    assert tmap.vocab == {"a": 0, "b": 1}


def test_vocab_size_counts_entries_not_max_id() -> None:
    tmap = load_map_file(fixture_map_path("openai/cl100k_base"))
    assert tmap.vocab_size == 100261 and tmap.max_id == 100276


def test_prepend_scheme_comes_from_known_families_or_the_map() -> None:
    assert load_map_file(fixture_map_path("microsoft/phi-3")).metaspace_prepend_scheme == "always"
    assert KNOWN_PREPEND_SCHEMES["mistralai/mistral-v3"] == "first"
    tmap = load_map_bytes(_doc(metaspace_prepend_scheme="first"))
    assert tmap.metaspace_prepend_scheme == "first"


@pytest.mark.parametrize("bad", ["", "a/../b", "/x", "x/", "X/y", "a b", "a\\b"])
def test_map_ids_are_checked_before_building_urls(bad: str) -> None:
    with pytest.raises(MapValidationError):
        validate_map_id(bad)


def test_aliases_map_hugging_face_ids_to_map_ids() -> None:
    assert resolve_alias("Qwen/Qwen2.5-7B") == "qwen/qwen2"
    assert resolve_alias("qwen/qwen2.5-7b") == "qwen/qwen2"
    assert resolve_alias("huggingfacetb/smollm2") == "huggingfacetb/smollm2"
    with pytest.raises(MapNotFound):
        resolve_alias("NoSuchModel")


def test_bundled_aliases_are_the_codec_maps_file_plus_our_extras() -> None:
    from tokenwire.codec.maps import EXTRA_ALIASES, aliases

    upstream = json.loads((MAPS / "aliases.json").read_text("utf-8"))
    expected = {k: v for k, v in upstream.items() if not k.startswith("_")}
    assert aliases() == {**EXTRA_ALIASES, **expected}
    assert resolve_alias("HuggingFaceTB/SmolLM2-135M-Instruct") == "huggingfacetb/smollm2"


def test_cache_is_keyed_by_hash_and_bounded() -> None:
    cache = MapCache(max_entries=2)
    maps = [load_map_bytes(_doc(id=f"test/m{i}")) for i in range(3)]
    for tmap in maps:
        cache.put(tmap)
    assert len(cache) == 2 and maps[0].hash not in cache
    assert cache.get(maps[2].hash.upper().replace("SHA256", "sha256")) is maps[2]
    raw = _doc(id="test/m2")
    assert cache.load_bytes(raw, expected_hash=sha256_hash(raw)) is maps[2]


@pytest.mark.parametrize("map_id", sorted(FIXTURE_HASHES))
def test_hash_equals_codecai(map_id: str) -> None:
    """codecai's load_map verifies sha256 over the raw body: our hash must satisfy it."""
    from codecai.map_loader import load_map

    raw = fixture_map_path(map_id).read_bytes()
    ours = load_map_bytes(raw).hash

    async def fetch() -> object:
        transport = httpx.MockTransport(lambda request: httpx.Response(200, content=raw))
        async with httpx.AsyncClient(transport=transport) as client:
            return await load_map(url="https://maps.test/m.json", hash=ours, client=client)

    loaded = asyncio.run(fetch())
    assert loaded.id == map_id


# --- the typed decode (issue 15, map load-to-ready) --------------------------------------
# load_map_bytes decodes the usual document with a typed msgspec decoder, which checks the
# vocab ids and merge lines while parsing, and falls back to the untyped decode and the
# Python checks for anything else. These documents (hostile ones included) must give what
# the untyped path alone gives: the same map, field for field and type for type, or an
# error naming the same field.


def _untyped_reference(raw: bytes) -> object:
    from tokenwire.codec import maps

    try:
        doc = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return ("error", "<document>")
    if not isinstance(doc, dict):
        return ("error", "<document>")
    try:
        return _fields(maps._from_document(doc, raw, sha256_hash(raw)))
    except MapValidationError as exc:
        return ("error", exc.field)


def _loaded(raw: bytes) -> object:
    try:
        return _fields(load_map_bytes(raw))
    except MapValidationError as exc:
        return ("error", exc.field)


def _fields(tmap: object) -> dict[str, bytes]:
    # JSON keeps 1, 1.0 and true apart, and dict order.
    return {f.name: msgspec.json.encode(getattr(tmap, f.name)) for f in dataclasses.fields(tmap)
            if f.name not in ("raw", "_derived")}  # fmt: skip


_TINY = b'{"id":"test/tiny","version":"2","vocab_size":2,'
HOSTILE_DOCS = [
    _doc(),
    _doc(published_at="2026-01-01"),
    _doc(note="an unknown key"),
    _doc(vocab={"a": True}),
    _doc(vocab={"a": 1.0}),
    _doc(vocab={"a": -1}),
    _doc(vocab={"a": "1"}),
    _doc(vocab={"a": [1]}),
    _doc(vocab={"a": 2**70}),
    _doc(vocab={"a": 0, "b": 0}),  # a repeated id
    _doc(vocab=[]),
    _doc(vocab={}),
    _doc(merges=["a b"]),
    _doc(merges=["a b", 1]),
    _doc(merges=[None]),
    _doc(merges={}),  # falsy: read as no merges, on both paths
    _doc(merges="a b"),
    _doc(merges=[]),
    _doc(encoder="byte_level", pre_tokenizer_pattern=r"\w+", merges=["a b"]),
    _doc(vocab=None, tokens={"0": "a", "1": "b"}),
    _TINY + b'"vocab":{"a":1e2}}',
    _TINY + b'"vocab":{"a":0,"a":-1}}',  # a repeated key: the last value counts
    _TINY + b'"vocab":{"a":-1,"a":0}}',
    _TINY + b'"vocab":{"a":0},"vocab":{"a":true}}',
    _TINY + b'"vocab":{"a":true},"vocab":{"a":0}}',
    _TINY + b'"vocab":{"a":0},"merges":["a b"],"merges":[1]}',
    _TINY + b'"vocab":{"a":0},"merges":[1],"merges":["a b"]}',
    _TINY + b'"vocab":{"a":0},"merges":null}',
    _TINY + b'"vocab":{"a":0}} trailing',
    _TINY + b'"vocab":{"\\u0120":0,"\\ud800":1}}',  # escapes, a lone surrogate
    _TINY + b'"vocab":{"\xff":0}}',  # not UTF-8
    b"\xef\xbb\xbf" + _doc(),
    b"[]",
    b'"a map"',
    b"{",
    b"",
]


@pytest.mark.parametrize("raw", HOSTILE_DOCS)
def test_typed_decode_equals_untyped_decode(raw: bytes) -> None:
    assert _loaded(raw) == _untyped_reference(raw)


@pytest.mark.parametrize("map_id", sorted(FIXTURE_HASHES))
def test_fixture_maps_take_the_typed_decode_and_equal_the_untyped(map_id: str) -> None:
    from tokenwire.codec import maps

    raw = fixture_map_path(map_id).read_bytes()
    if map_id != "anthropic/claude-3-text":  # its `_note` and `_synthetic` are unknown keys
        assert maps._decode_checked(raw) is not None
    assert _loaded(raw) == _untyped_reference(raw)


def test_max_id_is_computed_once_and_counts_specials() -> None:
    tmap = load_map_bytes(_doc(special_tokens={"<s>": 7}))
    assert tmap.max_id == 7 and tmap._derived["max_id"] == 7
    assert load_map_bytes(_doc(vocab={})).max_id == -1


def test_keys_by_id_keeps_the_last_key_of_an_id_and_marks_holes() -> None:
    # Issue 15 fills the list with a plain loop: the same table as the map(__setitem__) pass.
    tmap = load_map_bytes(_doc(vocab={"a": 0, "b": 2, "c": 2, "d": 4}, vocab_size=4))
    assert tmap.keys_by_id() == ["a", None, "c", None, "d"]
    assert tmap.keys_by_id() is tmap._derived["keys_by_id"]  # computed once
    assert load_map_bytes(_doc(vocab={"a": 0, "z": 10**6})).keys_by_id() is None  # too sparse
