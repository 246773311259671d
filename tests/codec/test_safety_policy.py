"""Safety-policy descriptors (codec-spec §5.5): validation, canonical bytes and hash (§3.2)."""

from __future__ import annotations

import copy
import hashlib
import json
import random

import pytest
from codecai.safety_policy import descriptor_canonical_bytes, descriptor_from_json
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import CODEC_FIXTURES
from tokenwire.codec.safety_policy import (
    ACTIONS,
    BannedTokenPolicy,
    canonical_bytes,
    canonicalise,
    hash_policy,
    parse_policy,
)
from tokenwire.errors import PolicyValidationError

EXAMPLE_RAW = (CODEC_FIXTURES / "spec" / "examples" / "example-safety-policy.json").read_bytes()
HASHES = json.loads((CODEC_FIXTURES / "derived" / "derived-vectors.json").read_text("utf-8"))[
    "hashes"
]


def example() -> dict:
    return json.loads(EXAMPLE_RAW)


def test_example_canonical_hash_and_length():
    desc = parse_policy(EXAMPLE_RAW)
    assert hash_policy(desc) == HASHES["example_safety_policy_canonical_sha256_python_reference"]
    assert len(canonical_bytes(desc)) == HASHES["example_safety_policy_canonical_bytes_len"] == 1762


def test_example_raw_bytes_hash_differently():
    # §9.1 item 14: discovery verifies raw bytes, READY carries the canonical hash.
    raw = "sha256:" + hashlib.sha256(EXAMPLE_RAW).hexdigest()
    assert raw == HASHES["example_safety_policy_raw_file_sha256"]
    assert canonicalise(EXAMPLE_RAW) != EXAMPLE_RAW


def test_canonical_bytes_are_a_fixed_point():
    canon = canonicalise(EXAMPLE_RAW)
    assert canonicalise(canon) == canon
    assert canon.endswith(b"}\n") and not canon.endswith(b"\n\n")


def test_canonical_form_ignores_input_key_order_and_nulls():
    doc = example()
    shuffled = dict(random.Random(7).sample(list(doc.items()), len(doc)))
    shuffled["classifier"] = dict(reversed(list(doc["classifier"].items())))
    shuffled["publisher"] = {**doc["publisher"], "contact": None}
    expected = copy.deepcopy(doc)
    del expected["publisher"]["contact"]
    assert canonicalise(shuffled) == canonicalise(expected)


def test_canonical_form_keeps_non_ascii_raw():
    doc = example()
    doc["publisher"]["name"] = "Acmé Sécurité 安全"
    canon = canonicalise(doc)
    assert "Acmé Sécurité 安全".encode() in canon and b"\\u" not in canon


def test_reference_client_computes_the_same_bytes():
    assert descriptor_canonical_bytes(descriptor_from_json(example())) == canonicalise(EXAMPLE_RAW)


_name = st.from_regex(r"[a-z0-9_-]{1,12}", fullmatch=True)
_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)


@st.composite
def descriptors(draw) -> dict:
    doc: dict = {
        "id": draw(st.from_regex(r"[a-z]{1,8}/[a-z0-9-]{1,10}", fullmatch=True)),
        "version": "1",
        "tokenizers": draw(st.lists(_text, min_size=1, max_size=3)),
        "categories": [
            {"name": n, "action": a, **({"description": d} if d is not None else {})}
            for n, a, d in draw(
                st.lists(
                    st.tuples(_name, st.sampled_from(ACTIONS), st.none() | _text),
                    min_size=1,
                    max_size=4,
                )
            )
        ],
        "classifier": {"family": draw(_text.filter(bool))},
    }
    if draw(st.booleans()):
        doc["classifier"]["host"] = draw(st.sampled_from(["server", "client", "both"]))
    if draw(st.booleans()):
        doc["rules_summary"] = {"banned_token_id_count": draw(st.integers(0, 10**6))}
    if draw(st.booleans()):
        doc["client_hooks"] = {"prefilter_categories": [c["name"] for c in doc["categories"]]}
    if draw(st.booleans()):
        doc["category_registry"] = draw(_text)
    return doc


@settings(max_examples=150, deadline=None)
@given(doc=descriptors())
def test_canonicalise_parse_round_trip_and_matches_reference(doc):
    canon = canonicalise(doc)
    assert canonicalise(canon) == canon
    assert canonicalise(json.dumps(doc, ensure_ascii=True).encode()) == canon
    assert descriptor_canonical_bytes(descriptor_from_json(doc)) == canon


def _set(path: str, value):
    def mutate(doc: dict) -> None:
        *parents, last = path.split(".")
        target = doc
        for p in parents:
            target = target[int(p)] if p.isdigit() else target[p]
        if value is _DELETE:
            del target[int(last) if last.isdigit() else last]
        else:
            target[int(last) if last.isdigit() else last] = value

    return mutate


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("id", _DELETE, "id"),
        ("id", 3, "id"),
        ("id", "", "id"),
        ("version", "2", "version"),
        ("tokenizers", [], "tokenizers"),
        ("tokenizers", ["ok", 1], "tokenizers[1]"),
        ("categories", [], "categories"),
        ("categories.0.action", "delete", "categories[0].action"),
        ("categories.1.name", "PII", "categories[1].name"),
        ("categories.0.extra", 1, "categories[0].extra"),
        ("categories.0.name", _DELETE, "categories[0].name"),
        ("classifier.family", _DELETE, "classifier.family"),
        ("classifier.family", "", "classifier.family"),
        ("classifier.host", "edge", "classifier.host"),
        ("classifier.requires_engine_features", ["gpu"], "classifier.requires_engine_features[0]"),
        ("rules_summary.regex_pattern_count", -1, "rules_summary.regex_pattern_count"),
        ("rules_summary.regex_pattern_count", True, "rules_summary.regex_pattern_count"),
        ("rules_summary.banned_ids", [1, 2], "rules_summary.banned_ids"),
        ("client_hooks.prefilter_categories", "pii", "client_hooks.prefilter_categories"),
        ("published_at", "yesterday", "published_at"),
        ("published_at", "2026-05-09", "published_at"),
        ("publisher.url", "not a uri", "publisher.url"),
        ("thresholds", {"pii": 0.5}, "thresholds"),
    ],
)
def test_validation_errors_name_the_field(path, value, field):
    doc = example()
    _set(path, value)(doc)
    with pytest.raises(PolicyValidationError) as info:
        parse_policy(doc)
    assert info.value.field == field


def test_non_object_and_non_json_are_rejected():
    with pytest.raises(PolicyValidationError):
        parse_policy(b"[1, 2]")
    with pytest.raises(PolicyValidationError):
        parse_policy(b"{not json")


def test_policy_binds_tokenizers():
    desc = parse_policy(EXAMPLE_RAW)
    assert desc.allows_tokenizer("meta-llama/llama-3")
    assert not desc.allows_tokenizer("qwen/qwen2")


@pytest.mark.parametrize(
    ("ids", "expected"),
    [([], None), ([1, 2, 3], None), ([1, 666, 3], 1), ([666], 0), ([5, 4, 777, 666], 2)],
)
def test_banned_token_policy_finds_first_banned_id(ids, expected):
    policy = BannedTokenPolicy("acme/strict-v3", [666, 777])
    assert policy.check(ids) == expected


def test_banned_token_policy_publishes_only_a_count():
    policy = BannedTokenPolicy("p", range(10))
    assert policy.summary().banned_token_id_count == 10
    assert BannedTokenPolicy("p", []).check([1, 2]) is None
