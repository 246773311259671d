"""Discovery under ``/.well-known/codec/`` (codec-spec §6.3, §4.4, §5.6), sans-IO with twin drivers.

Each resolution is a generator (the httpx ``auth_flow`` shape, STYLE §3): it yields a
:class:`Fetch` and receives a :class:`Fetched`, and its return value is the result. The
sync and async drivers only perform the GETs, so the rules live in one place:

1. ids are validated before a URL is built (§6.1);
2. a known hash is the trust anchor: the content-addressed sibling
   (``maps/sha256/<hex>.json``, ``policies/sha256/<hex>.json``, ``dicts/<hex>.zstd``) is
   fetched first and verified, and the mutable id document is used only if that is a 404;
3. an id document is inline (a map has ``vocab``/``tokens``, a policy has ``categories``) or
   a pointer ``{id, url, hash}``; the pointer's id must equal the one asked for and its target
   must hash to its ``hash``; a target that is itself a pointer is refused (one hop, §6.3.6);
4. URLs are https unless ``allow_http=True`` (§6.1 draft, §10 item 14);
5. every failure has its own type (§6.3.7): :class:`DiscoveryNotFound`,
   :class:`DiscoveryHashMismatch`, :class:`DiscoveryPointerError`,
   :class:`DiscoveryDocumentInvalid`, :class:`DiscoveryInsecureURL` (all
   :class:`DiscoveryError`), so a caller can fall back to a configured ``(url, hash)``.

Maps and dictionaries are cached by hash for ever (they are immutable, §6.4); pointer
documents are not cached.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urljoin, urlsplit

import httpx

from tokenwire import peer_json
from tokenwire.client.bounded_read import BodyOverBudget, aread_bounded, read_bounded
from tokenwire.client.deadline import DEFAULT_DEADLINE_S, NO_DEADLINE, Deadline
from tokenwire.codec.compression import ZstdDict
from tokenwire.codec.maps import (
    MapCache,
    TokenizerMap,
    load_map_bytes,
    parse_hash,
    sha256_hash,
    validate_map_id,
)
from tokenwire.codec.safety_policy import SafetyPolicyDescriptor, canonical_bytes, parse_policy
from tokenwire.errors import (
    DecompressionError,
    DiscoveryDocumentInvalid,
    DiscoveryError,
    DiscoveryHashMismatch,
    DiscoveryInsecureURL,
    DiscoveryNotFound,
    DiscoveryPointerError,
    HashFormatError,
    MapError,
    PolicyValidationError,
)

__all__ = [
    "MAX_DICT_BYTES",
    "MAX_ERROR_BODY",
    "MAX_MAP_BYTES",
    "MAX_POLICY_BYTES",
    "WELL_KNOWN",
    "DictCache",
    "DiscoveryCache",
    "Fetch",
    "Fetched",
    "ResolvedPolicy",
    "adrive",
    "afetch_dict",
    "aresolve_map",
    "aresolve_policy",
    "check_url",
    "dict_flow",
    "drive",
    "fetch_dict",
    "index_flow",
    "is_loopback",
    "map_by_hash_flow",
    "map_flow",
    "policy_flow",
    "resolve_map",
    "resolve_policy",
]

WELL_KNOWN = "/.well-known/codec"
#: The largest published map (cl100k) is 3.8 MB; 64 MiB leaves room for 256k vocabularies
#: while a hostile server cannot stream us gigabytes (same cap as ``map_fetch``).
MAX_MAP_BYTES = 64 * 1024 * 1024
#: Reference dictionaries are 16 KiB and the size sweep tops out at 64 KiB (§3.7).
MAX_DICT_BYTES = 1024 * 1024
#: A descriptor is ~2 KB (§3.2); 1 MiB is generous and still bounded.
MAX_POLICY_BYTES = 1024 * 1024
#: Error bodies are read only to explain the error.
MAX_ERROR_BODY = 4096


@dataclass(frozen=True, slots=True)
class Fetch:
    """One GET a flow wants performed; at most ``max_bytes`` of body are accepted."""

    url: str
    max_bytes: int


@dataclass(frozen=True, slots=True)
class Fetched:
    """What the driver got back. ``body`` is the content-decoded body (§3.2 hashes that)."""

    url: str
    status: int
    body: bytes


@dataclass(frozen=True, slots=True)
class ResolvedPolicy:
    """A fetched safety descriptor. ``hash`` is sha256 of the raw bytes fetched; ``canonical``
    says whether those bytes are the canonical form, i.e. whether ``hash`` can equal a
    ``Codec-Safety-Policy-Hash`` (§3.2, §9.1 item 14)."""

    descriptor: SafetyPolicyDescriptor
    raw: bytes = field(repr=False)
    hash: str
    canonical: bool

    @property
    def id(self) -> str:
        return self.descriptor.id


class DictCache:
    """Zstd dictionaries by ``sha256:<hex>`` (immutable: never expire; LRU-capped)."""

    def __init__(self, max_entries: int = 16) -> None:
        self._max = max_entries
        self._dicts: dict[str, ZstdDict] = {}

    def get(self, digest: str) -> ZstdDict | None:
        key = parse_hash(digest)
        found = self._dicts.pop(key, None)
        if found is not None:
            self._dicts[key] = found
        return found

    def put(self, zdict: ZstdDict) -> ZstdDict:
        self._dicts.pop(zdict.hash, None)
        self._dicts[zdict.hash] = zdict
        while len(self._dicts) > self._max:
            del self._dicts[next(iter(self._dicts))]
        return zdict

    def as_mapping(self) -> dict[str, ZstdDict]:
        return dict(self._dicts)

    def __contains__(self, digest: str) -> bool:
        return parse_hash(digest) in self._dicts

    def __len__(self) -> int:
        return len(self._dicts)


@dataclass(slots=True)
class DiscoveryCache:
    """The caches one client keeps: maps and dicts by hash, policies by raw-bytes hash."""

    maps: MapCache = field(default_factory=MapCache)
    dicts: DictCache = field(default_factory=DictCache)
    policies: dict[str, ResolvedPolicy] = field(default_factory=dict)


# -- URL rules ----------------------------------------------------------------------------


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_url(url: str, allow_http: bool, what: str = "URL") -> str:
    """Return ``url`` if its scheme is allowed, else raise (https only unless opted in)."""
    scheme = urlsplit(url).scheme.lower()
    if scheme == "https":
        return url
    if scheme == "http":
        if allow_http:
            return url
        raise DiscoveryInsecureURL(f"{what} {url!r} is http; discovery is https only "
                                   "(pass allow_http=True for a test or air-gapped origin)")
    raise DiscoveryPointerError(f"{what} {url!r} is not an http(s) URL")


def _origin(origin: str, allow_http: bool) -> str:
    check_url(origin, allow_http, "origin")
    parts = urlsplit(origin)
    return f"{parts.scheme}://{parts.netloc}"


# -- the flows ----------------------------------------------------------------------------

Flow = Generator[Fetch, Fetched, Any]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Kind:
    """What differs between map and policy resolution (§6.3: "the same algorithm")."""

    name: str
    folder: str
    inline_keys: tuple[str, ...]
    max_bytes: int
    parse: Callable[[bytes, str], Any]  # (raw, source) -> object with .id, raises Discovery*


def _parse_map(raw: bytes, source: str) -> TokenizerMap:
    try:
        return load_map_bytes(raw, source=source)
    except MapError as exc:
        raise DiscoveryDocumentInvalid(f"{source}: {exc}") from exc


def _parse_policy(raw: bytes, source: str) -> ResolvedPolicy:
    try:
        desc = parse_policy(raw)
    except (PolicyValidationError, ValueError) as exc:
        raise DiscoveryDocumentInvalid(f"{source}: {exc}") from exc
    return ResolvedPolicy(desc, raw, sha256_hash(raw), canonical_bytes(desc) == raw)


_MAP = _Kind("map", "maps", ("vocab", "tokens"), MAX_MAP_BYTES, _parse_map)
_POLICY = _Kind("policy", "policies", ("categories",), MAX_POLICY_BYTES, _parse_policy)


def _json_object(resp: Fetched) -> dict[str, Any]:
    try:
        doc = peer_json.loads(resp.body)
    except ValueError as exc:  # UnicodeDecodeError is one
        raise DiscoveryDocumentInvalid(f"{resp.url} is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise DiscoveryDocumentInvalid(f"{resp.url} is not a JSON object")
    return doc


def _require_ok(resp: Fetched, what: str) -> None:
    if resp.status == 404:
        raise DiscoveryNotFound(f"{what} not found at {resp.url} (404)")
    if resp.status != 200:
        raise DiscoveryError(f"{what}: GET {resp.url} answered {resp.status}")


def _verify(resp: Fetched, expected: str) -> None:
    actual = sha256_hash(resp.body)
    if actual != expected:
        raise DiscoveryHashMismatch(expected, actual, resp.url)


def _checked(obj: Any, wanted_id: str, url: str, kind: _Kind) -> Any:
    if obj.id != wanted_id:
        raise DiscoveryDocumentInvalid(f"{url}: {kind.name} id {obj.id!r}, asked for {wanted_id!r}")
    return obj


def _pointer(
    doc: dict[str, Any], wanted_id: str, doc_url: str, allow_http: bool
) -> tuple[str, str]:
    """Validate a pointer document (§6.2 Form A) and return ``(absolute url, hash)``."""
    for key in ("id", "url", "hash"):
        if not isinstance(doc.get(key), str):
            raise DiscoveryPointerError(f"{doc_url}: pointer needs a string `{key}`")
    if doc["id"] != wanted_id:
        raise DiscoveryPointerError(f"{doc_url}: pointer is for {doc['id']!r}, not {wanted_id!r}")
    try:
        digest = parse_hash(doc["hash"])
    except HashFormatError as exc:
        raise DiscoveryPointerError(f"{doc_url}: {exc}") from exc
    target = urljoin(doc_url, doc["url"])
    return check_url(target, allow_http, "pointer target"), digest


def _resolve(
    kind: _Kind, origin: str, wanted_id: str, pinned: str | None, allow_http: bool
) -> Flow:
    base = _origin(origin, allow_http)
    validate_map_id(wanted_id)  # §6.1: before any URL is built
    if pinned is not None:
        resp = yield Fetch(f"{base}{WELL_KNOWN}/{kind.folder}/sha256/{pinned[7:]}.json",
                           kind.max_bytes)
        if resp.status == 200:
            _verify(resp, pinned)
            return _checked(kind.parse(resp.body, resp.url), wanted_id, resp.url, kind)
        if resp.status != 404:
            _require_ok(resp, kind.name)
    resp = yield Fetch(f"{base}{WELL_KNOWN}/{kind.folder}/{wanted_id}.json", kind.max_bytes)
    _require_ok(resp, f"{kind.name} {wanted_id!r}")
    doc = _json_object(resp)
    if any(k in doc for k in kind.inline_keys):  # Form B, integrity from TLS (+ pin if any)
        if pinned is not None:
            _verify(resp, pinned)
        return _checked(kind.parse(resp.body, resp.url), wanted_id, resp.url, kind)
    url, digest = _pointer(doc, wanted_id, resp.url, allow_http)
    if pinned is not None and digest != pinned:
        raise DiscoveryHashMismatch(pinned, digest, f"pointer {resp.url}")
    target = yield Fetch(url, kind.max_bytes)
    _require_ok(target, f"{kind.name} {wanted_id!r} (pointer target)")
    _verify(target, digest)
    inner = _json_object(target)
    if not any(k in inner for k in kind.inline_keys) and "url" in inner:
        raise DiscoveryPointerError(f"{target.url}: a pointer to a pointer (one hop only, §6.3)")
    return _checked(kind.parse(target.body, target.url), wanted_id, target.url, kind)


def map_flow(
    origin: str,
    map_id: str,
    *,
    expected_hash: str | None = None,
    allow_http: bool = False,
    cache: DiscoveryCache | None = None,
) -> Flow:
    """Resolve a tokenizer map by id (and optionally pinned hash) at ``origin``."""
    pinned = parse_hash(expected_hash) if expected_hash is not None else None
    if pinned is not None and cache is not None and (hit := cache.maps.get(pinned)):
        if hit.id == map_id:
            return hit
    tmap: TokenizerMap = yield from _resolve(_MAP, origin, map_id, pinned, allow_http)
    return cache.maps.put(tmap) if cache is not None else tmap


def map_by_hash_flow(
    origin: str, digest: str, *, allow_http: bool = False, cache: DiscoveryCache | None = None
) -> Flow:
    """A map known only by hash (e.g. from ``Codec-Tokenizer-Map``): its sibling document."""
    pinned = parse_hash(digest)
    if cache is not None and (hit := cache.maps.get(pinned)) is not None:
        return hit
    resp = yield Fetch(f"{_origin(origin, allow_http)}{WELL_KNOWN}/maps/sha256/{pinned[7:]}.json",
                       MAX_MAP_BYTES)
    _require_ok(resp, f"map {pinned}")
    _verify(resp, pinned)
    tmap = _parse_map(resp.body, resp.url)
    return cache.maps.put(tmap) if cache is not None else tmap


def index_flow(origin: str, *, allow_http: bool = False) -> Flow:
    """``index.json`` (§6.1, optional): the ``maps`` entries as ``(id, hash)`` pairs."""
    resp = yield Fetch(f"{_origin(origin, allow_http)}{WELL_KNOWN}/index.json", MAX_POLICY_BYTES)
    _require_ok(resp, "index.json")
    doc = _json_object(resp)
    entries = doc.get("maps")
    if not isinstance(entries, list):
        raise DiscoveryDocumentInvalid(f"{resp.url}: `maps` must be a list")
    out: list[tuple[str, str]] = []
    for entry in entries:
        try:
            out.append((validate_map_id(entry["id"]), parse_hash(entry["hash"])))
        except (KeyError, TypeError, MapError) as exc:
            raise DiscoveryDocumentInvalid(f"{resp.url}: bad maps entry {entry!r}") from exc
    return out


def policy_flow(
    origin: str,
    policy_id: str,
    *,
    expected_hash: str | None = None,
    allow_http: bool = False,
    cache: DiscoveryCache | None = None,
) -> Flow:
    """Resolve a safety descriptor (§5.6). ``expected_hash`` is READY's / the header's hash,
    which is over the canonical bytes, so it only matches canonical publications (§3.2)."""
    pinned = parse_hash(expected_hash) if expected_hash is not None else None
    if pinned is not None and cache is not None and (hit := cache.policies.get(pinned)):
        return hit
    pol: ResolvedPolicy = yield from _resolve(_POLICY, origin, policy_id, pinned, allow_http)
    if cache is not None:
        cache.policies[pol.hash] = pol
    return pol


def dict_flow(
    origin: str,
    digest: str,
    *,
    url: str | None = None,
    allow_http: bool = False,
    cache: DiscoveryCache | None = None,
) -> Flow:
    """Fetch the zstd dictionary ``digest`` (§2.7, §4.4).

    Tries ``<origin>/.well-known/codec/dicts/<hex>.zstd``, then ``url`` (a map's
    ``zstd_dictionaries`` entry) if that is a 404. The bytes must hash to ``digest``;
    a mismatch is fatal and no other dictionary is tried.
    """
    pinned = parse_hash(digest)
    if cache is not None and (hit := cache.dicts.get(pinned)) is not None:
        return hit
    base = _origin(origin, allow_http)
    candidates = [f"{base}{WELL_KNOWN}/dicts/{pinned[7:]}.zstd"]
    if url is not None:
        candidates.append(check_url(urljoin(base + "/", url), allow_http, "dictionary URL"))
    for i, candidate in enumerate(candidates):
        resp = yield Fetch(candidate, MAX_DICT_BYTES)
        if resp.status == 404 and i + 1 < len(candidates):
            continue
        _require_ok(resp, f"zstd dictionary {pinned}")
        _verify(resp, pinned)
        zdict = ZstdDict(raw=resp.body, hash=pinned)
        return cache.dicts.put(zdict) if cache is not None else zdict
    raise AssertionError("unreachable")  # pragma: no cover


# -- drivers ------------------------------------------------------------------------------


def _get(http: httpx.Client, req: Fetch, deadline: Deadline) -> Fetched:
    try:
        with http.stream("GET", req.url, timeout=deadline.timeout(http.timeout)) as resp:
            limit = req.max_bytes if resp.status_code == 200 else MAX_ERROR_BODY
            try:
                body = read_bounded(resp, limit, deadline)
            except BodyOverBudget as exc:
                body = _over_budget(req, resp.status_code, limit, exc)
            return Fetched(str(resp.url), resp.status_code, body)
    except DecompressionError as exc:
        raise DiscoveryError(f"{req.url} does not decode: {exc}") from None
    except httpx.HTTPError as exc:
        deadline.check()  # a wait cut short by the deadline is the deadline's failure
        raise DiscoveryError(f"GET {req.url} failed: {exc}") from exc


def _over_budget(req: Fetch, status: int, limit: int, exc: BodyOverBudget) -> bytes:
    """An error body is only read to explain the error: what fitted is kept."""
    if status != 200:
        return exc.partial
    raise DiscoveryError(f"{req.url} is over {limit} bytes") from None


async def _aget(http: httpx.AsyncClient, req: Fetch, deadline: Deadline) -> Fetched:
    try:
        with deadline.cancelling():
            return await _aget_within(http, req, deadline)
    except DecompressionError as exc:
        raise DiscoveryError(f"{req.url} does not decode: {exc}") from None
    except httpx.HTTPError as exc:
        deadline.check()
        raise DiscoveryError(f"GET {req.url} failed: {exc}") from exc


async def _aget_within(http: httpx.AsyncClient, req: Fetch, deadline: Deadline) -> Fetched:
    async with http.stream("GET", req.url, timeout=deadline.timeout(http.timeout)) as resp:
        limit = req.max_bytes if resp.status_code == 200 else MAX_ERROR_BODY
        try:
            body = await aread_bounded(resp, limit, deadline)
        except BodyOverBudget as exc:
            body = _over_budget(req, resp.status_code, limit, exc)
        return Fetched(str(resp.url), resp.status_code, body)


def drive(flow: Flow, http: httpx.Client, deadline: Deadline = NO_DEADLINE) -> Any:
    """Run a flow with a sync httpx client, within ``deadline`` (see client.deadline)."""
    try:
        req = next(flow)
        while True:
            req = flow.send(_get(http, req, deadline))
    except StopIteration as stop:
        return stop.value


async def adrive(flow: Flow, http: httpx.AsyncClient, deadline: Deadline = NO_DEADLINE) -> Any:
    """Run a flow with an async httpx client, within ``deadline``."""
    try:
        req = next(flow)
        while True:
            req = flow.send(await _aget(http, req, deadline))
    except StopIteration as stop:
        return stop.value


def _with_client(http: httpx.Client | None, flow: Flow, deadline: float | None) -> Any:
    """Run ``flow``, all its GETs within ``deadline`` seconds (None: each wait only)."""
    if http is not None:
        return drive(flow, http, Deadline(deadline))
    with httpx.Client(timeout=30.0) as own:
        return drive(flow, own, Deadline(deadline))


async def _awith_client(http: httpx.AsyncClient | None, flow: Flow,
                        deadline: float | None) -> Any:
    if http is not None:
        return await adrive(flow, http, Deadline(deadline))
    async with httpx.AsyncClient(timeout=30.0) as own:
        return await adrive(flow, own, Deadline(deadline))


def resolve_map(origin: str, map_id: str, *, expected_hash: str | None = None,
                allow_http: bool = False, cache: DiscoveryCache | None = None,
                client: httpx.Client | None = None,
                deadline: float | None = DEFAULT_DEADLINE_S) -> TokenizerMap:
    return _with_client(client, map_flow(origin, map_id, expected_hash=expected_hash,
                                         allow_http=allow_http, cache=cache), deadline)


async def aresolve_map(origin: str, map_id: str, *, expected_hash: str | None = None,
                       allow_http: bool = False, cache: DiscoveryCache | None = None,
                       client: httpx.AsyncClient | None = None,
                       deadline: float | None = DEFAULT_DEADLINE_S) -> TokenizerMap:
    return await _awith_client(client, map_flow(origin, map_id, expected_hash=expected_hash,
                                                allow_http=allow_http, cache=cache), deadline)


def resolve_policy(origin: str, policy_id: str, *, expected_hash: str | None = None,
                   allow_http: bool = False, cache: DiscoveryCache | None = None,
                   client: httpx.Client | None = None,
                   deadline: float | None = DEFAULT_DEADLINE_S) -> ResolvedPolicy:
    return _with_client(client, policy_flow(origin, policy_id, expected_hash=expected_hash,
                                            allow_http=allow_http, cache=cache), deadline)


async def aresolve_policy(origin: str, policy_id: str, *, expected_hash: str | None = None,
                          allow_http: bool = False, cache: DiscoveryCache | None = None,
                          client: httpx.AsyncClient | None = None,
                          deadline: float | None = DEFAULT_DEADLINE_S) -> ResolvedPolicy:
    return await _awith_client(client, policy_flow(origin, policy_id, expected_hash=expected_hash,
                                                   allow_http=allow_http, cache=cache), deadline)


def fetch_dict(origin: str, digest: str, *, url: str | None = None, allow_http: bool = False,
               cache: DiscoveryCache | None = None,
               client: httpx.Client | None = None,
               deadline: float | None = DEFAULT_DEADLINE_S) -> ZstdDict:
    return _with_client(client, dict_flow(origin, digest, url=url, allow_http=allow_http,
                                          cache=cache), deadline)


async def afetch_dict(origin: str, digest: str, *, url: str | None = None,
                      allow_http: bool = False, cache: DiscoveryCache | None = None,
                      client: httpx.AsyncClient | None = None,
                      deadline: float | None = DEFAULT_DEADLINE_S) -> ZstdDict:
    return await _awith_client(client, dict_flow(origin, digest, url=url, allow_http=allow_http,
                                                 cache=cache), deadline)
