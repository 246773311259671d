"""``/.well-known/codec/``: discovery documents and their routes (codec-spec §6, §4.4, §5.4-§5.6).

Everything served here is immutable or content addressed except the mutable id documents,
and every body is bytes the server already holds: no path is ever joined onto a directory,
so an id can never traverse anything. Ids are still validated before any lookup (§6.1:
``[a-z0-9._/-]+``, no ``..``, no leading or trailing ``/``) and a bad id is a 404.

Paths (under ``/.well-known/codec/``):

* ``maps/<id>.json`` - the inline map, exactly the bytes loaded (Form B, §6.2), so a client
  that pins ``sha256`` of what it fetched gets the map's real hash; ``<id>`` keeps its ``/``.
* ``maps/sha256/<hex>.json`` - the content-addressed sibling (§6.1, draft; §9.1 item 15).
* ``dicts/<hex>.zstd`` - raw zstd dictionaries, content addressed only (§4.4).
* ``policies/<id>.json`` and ``policies/sha256/<hex>.json`` - safety descriptors as their
  *canonical* bytes, so the fetched bytes hash to ``Codec-Safety-Policy-Hash`` (§3.2, §9.1
  item 14, §10 item 15).
* ``version-policy.json`` - the §5.4 pre-flight; 404 when nothing is mandatory.
* ``index.json`` - ``{"codec_version", "maps": [{id, url, hash}]}`` (§6.1), plus ``dicts``
  and ``policies`` lists (unknown keys, which clients ignore).

Headers follow §6.4 (``Content-Type: application/json``, ``Access-Control-Allow-Origin: *``,
``Cache-Control: public, max-age=300, stale-while-revalidate=86400``). Content-addressed
bodies also carry a strong ``ETag`` (the hex digest, exposed to scripts) and answer
``If-None-Match`` with 304. Dictionaries are ``application/octet-stream``: they are not JSON.

**Browsers** (§6.4): these documents are public, so they are served to any origin, without a
key (``security.py`` lets them through), and a CORS preflight (``OPTIONS`` with
``Access-Control-Request-Method``) anywhere under the prefix gets a 204 allowing ``GET`` and
``HEAD`` with the headers a Codec client sends (:data:`PREFLIGHT_HEADERS`). A missing document
is a 404 in the gateway's one JSON error shape (``code: "not_found"``), with the same CORS
header, so a script can read why.

**Advertising dictionaries in a map** (§3.7, issue 3 item 3): :func:`advertise_dictionaries`
returns a map whose ``zstd_dictionaries`` lists the loaded dicts. That changes the map's bytes
and therefore its hash: the advertised map is a *new map* with the same vocabulary. We serve
it under ``maps/<id>.json`` and keep serving the original bytes under their own
``maps/sha256/<hex>.json`` so clients pinned to the bundled map still resolve it. A server
that advertises should name the advertised map's hash in ``Codec-Tokenizer-Map``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tokenwire.codec.compression import ZstdDict
from tokenwire.codec.maps import TokenizerMap, load_map_bytes, validate_map_id
from tokenwire.codec.safety_policy import SafetyPolicyDescriptor, canonical_bytes, hash_policy
from tokenwire.codec.versioning import (
    OWN_VERSION,
    VersionPolicy,
    format_version,
    version_policy_document,
)
from tokenwire.errors import MapValidationError
from tokenwire.gateway.apis.errors import error_body

__all__ = [
    "CACHE_CONTROL",
    "DISCOVERY_HEADERS",
    "PREFLIGHT_HEADERS",
    "WELL_KNOWN_PREFIX",
    "DiscoveryState",
    "PublishedPolicy",
    "advertise_dictionaries",
    "dict_path",
    "index_document",
    "map_path",
    "map_sha256_path",
    "policy_path",
    "policy_sha256_path",
    "published_policies",
    "wellknown_routes",
]

WELL_KNOWN_PREFIX = "/.well-known/codec"
#: §6.4: pointer documents may change, so caches revalidate after 5 minutes but may serve a
#: stale copy for a day while they do (maps and dicts themselves are pinned by hash).
CACHE_CONTROL = "public, max-age=300, stale-while-revalidate=86400"
#: Browsers fetch discovery documents cross-origin (§6.4); a script may read the ETag to
#: revalidate with ``If-None-Match``.
DISCOVERY_HEADERS: dict[str, str] = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Expose-Headers": "ETag",
    "Cache-Control": CACHE_CONTROL,
}
#: The answer to a CORS preflight: read-only methods, the request headers a Codec client
#: sends, and a day's caching of the answer (the documents' own stale window).
PREFLIGHT_HEADERS: dict[str, str] = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Methods": "GET, HEAD, OPTIONS",
    "Access-Control-Allow-Headers": "Accept, Codec-Client-Version, If-None-Match",
    "Access-Control-Max-Age": "86400",
}
_JSON = "application/json"
_HEX_RE = re.compile(r"^[0-9a-f]{64}$")
#: How much of a requested id or path a 404 repeats: ids have no length bound of their own
#: (§6.1), and a 10,000-character one came back whole (``GET /v1/responses/{id}`` refuses
#: ids over 256 characters without repeating them, ``http/responses_get.py``).
_ECHO_CHARS = 120


def map_path(map_id: str) -> str:
    return f"{WELL_KNOWN_PREFIX}/maps/{validate_map_id(map_id)}.json"


def map_sha256_path(digest: str) -> str:
    return f"{WELL_KNOWN_PREFIX}/maps/sha256/{_hex(digest)}.json"


def dict_path(digest: str) -> str:
    return f"{WELL_KNOWN_PREFIX}/dicts/{_hex(digest)}.zstd"


def policy_path(policy_id: str) -> str:
    return f"{WELL_KNOWN_PREFIX}/policies/{validate_map_id(policy_id)}.json"


def policy_sha256_path(digest: str) -> str:
    return f"{WELL_KNOWN_PREFIX}/policies/sha256/{_hex(digest)}.json"


def _hex(digest: str) -> str:
    return digest.removeprefix("sha256:")


@dataclass(frozen=True, slots=True)
class PublishedPolicy:
    """A safety descriptor as published: its canonical bytes and their hash (§3.2)."""

    id: str
    raw: bytes = field(repr=False)
    hash: str

    @classmethod
    def from_descriptor(cls, desc: SafetyPolicyDescriptor) -> PublishedPolicy:
        return cls(id=desc.id, raw=canonical_bytes(desc), hash=hash_policy(desc))


@dataclass(frozen=True, slots=True)
class DiscoveryState:
    """What the well-known routes serve. Immutable; build a new one to change it.

    ``maps``: the first map of each id is the one ``maps/<id>.json`` serves; every map is
    reachable by its content address. ``dicts``: stream format -> dictionary.
    ``version_policy``: None (or nothing mandatory) makes ``version-policy.json`` a 404.
    ``public_base_url``: the deployment's public origin (``--public-url``); ``index.json``'s
    URLs are built on it when set, else on the request's own ``Host``.
    """

    maps: tuple[TokenizerMap, ...] = ()
    dicts: Mapping[str, ZstdDict] = field(default_factory=dict)
    policies: tuple[PublishedPolicy, ...] = ()
    version_policy: VersionPolicy | None = None
    codec_version: str = format_version(OWN_VERSION)
    public_base_url: str = ""

    def map_by_id(self, map_id: str) -> TokenizerMap | None:
        return next((m for m in self.maps if m.id == map_id), None)

    def map_by_hash(self, digest: str) -> TokenizerMap | None:
        return next((m for m in self.maps if m.hash == digest), None)

    def dict_by_hash(self, digest: str) -> ZstdDict | None:
        return next((d for d in self.dicts.values() if d.hash == digest), None)

    def policy_by_id(self, policy_id: str) -> PublishedPolicy | None:
        return next((p for p in self.policies if p.id == policy_id), None)

    def policy_by_hash(self, digest: str) -> PublishedPolicy | None:
        return next((p for p in self.policies if p.hash == digest), None)


# -- advertising dictionaries in a map (§3.7) ----------------------------------------------


def _dict_entries(dicts: Mapping[str, ZstdDict], base_url: str) -> list[dict[str, object]]:
    return [
        {
            "format": fmt,
            "url": f"{base_url.rstrip('/')}{dict_path(d.hash)}",
            "hash": d.hash,
            "size_bytes": len(d.raw),
        }
        for fmt, d in sorted(dicts.items())
    ]


def advertise_dictionaries(
    tmap: TokenizerMap, dicts: Mapping[str, ZstdDict], *, base_url: str = ""
) -> TokenizerMap:
    """``tmap`` with ``zstd_dictionaries`` entries for ``dicts`` (format -> dictionary).

    The result is a different map (different bytes, different hash; see the module
    docstring). ``base_url`` is the public origin (``https://host``); empty gives
    root-relative URLs (``/.well-known/codec/dicts/<hex>.zstd``), which clients resolve
    against the URL they fetched the map from. Entries for other formats already in the map
    are kept. When the map has no ``zstd_dictionaries`` key the entry is spliced in before
    the final ``}``, so every other byte of the original stays as it was.
    """
    if not dicts:
        return tmap
    entries = _dict_entries(dicts, base_url)
    raw = tmap.raw.rstrip()
    doc = tmap.to_dict()
    if "zstd_dictionaries" not in doc and raw.endswith(b"}"):
        body = raw[:-1].rstrip()
        sep = b"," if not body.endswith(b"{") else b""
        addition = json.dumps(entries, ensure_ascii=False, separators=(",", ":")).encode()
        new_raw = body + sep + b'"zstd_dictionaries":' + addition + b"}\n"
    else:
        kept = [e for e in doc.get("zstd_dictionaries") or [] if e.get("format") not in dicts]
        doc["zstd_dictionaries"] = kept + entries
        new_raw = (json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
    return load_map_bytes(new_raw, source=f"{tmap.id} + zstd_dictionaries")


# -- responses ----------------------------------------------------------------------------


def _echo(text: str) -> str:
    """``text`` as a 404 may repeat it: cut to :data:`_ECHO_CHARS`, with its length."""
    if len(text) <= _ECHO_CHARS:
        return text
    return f"{text[:_ECHO_CHARS]}... ({len(text):,} characters)"


def _not_found(what: str) -> Response:
    body = error_body(what, status=404, code="not_found")
    headers = {"Access-Control-Allow-Origin": "*", "Cache-Control": "no-cache"}
    return Response(body, status_code=404, media_type=_JSON, headers=headers)


async def _preflight(request: Request) -> Response:
    return Response(status_code=204, headers={**PREFLIGHT_HEADERS,
                                              "Allow": "GET, HEAD, OPTIONS"})


async def _no_document(request: Request) -> Response:
    return _not_found(f"no discovery document at {_echo(request.url.path)}")


def _document(
    request: Request, body: bytes, *, media_type: str = _JSON, etag: str | None = None
) -> Response:
    headers = dict(DISCOVERY_HEADERS)
    if etag is not None:
        headers["ETag"] = f'"{etag}"'
        if _etag_matches(request.headers.get("if-none-match"), etag):
            return Response(status_code=304, headers=headers)
    return Response(body, media_type=media_type, headers=headers)


def _etag_matches(header: str | None, etag: str) -> bool:
    if not header:
        return False
    tags = {t.strip().removeprefix("W/").strip('"') for t in header.split(",")}
    return etag in tags or "*" in tags


def _valid_id(text: str) -> str | None:
    try:
        return validate_map_id(text)
    except MapValidationError:
        return None


def _split_json_path(rest: str) -> tuple[str, str] | None:
    """``"sha256/<hex>.json"`` -> ("hash", hex); ``"<id>.json"`` -> ("id", id); else None."""
    if not rest.endswith(".json"):
        return None
    stem = rest[: -len(".json")]
    if stem.startswith("sha256/") and _HEX_RE.match(stem[len("sha256/") :]):
        return "hash", "sha256:" + stem[len("sha256/") :]
    valid = _valid_id(stem)
    return ("id", valid) if valid is not None else None


# -- routes -------------------------------------------------------------------------------


def wellknown_routes(state: DiscoveryState) -> list[Route]:
    """The ``/.well-known/codec/`` routes over ``state`` (GET; Starlette adds HEAD)."""

    async def maps(request: Request) -> Response:
        key = _split_json_path(request.path_params["rest"])
        if key is None:
            return _not_found("bad map path")
        kind, value = key
        tmap = state.map_by_hash(value) if kind == "hash" else state.map_by_id(value)
        if tmap is None:
            return _not_found(f"no map {_echo(value)}")
        return _document(request, tmap.raw, etag=_hex(tmap.hash))

    async def policies(request: Request) -> Response:
        key = _split_json_path(request.path_params["rest"])
        if key is None:
            return _not_found("bad policy path")
        kind, value = key
        pol = state.policy_by_hash(value) if kind == "hash" else state.policy_by_id(value)
        if pol is None:
            return _not_found(f"no policy {_echo(value)}")
        return _document(request, pol.raw, etag=_hex(pol.hash))

    async def dicts(request: Request) -> Response:
        name = request.path_params["name"]
        hex_part = name.removesuffix(".zstd")
        if not name.endswith(".zstd") or not _HEX_RE.match(hex_part):
            return _not_found("bad dictionary path")
        zdict = state.dict_by_hash("sha256:" + hex_part)
        if zdict is None:
            return _not_found(f"no dictionary sha256:{hex_part}")
        return _document(request, zdict.raw, media_type="application/octet-stream", etag=hex_part)

    async def version_policy(request: Request) -> Response:
        if state.version_policy is None:
            return _not_found("nothing is mandatory")
        status, headers, body = version_policy_document(state.version_policy)
        if status != 200:
            return _not_found("nothing is mandatory")
        return _document(request, body, media_type=dict(headers)["Content-Type"])

    async def index(request: Request) -> Response:
        # A configured public origin wins over the Host header: behind a proxy the Host is
        # an internal name, and any client may send any Host, while the document is public
        # and cacheable (§6.4) for everyone who asks.
        base = state.public_base_url or str(request.base_url)
        return _document(request, index_document(state, base))

    return [
        Route(f"{WELL_KNOWN_PREFIX}/index.json", index, methods=["GET"]),
        Route(f"{WELL_KNOWN_PREFIX}/version-policy.json", version_policy, methods=["GET"]),
        Route(f"{WELL_KNOWN_PREFIX}/maps/{{rest:path}}", maps, methods=["GET"]),
        Route(f"{WELL_KNOWN_PREFIX}/policies/{{rest:path}}", policies, methods=["GET"]),
        Route(f"{WELL_KNOWN_PREFIX}/dicts/{{name}}", dicts, methods=["GET"]),
        Route(f"{WELL_KNOWN_PREFIX}/{{rest:path}}", _no_document, methods=["GET"]),
        Route(f"{WELL_KNOWN_PREFIX}/{{rest:path}}", _preflight, methods=["OPTIONS"]),
    ]


def index_document(state: DiscoveryState, base_url: str) -> bytes:
    """The ``index.json`` body; URLs are absolute on ``base_url`` and content addressed."""
    base = base_url.rstrip("/")
    seen: set[str] = set()
    maps: list[dict[str, object]] = []
    for tmap in state.maps:
        if tmap.id in seen:  # the first map of an id is the one maps/<id>.json serves
            continue
        seen.add(tmap.id)
        maps.append({"id": tmap.id, "url": base + map_sha256_path(tmap.hash), "hash": tmap.hash})
    doc: dict[str, object] = {
        "codec_version": state.codec_version,
        "maps": maps,
        "dicts": _dict_entries(state.dicts, base),
        "policies": [
            {"id": p.id, "url": base + policy_sha256_path(p.hash), "hash": p.hash}
            for p in state.policies
        ],
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def published_policies(descs: Iterable[SafetyPolicyDescriptor]) -> tuple[PublishedPolicy, ...]:
    return tuple(PublishedPolicy.from_descriptor(d) for d in descs)
