"""Version signalling: client versions, header floors, the 426 dance (codec-spec §5.1-§5.4).

Sans-IO: responses are returned as ``(status, headers, body_bytes)`` for the server layer to
send, and the client parses a received 426 from the same three values.

The absent-header default is a documented conflict (§5.1, §9.1 item 10): the engines and the
v0.4 graceful-downgrade text treat a client without ``Codec-Client-Version`` as ``"0.2"``,
two other v0.4 passages say ``"0.0"``. We follow the engines (``"0.2"``). Both give the same
wire: no header has a floor below 0.2 and 426 triggers on "< 0.4" either way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from tokenwire import peer_json
from tokenwire.errors import CodecVersionRequired, ConfigError, RemoteProtocolError

__all__ = [
    "CLIENT_VERSION_HEADER",
    "DEFAULT_CLIENT_VERSION",
    "DOCS_URL",
    "HEADER_FLOORS",
    "KNOWN_FEATURES",
    "MANDATE_VERSION",
    "MIN_VERSION_HEADER",
    "OWN_VERSION",
    "REQUIRED_FEATURES_HEADER",
    "UNPARSABLE_VERSION",
    "VARY",
    "Version",
    "VersionPolicy",
    "VersionPolicyMode",
    "filter_headers",
    "format_version",
    "header_allowed",
    "needs_upgrade",
    "parse_version",
    "parse_version_required",
    "upgrade_required_response",
    "version_policy_document",
]

Version = tuple[int, int]

#: The protocol version this implementation speaks (§0.1: v0.5 is current).
OWN_VERSION: Version = (0, 5)
#: Treat a client without ``Codec-Client-Version`` as 0.2 (engines; see the module docstring).
DEFAULT_CLIENT_VERSION: Version = (0, 2)
#: What an unparsable version string compares as (§5.1).
UNPARSABLE_VERSION: Version = (0, 0)
#: The minor that introduced safety policy and version signalling, the only mandatable
#: features so far (§5.4).
MANDATE_VERSION: Version = (0, 4)

CLIENT_VERSION_HEADER = "Codec-Client-Version"
MIN_VERSION_HEADER = "Codec-Min-Version"
REQUIRED_FEATURES_HEADER = "Codec-Required-Features"
#: Responses vary by client version too; ``Accept-Encoding`` alone poisons caches (§9.1 item 3).
VARY = "Accept-Encoding, Codec-Client-Version"
DOCS_URL = "https://codecai.net/docs/version-negotiation/"
#: The required-features registry (§5.4), closed per minor; unknown values mean "upgrade".
KNOWN_FEATURES: frozenset[str] = frozenset({"safety-policy-enforcement", "mandatory-classifier"})
#: Longest client-version string echoed back in a 426 body: it is client input.
_MAX_ECHOED_VERSION = 32

#: The one table of response-header floors (§5.3), lower-cased names. A header is sent only
#: to clients that declared at least its floor; unregistered headers pass. ``Codec-Pick``
#: (the picker's reason code, §10 item 9) is ours and new, so it gets the next minor's floor.
HEADER_FLOORS: dict[str, Version] = {
    "codec-tokenizer-map": (0, 2),
    "codec-zstd-dict": (0, 2),
    "codec-latent-map": (0, 3),
    "codec-map": (0, 3),
    "codec-safety-policy": (0, 4),
    "codec-safety-policy-hash": (0, 4),
    "codec-client-version": (0, 4),
    "codec-min-version": (0, 4),
    "codec-required-features": (0, 4),
    "codec-ids-source": (0, 5),  # ours: where a gateway's frame ids come from (engine/...)
    "codec-session": (0, 6),
    "codec-pick": (0, 6),
}

# "0.X", optional leading v, optional patch and pre-release/build suffix (ignored, §5.1).
_VERSION_RE = re.compile(r"^[vV]?(\d{1,6})\.(\d{1,6})(?:\.\d+)?(?:[-+][0-9A-Za-z.+-]*)?$")


def parse_version(value: str | None) -> Version:
    """``Codec-Client-Version`` -> ``(major, minor)`` (§5.1).

    Absent -> ``(0, 2)``; a leading ``v`` and a patch part are tolerated; anything else that
    does not parse (including an empty header) -> ``(0, 0)``.
    """
    if value is None:
        return DEFAULT_CLIENT_VERSION
    m = _VERSION_RE.match(value.strip())
    if m is None:
        return UNPARSABLE_VERSION
    return int(m.group(1)), int(m.group(2))


def format_version(version: Version) -> str:
    return f"{version[0]}.{version[1]}"


def header_allowed(name: str, client_version: Version) -> bool:
    """Whether a response header may go to a client of this version (§5.3)."""
    floor = HEADER_FLOORS.get(name.lower())
    return floor is None or client_version >= floor


def filter_headers(
    headers: Iterable[tuple[str, str]] | Mapping[str, str], client_version: Version
) -> list[tuple[str, str]]:
    """Drop response headers newer than the client's declared version (§5.3).

    Not for 426 responses: their handshake headers go to every client (§5.3). A server must
    not choose zstd for a client below ``Codec-Zstd-Dict``'s floor, since zstd without that
    header is a protocol error (§2.7); check with :func:`header_allowed` first.
    """
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [(k, v) for k, v in items if header_allowed(k, client_version)]


class VersionPolicyMode(StrEnum):
    OFF = "off"
    ADVISORY = "advisory"
    STRICT = "strict"


_TRUTHY = frozenset({"1", "true", "True", "yes"})  # exactly the values §5.2 lists


@dataclass(frozen=True, slots=True)
class VersionPolicy:
    """The two-stage capability switches of a deployment (§5.2), both off by default.

    Safety policy: enabled by ``CODEC_SAFETY_POLICY=<id>``, enforced by
    ``CODEC_SAFETY_POLICY_REQUIRED=1``. Version policy: ``CODEC_VERSION_POLICY=advisory``
    (enable) or ``strict`` (enforce). Enforced features answer older clients with 426.
    """

    safety_policy_id: str | None = None
    safety_policy_required: bool = False
    version_policy: VersionPolicyMode = VersionPolicyMode.OFF
    deployment_id: str | None = None
    docs_url: str = DOCS_URL
    extra_required_features: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.safety_policy_required and not self.safety_policy_id:
            # Enforce without enable is a misconfiguration, not "enforce nothing".
            raise ConfigError("CODEC_SAFETY_POLICY_REQUIRED is set but CODEC_SAFETY_POLICY is not")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> VersionPolicy:
        """Read the ``CODEC_*`` settings from an environment-like mapping."""
        mode_raw = env.get("CODEC_VERSION_POLICY", "").strip().lower() or "off"
        try:
            mode = VersionPolicyMode(mode_raw)
        except ValueError:
            raise ConfigError(
                f"CODEC_VERSION_POLICY={mode_raw!r}: expected advisory, strict or off"
            ) from None
        return cls(
            safety_policy_id=env.get("CODEC_SAFETY_POLICY", "").strip() or None,
            safety_policy_required=env.get("CODEC_SAFETY_POLICY_REQUIRED", "").strip() in _TRUTHY,
            version_policy=mode,
            deployment_id=env.get("CODEC_DEPLOYMENT_ID", "").strip() or None,
        )

    @property
    def any_enabled(self) -> bool:
        return self.safety_policy_id is not None or self.version_policy is not VersionPolicyMode.OFF

    @property
    def mandatory(self) -> bool:
        """Something the deployment cannot silently degrade (§5.4 condition 3)."""
        return self.safety_policy_required or self.version_policy is VersionPolicyMode.STRICT

    @property
    def required_features(self) -> tuple[str, ...]:
        feats = ["safety-policy-enforcement"] if self.safety_policy_required else []
        feats += [f for f in self.extra_required_features if f not in feats]
        return tuple(feats)


def needs_upgrade(policy: VersionPolicy, client_version: Version) -> bool:
    """§5.4: 426 iff something is mandatory and the client declared less than 0.4.

    A deployment with nothing mandatory never answers 426 on version alone.
    """
    return policy.mandatory and client_version < MANDATE_VERSION


def _json(obj: object) -> bytes:
    # The engine fork uses json.dumps defaults (", " and ": " separators, ASCII) (§5.4).
    return json.dumps(obj).encode("utf-8")


def upgrade_required_response(
    policy: VersionPolicy, client_version_header: str | None
) -> tuple[int, list[tuple[str, str]], bytes]:
    """The 426 response, byte-exact with the engine fork (§5.4).

    ``client_version`` in the body echoes what the client sent (or ``"0.2"`` when absent);
    ``Codec-Required-Features`` is omitted when empty; ``deployment_id`` only if configured.
    """
    if client_version_header is None:
        echoed = format_version(DEFAULT_CLIENT_VERSION)
    else:
        echoed = client_version_header.strip()[:_MAX_ECHOED_VERSION]
    minimum = format_version(MANDATE_VERSION)
    body: dict[str, object] = {
        "error": "codec_version_required",
        "minimum_version": minimum,
        "required_features": list(policy.required_features),
        "client_version": echoed,
        "docs_url": policy.docs_url,
    }
    if policy.deployment_id:
        body["deployment_id"] = policy.deployment_id
    headers = [(MIN_VERSION_HEADER, minimum)]
    if policy.required_features:
        headers.append((REQUIRED_FEATURES_HEADER, ", ".join(policy.required_features)))
    headers.append(("Content-Type", "application/json"))
    return 426, headers, _json(body)


def version_policy_document(
    policy: VersionPolicy, *, valid_until: str | None = None
) -> tuple[int, list[tuple[str, str]], bytes]:
    """``GET /.well-known/codec/version-policy.json`` (§5.4 pre-flight, §6.4 headers).

    404 with an empty body when nothing is mandatory (an unrestricted deployment), so the
    document always matches runtime behaviour.
    """
    if not policy.mandatory:
        return 404, [], b""
    doc: dict[str, object] = {
        "minimum_version": format_version(MANDATE_VERSION),
        "required_features": list(policy.required_features),
    }
    if policy.deployment_id:
        doc["deployment_id"] = policy.deployment_id
    doc["docs_url"] = policy.docs_url
    if valid_until:
        doc["valid_until"] = valid_until
    headers = [
        ("Content-Type", "application/json"),
        ("Access-Control-Allow-Origin", "*"),
        ("Cache-Control", "public, max-age=300, stale-while-revalidate=86400"),
    ]
    return 200, headers, _json(doc)


def parse_version_required(
    status: int, headers: Iterable[tuple[str, str]] | Mapping[str, str], body: bytes
) -> CodecVersionRequired | None:
    """Client side of §5.4: a 426 becomes a :class:`CodecVersionRequired` to raise.

    Returns ``None`` for any other status. A 426 whose body is not the recognised shape
    (``error == "codec_version_required"``, string ``minimum_version`` and ``client_version``,
    a list of strings ``required_features``) raises :class:`RemoteProtocolError`: a 426 is
    never swallowed (§2.7).
    """
    if status != 426:
        return None
    try:
        doc = peer_json.loads(body)
    except ValueError as exc:  # UnicodeDecodeError is one
        raise RemoteProtocolError(f"426 with a body that is not JSON: {body[:200]!r}") from exc
    feats = doc.get("required_features") if isinstance(doc, dict) else None
    if not (
        isinstance(doc, dict)
        and doc.get("error") == "codec_version_required"
        and isinstance(doc.get("minimum_version"), str)
        and isinstance(doc.get("client_version"), str)
        and isinstance(feats, list)
        and all(isinstance(f, str) for f in feats)
    ):
        raise RemoteProtocolError(f"426 with an unrecognised body: {body[:200]!r}")
    docs_url = doc.get("docs_url")
    deployment_id = doc.get("deployment_id")
    del headers  # the body is authoritative; Codec-Min-Version repeats minimum_version
    return CodecVersionRequired(
        doc["minimum_version"],
        tuple(feats),
        doc["client_version"],
        docs_url=docs_url if isinstance(docs_url, str) else None,
        deployment_id=deployment_id if isinstance(deployment_id, str) else None,
    )
