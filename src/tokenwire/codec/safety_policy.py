"""Safety-policy descriptors (codec-spec §5.5, §3.2) and a banned-token enforcement object.

A descriptor is validated by hand against ``spec/safety-policy.schema.json`` (draft-07,
``additionalProperties: false`` at every level); each error names the offending field.

Hashing (§3.2, §9.1 item 14): ``Codec-Safety-Policy-Hash`` / READY's hash is sha256 over the
*canonical* bytes (fixed key order, nulls dropped, 2-space indent, raw non-ASCII, one trailing
newline), while discovery verifies sha256 of the *raw fetched* bytes. The two agree only if
the publisher serves exactly the canonical bytes, so :func:`canonical_bytes` is what a server
must publish (§10 item 15). The upstream example file is not canonical (its raw hash differs).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tokenwire import peer_json
from tokenwire.errors import PolicyValidationError

__all__ = [
    "ACTIONS",
    "CLASSIFIER_HOSTS",
    "ENGINE_FEATURES",
    "SCHEMA_VERSION",
    "BannedTokenPolicy",
    "Category",
    "Classifier",
    "ClientHooks",
    "Publisher",
    "RulesSummary",
    "SafetyPolicyDescriptor",
    "canonical_bytes",
    "canonicalise",
    "hash_policy",
    "parse_policy",
]

SCHEMA_VERSION = "1"
ACTIONS = ("stop", "redact", "regenerate", "flag")
CLASSIFIER_HOSTS = ("server", "client", "both")
ENGINE_FEATURES = ("logits_processor", "hidden_states", "sampling_chain")
_CATEGORY_NAME_RE = re.compile(r"^[a-z0-9_-]+$")
_URI_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:\S+$")
_RULE_COUNTS = (
    "banned_token_id_count",
    "regex_pattern_count",
    "grammar_constraint_count",
    "multi_token_pattern_count",
)


@dataclass(frozen=True, slots=True)
class Category:
    name: str
    action: str
    description: str | None = None


@dataclass(frozen=True, slots=True)
class Classifier:
    family: str
    host: str | None = None
    requires_engine_features: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class RulesSummary:
    banned_token_id_count: int | None = None
    regex_pattern_count: int | None = None
    grammar_constraint_count: int | None = None
    multi_token_pattern_count: int | None = None


@dataclass(frozen=True, slots=True)
class ClientHooks:
    prefilter_categories: tuple[str, ...] | None = None
    client_classifier_family: str | None = None


@dataclass(frozen=True, slots=True)
class Publisher:
    name: str | None = None
    url: str | None = None
    contact: str | None = None


@dataclass(frozen=True, slots=True)
class SafetyPolicyDescriptor:
    """A sanitized, publishable policy descriptor. Never carries banned ids or thresholds."""

    id: str
    version: str
    tokenizers: tuple[str, ...]
    categories: tuple[Category, ...]
    classifier: Classifier
    category_registry: str | None = None
    rules_summary: RulesSummary | None = None
    client_hooks: ClientHooks | None = None
    published_at: str | None = None
    publisher: Publisher | None = None

    def allows_tokenizer(self, tokenizer_id: str) -> bool:
        """§5.5: a server must refuse a session whose tokenizer the policy is not bound to."""
        return tokenizer_id in self.tokenizers


# -- Validation ----------------------------------------------------------------------------


def _object(value: Any, where: str, allowed: Iterable[str], required: Iterable[str] = ()) -> dict:
    if not isinstance(value, dict):
        raise PolicyValidationError(where, "must be an object")
    allowed = tuple(allowed)
    for key in value:
        if key not in allowed:
            name = f"{where}.{key}" if where != "$" else key
            raise PolicyValidationError(name, "is not allowed (additionalProperties: false)")
    for key in required:
        if value.get(key) is None:
            raise PolicyValidationError(f"{where}.{key}" if where != "$" else key, "is required")
    # Nulls count as absent: the canonical form drops them (§3.2).
    return {k: v for k, v in value.items() if v is not None}


def _string(value: Any, where: str, *, nonempty: bool = False) -> str:
    if not isinstance(value, str):
        raise PolicyValidationError(where, "must be a string")
    if nonempty and not value:
        raise PolicyValidationError(where, "must not be empty")
    return value


def _enum(value: Any, where: str, allowed: Sequence[str]) -> str:
    if _string(value, where) not in allowed:
        raise PolicyValidationError(where, f"must be one of {', '.join(allowed)}")
    return value


def _strings(value: Any, where: str, *, min_items: int = 0) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise PolicyValidationError(where, "must be an array")
    if len(value) < min_items:
        raise PolicyValidationError(where, f"must have at least {min_items} item(s)")
    return tuple(_string(v, f"{where}[{i}]") for i, v in enumerate(value))


def _count(value: Any, where: str) -> int:
    # JSON true/false are not integers even though Python's bool is an int.
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise PolicyValidationError(where, "must be a non-negative integer")
    return value


def _category(value: Any, where: str) -> Category:
    doc = _object(value, where, ("name", "action", "description"), ("name", "action"))
    name = _string(doc["name"], f"{where}.name")
    if not _CATEGORY_NAME_RE.match(name):
        raise PolicyValidationError(f"{where}.name", "must match [a-z0-9_-]+")
    desc = doc.get("description")
    return Category(
        name=name,
        action=_enum(doc["action"], f"{where}.action", ACTIONS),
        description=None if desc is None else _string(desc, f"{where}.description"),
    )


def _classifier(value: Any) -> Classifier:
    doc = _object(value, "classifier", ("family", "host", "requires_engine_features"), ("family",))
    feats = doc.get("requires_engine_features")
    if feats is not None:
        feats = _strings(feats, "classifier.requires_engine_features")
        for i, f in enumerate(feats):
            _enum(f, f"classifier.requires_engine_features[{i}]", ENGINE_FEATURES)
    host = doc.get("host")
    return Classifier(
        family=_string(doc["family"], "classifier.family", nonempty=True),
        host=None if host is None else _enum(host, "classifier.host", CLASSIFIER_HOSTS),
        requires_engine_features=feats,
    )


def _rules(value: Any) -> RulesSummary:
    doc = _object(value, "rules_summary", _RULE_COUNTS)
    return RulesSummary(**{k: _count(v, f"rules_summary.{k}") for k, v in doc.items()})


def _hooks(value: Any) -> ClientHooks:
    doc = _object(value, "client_hooks", ("prefilter_categories", "client_classifier_family"))
    cats, fam = doc.get("prefilter_categories"), doc.get("client_classifier_family")
    return ClientHooks(
        prefilter_categories=None
        if cats is None
        else _strings(cats, "client_hooks.prefilter_categories"),
        client_classifier_family=None
        if fam is None
        else _string(fam, "client_hooks.client_classifier_family"),
    )


def _publisher(value: Any) -> Publisher:
    doc = _object(value, "publisher", ("name", "url", "contact"))
    out = {k: _string(v, f"publisher.{k}") for k, v in doc.items()}
    if "url" in out and not _URI_RE.match(out["url"]):
        raise PolicyValidationError("publisher.url", "must be an absolute URI (format: uri)")
    return Publisher(**out)


def _timestamp(value: Any) -> str:
    text = _string(value, "published_at")
    try:  # format: date-time (RFC 3339); Python 3.11 accepts the trailing "Z"
        parsed = datetime.fromisoformat(text)
    except ValueError:
        parsed = None
    if parsed is None or "T" not in text.upper() or parsed.tzinfo is None:
        raise PolicyValidationError("published_at", "must be an RFC 3339 date-time")
    return text


_TOP_KEYS = (
    "id",
    "version",
    "tokenizers",
    "categories",
    "category_registry",
    "classifier",
    "rules_summary",
    "client_hooks",
    "published_at",
    "publisher",
)


def parse_policy(data: bytes | str | Mapping[str, Any]) -> SafetyPolicyDescriptor:
    """Parse and validate a descriptor (raw JSON bytes/text or an already-decoded object).

    Raises :class:`PolicyValidationError` naming the field; ``version`` other than ``"1"`` is
    rejected (the schema says implementations SHOULD reject unknown versions).
    """
    if isinstance(data, bytes | str):
        try:
            data = peer_json.loads(data)
        except ValueError as exc:
            raise PolicyValidationError("$", f"is not JSON: {exc}") from exc
    doc = _object(data, "$", _TOP_KEYS, ("id", "version", "tokenizers", "categories", "classifier"))
    version = _string(doc["version"], "version")
    if version != SCHEMA_VERSION:
        raise PolicyValidationError("version", f"{version!r} is not a known schema version")
    cats = doc["categories"]
    if not isinstance(cats, list) or not cats:
        raise PolicyValidationError("categories", "must be an array with at least 1 item")
    opt = doc.get
    return SafetyPolicyDescriptor(
        id=_string(doc["id"], "id", nonempty=True),
        version=version,
        tokenizers=_strings(doc["tokenizers"], "tokenizers", min_items=1),
        categories=tuple(_category(c, f"categories[{i}]") for i, c in enumerate(cats)),
        classifier=_classifier(doc["classifier"]),
        category_registry=None
        if opt("category_registry") is None
        else _string(doc["category_registry"], "category_registry"),
        rules_summary=None if opt("rules_summary") is None else _rules(doc["rules_summary"]),
        client_hooks=None if opt("client_hooks") is None else _hooks(doc["client_hooks"]),
        published_at=None if opt("published_at") is None else _timestamp(doc["published_at"]),
        publisher=None if opt("publisher") is None else _publisher(doc["publisher"]),
    )


# -- Canonical form and hash (§3.2) --------------------------------------------------------


def _ordered(desc: SafetyPolicyDescriptor) -> dict[str, Any]:
    """The descriptor as a dict in canonical key order (§3.2), nulls dropped."""

    def strip(pairs: Iterable[tuple[str, Any]]) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in pairs if v is not None}

    c, r, h, p = desc.classifier, desc.rules_summary, desc.client_hooks, desc.publisher
    return strip(
        [
            ("id", desc.id),
            ("version", desc.version),
            ("tokenizers", desc.tokenizers),
            (
                "categories",
                [
                    strip([("name", x.name), ("action", x.action), ("description", x.description)])
                    for x in desc.categories
                ],
            ),
            (
                "classifier",
                strip(
                    [
                        ("family", c.family),
                        ("host", c.host),
                        ("requires_engine_features", c.requires_engine_features),
                    ]
                ),
            ),
            ("category_registry", desc.category_registry),
            (
                "rules_summary",
                None if r is None else strip((k, getattr(r, k)) for k in _RULE_COUNTS),
            ),
            (
                "client_hooks",
                None
                if h is None
                else strip(
                    [
                        ("prefilter_categories", h.prefilter_categories),
                        ("client_classifier_family", h.client_classifier_family),
                    ]
                ),
            ),
            ("published_at", desc.published_at),
            (
                "publisher",
                None
                if p is None
                else strip([("name", p.name), ("url", p.url), ("contact", p.contact)]),
            ),
        ]
    )


def canonical_bytes(desc: SafetyPolicyDescriptor) -> bytes:
    """The bytes to hash and to publish (§3.2): indent 2, raw UTF-8, one trailing newline."""
    text = json.dumps(_ordered(desc), indent=2, ensure_ascii=False, separators=(",", ": "))
    return (text + "\n").encode("utf-8")


def canonicalise(data: bytes | str | Mapping[str, Any]) -> bytes:
    """Validate a descriptor and return its canonical bytes."""
    return canonical_bytes(parse_policy(data))


def hash_policy(desc: SafetyPolicyDescriptor) -> str:
    """``sha256:<hex>`` of the canonical bytes: READY's hash / ``Codec-Safety-Policy-Hash``."""
    return "sha256:" + hashlib.sha256(canonical_bytes(desc)).hexdigest()


# -- Enforcement ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BannedTokenPolicy:
    """Server-side banned-id enforcement (the ``logits_processor`` layer, by its output).

    The ids stay private: only their count goes into ``rules_summary`` (§5.5). When
    :meth:`check` finds a banned id the server ends the stream with ``done=true`` and
    ``finish_reason: "policy_violation"``, sending at most the ids before it (§5.5).
    """

    policy_id: str
    banned_ids: frozenset[int]

    def __init__(self, policy_id: str, banned_ids: Iterable[int]) -> None:
        object.__setattr__(self, "policy_id", policy_id)
        object.__setattr__(self, "banned_ids", frozenset(banned_ids))

    def check(self, ids: Sequence[int]) -> int | None:
        """Index of the first banned id in ``ids``, or ``None`` when all are allowed."""
        banned = self.banned_ids
        if not banned or banned.isdisjoint(ids):
            return None
        return next(i for i, t in enumerate(ids) if t in banned)

    def summary(self) -> RulesSummary:
        """The publishable count for the descriptor's ``rules_summary``."""
        return RulesSummary(banned_token_id_count=len(self.banned_ids))
