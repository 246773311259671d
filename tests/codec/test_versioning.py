"""Version signalling (codec-spec §5.1-§5.4): parsing, header floors, enable/enforce, the 426."""

from __future__ import annotations

import json

import httpx
import pytest
from codecai.version_signaling import parse_version_policy_document
from codecai.version_signaling import parse_version_required as codecai_parse_426

from tests.conftest import CODEC_FIXTURES
from tokenwire.codec.versioning import (
    HEADER_FLOORS,
    VARY,
    VersionPolicy,
    VersionPolicyMode,
    filter_headers,
    header_allowed,
    needs_upgrade,
    parse_version,
    parse_version_required,
    upgrade_required_response,
    version_policy_document,
)
from tokenwire.errors import CodecVersionRequired, ConfigError, RemoteProtocolError

DERIVED = json.loads((CODEC_FIXTURES / "derived" / "derived-vectors.json").read_text("utf-8"))


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, (0, 2)),  # absent: engines' default (the spec also says 0.0 elsewhere)
        ("0.4", (0, 4)),
        ("v0.4", (0, 4)),
        ("V0.3", (0, 3)),
        (" 0.5 ", (0, 5)),
        ("0.4.1", (0, 4)),  # patch ignored
        ("0.4-rc1", (0, 4)),
        ("1.2", (1, 2)),
        ("0.10", (0, 10)),
        ("", (0, 0)),  # present but unparsable
        ("abc", (0, 0)),
        ("0", (0, 0)),
        ("0.x", (0, 0)),
        ("vv0.4", (0, 0)),
    ],
)
def test_version_parsing(raw, expected):
    assert parse_version(raw) == expected


def test_header_floors_are_one_lowercase_table():
    assert HEADER_FLOORS["codec-zstd-dict"] == (0, 2)
    assert HEADER_FLOORS["codec-safety-policy-hash"] == (0, 4)
    assert all(k == k.lower() for k in HEADER_FLOORS)


RESPONSE_HEADERS = [
    ("Content-Type", "application/x-msgpack"),
    ("Content-Encoding", "zstd"),
    ("Vary", VARY),
    ("Codec-Zstd-Dict", "sha256:" + "a" * 64),
    ("CODEC-MAP", "sha256:" + "b" * 64),
    ("Codec-Safety-Policy", "acme/strict-v3"),
    ("codec-safety-policy-hash", "sha256:" + "c" * 64),
    ("Codec-Session", "0badcafe"),
    ("Codec-Unregistered", "x"),
]


@pytest.mark.parametrize("version", [(0, 0), (0, 2), (0, 3), (0, 4), (0, 5), (0, 6), (1, 0)])
def test_client_never_receives_a_header_newer_than_its_version(version):
    kept = filter_headers(RESPONSE_HEADERS, version)
    for name, _ in RESPONSE_HEADERS:
        floor = HEADER_FLOORS.get(name.lower())
        assert ((name, dict(RESPONSE_HEADERS)[name]) in kept) == (floor is None or version >= floor)
    assert ("Codec-Unregistered", "x") in kept  # unregistered headers pass
    assert filter_headers(dict(RESPONSE_HEADERS), version) == kept


def test_v03_client_gets_no_v04_header():
    kept = {k.lower() for k, _ in filter_headers(RESPONSE_HEADERS, parse_version("0.3"))}
    assert not kept & {"codec-safety-policy", "codec-safety-policy-hash", "codec-session"}
    assert "codec-map" in kept and not header_allowed("Codec-Min-Version", (0, 3))


ENVS = {
    "off": {},
    "safety-enable": {"CODEC_SAFETY_POLICY": "acme/strict-v3"},
    "safety-enforce": {
        "CODEC_SAFETY_POLICY": "acme/strict-v3",
        "CODEC_SAFETY_POLICY_REQUIRED": "1",
    },
    "version-advisory": {"CODEC_VERSION_POLICY": "advisory"},
    "version-strict": {"CODEC_VERSION_POLICY": "strict"},
}
MANDATORY = {"safety-enforce", "version-strict"}
CLIENTS = [None, "0.2", "0.3", "v0.3", "0.4", "0.4.1", "0.5", "garbage"]


@pytest.mark.parametrize("env_name", list(ENVS))
@pytest.mark.parametrize("client", CLIENTS)
def test_426_only_when_mandatory_and_client_older_than_04(env_name, client):
    policy = VersionPolicy.from_env(ENVS[env_name])
    older = parse_version(client) < (0, 4)
    assert needs_upgrade(policy, parse_version(client)) == (env_name in MANDATORY and older)


@pytest.mark.parametrize("value", ["1", "true", "True", "yes"])
def test_safety_required_truthy_values(value):
    env = {"CODEC_SAFETY_POLICY": "p", "CODEC_SAFETY_POLICY_REQUIRED": value}
    assert VersionPolicy.from_env(env).safety_policy_required


@pytest.mark.parametrize("value", ["0", "false", "no", ""])
def test_safety_required_falsy_values(value):
    env = {"CODEC_SAFETY_POLICY": "p", "CODEC_SAFETY_POLICY_REQUIRED": value}
    assert not VersionPolicy.from_env(env).mandatory


def test_enforce_without_enable_is_a_config_error():
    with pytest.raises(ConfigError):
        VersionPolicy.from_env({"CODEC_SAFETY_POLICY_REQUIRED": "1"})
    with pytest.raises(ConfigError):
        VersionPolicy.from_env({"CODEC_VERSION_POLICY": "mandatory"})


def test_policy_from_env_reads_every_setting():
    p = VersionPolicy.from_env(
        {**ENVS["safety-enforce"], "CODEC_VERSION_POLICY": "Strict", "CODEC_DEPLOYMENT_ID": "d1"}
    )
    assert p.version_policy is VersionPolicyMode.STRICT and p.deployment_id == "d1"
    assert p.required_features == ("safety-policy-enforcement",)
    assert (
        not VersionPolicy().any_enabled
        and VersionPolicy.from_env(ENVS["safety-enable"]).any_enabled
    )


def test_426_bytes_match_the_derived_sglang_vector():
    vector = DERIVED["http_426_body_sglang_style"]
    policy = VersionPolicy.from_env(ENVS["safety-enforce"])
    status, headers, body = upgrade_required_response(policy, "0.3")
    assert status == 426
    assert body == vector["body_text"].encode("utf-8")
    assert headers == list(vector["headers"].items())


def test_426_feature_header_joined_and_omitted_when_empty():
    both = VersionPolicy(
        safety_policy_id="p",
        safety_policy_required=True,
        extra_required_features=("mandatory-classifier",),
    )
    _, headers, _ = upgrade_required_response(both, "0.3")
    assert ("Codec-Required-Features", "safety-policy-enforcement, mandatory-classifier") in headers
    _, headers, body = upgrade_required_response(
        VersionPolicy.from_env(ENVS["version-strict"]), None
    )
    assert [k for k, _ in headers] == ["Codec-Min-Version", "Content-Type"]
    assert json.loads(body)["required_features"] == []
    assert json.loads(body)["client_version"] == "0.2"


def test_426_deployment_id_only_if_configured():
    _, _, body = upgrade_required_response(VersionPolicy.from_env(ENVS["safety-enforce"]), "0.3")
    assert "deployment_id" not in json.loads(body)
    env = {**ENVS["safety-enforce"], "CODEC_DEPLOYMENT_ID": "acme-prod-us-west-2"}
    _, _, body = upgrade_required_response(VersionPolicy.from_env(env), "0.3")
    assert body.endswith(b', "deployment_id": "acme-prod-us-west-2"}')


def test_reference_client_parses_our_426():
    env = {**ENVS["safety-enforce"], "CODEC_DEPLOYMENT_ID": "dep"}
    status, headers, body = upgrade_required_response(VersionPolicy.from_env(env), "v0.3")
    err = codecai_parse_426(httpx.Response(status, headers=headers, content=body))
    assert err is not None
    assert err.body.minimum_version == "0.4" and err.body.deployment_id == "dep"
    assert err.body.required_features == ("safety-policy-enforcement",)


def test_client_parses_426_into_typed_error():
    status, headers, body = upgrade_required_response(
        VersionPolicy.from_env(ENVS["safety-enforce"]), "0.3"
    )
    err = parse_version_required(status, headers, body)
    assert isinstance(err, CodecVersionRequired)
    assert (err.minimum_version, err.required_features, err.client_version) == (
        "0.4",
        ("safety-policy-enforcement",),
        "0.3",
    )
    assert err.docs_url.startswith("https://") and err.deployment_id is None
    assert parse_version_required(200, headers, body) is None


_VALID = {
    "error": "codec_version_required",
    "minimum_version": "0.4",
    "required_features": [],
    "client_version": "0.3",
}
_BAD_BODIES = [
    b"Upgrade Required",
    b"\xff\xfe",
    b"[]",
    *(
        json.dumps({**_VALID, **change}).encode()
        for change in (
            {"error": "other"},
            {"minimum_version": 4},
            {"required_features": "x"},
            {"required_features": [1]},
            {"client_version": None},
        )
    ),
]


@pytest.mark.parametrize("body", _BAD_BODIES)
def test_unrecognised_426_body_raises_never_swallowed(body):
    with pytest.raises(RemoteProtocolError):
        parse_version_required(426, [], body)


def test_version_policy_document_404_when_unrestricted():
    for name in ("off", "safety-enable", "version-advisory"):
        assert version_policy_document(VersionPolicy.from_env(ENVS[name])) == (404, [], b"")


def test_version_policy_document_when_mandatory():
    env = {**ENVS["safety-enforce"], "CODEC_DEPLOYMENT_ID": "dep"}
    status, headers, body = version_policy_document(
        VersionPolicy.from_env(env), valid_until="2027-01-01T00:00:00Z"
    )
    assert status == 200 and ("Access-Control-Allow-Origin", "*") in headers
    doc = parse_version_policy_document(json.loads(body))  # the reference client's parser
    assert doc.minimum_version == "0.4" and doc.deployment_id == "dep"
    assert doc.required_features == ("safety-policy-enforcement",)
