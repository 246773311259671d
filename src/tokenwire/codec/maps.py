"""Tokenizer maps: parsing, content addressing, validation, aliases and a hash-keyed cache.

A map is addressed by the sha256 of its raw bytes as fetched (codec-spec 3.2), never by a
canonical JSON form: one added newline is a different map. This module is sans-IO apart
from :func:`load_map_file` (a local file read); fetching over HTTP belongs to the client.

Fields follow codec-spec 3.1. Unknown keys are tolerated and kept in ``TokenizerMap.extra``.
One additive field is ours: ``metaspace_prepend_scheme`` (``"always"`` for the Llama-2
normaliser ``Prepend("▁")`` applied to every text segment, ``"first"`` for Mistral-v3's
``Metaspace(prepend_scheme="first")``, ``"never"``). The published maps do not say which
one their model uses, which alone explains a third of the reference client's metaspace
mismatches (peer-bench 2), so maps without the field get it from a table of known ids.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from tokenwire.errors import (
    HashFormatError,
    MapHashMismatch,
    MapNotFound,
    MapValidationError,
)

__all__ = [
    "ENCODERS",
    "EXTRA_ALIASES",
    "KNOWN_PREPEND_SCHEMES",
    "MAX_TOKEN_ID",
    "MapCache",
    "TokenizerMap",
    "aliases",
    "bundled_map_path",
    "format_hash",
    "load_map_bytes",
    "load_map_file",
    "parse_hash",
    "resolve_alias",
    "sha256_hash",
    "validate_map_id",
]

Encoder = Literal["byte_level", "metaspace", "identity"]
PrependScheme = Literal["always", "first", "never"]
ENCODERS: tuple[str, ...] = ("byte_level", "metaspace", "identity")

# Which SentencePiece prepend behaviour each published metaspace family really uses
# (from the models' tokenizer.json: Llama-2 style normaliser vs Metaspace pre-tokenizer).
KNOWN_PREPEND_SCHEMES: dict[str, PrependScheme] = {
    "meta-llama/llama-2": "always",
    "microsoft/phi-3": "always",
    "mistralai/mixtral": "always",
    "mistralai/mistral-v3": "first",
    "mistralai/codestral": "first",
}

# codec-spec 3.1 / 6.1: ids are lowercase "org/family" paths.
_ID_RE = re.compile(r"^[a-z0-9._/-]+$")
_HASH_RE = re.compile(r"^(?i:sha256:)?([0-9a-fA-F]{64})$")
_HASH_PREFIX_RE = re.compile(r"^([A-Za-z0-9-]+):")

_json_decoder = msgspec.json.Decoder()


def sha256_hash(data: bytes) -> str:
    """``sha256:<lowercase hex>`` of raw bytes: the content address of maps and dicts."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def parse_hash(value: str) -> str:
    """Normalise a hash string to ``sha256:<lowercase hex>``.

    Accepts the bare 64-hex form and upper-case hex (codec-spec 3.2). Any other algorithm
    or shape raises :class:`HashFormatError`.
    """
    if not isinstance(value, str):
        raise HashFormatError(f"hash must be a string, got {type(value).__name__}")
    text = value.strip()
    m = _HASH_RE.match(text)
    if m is None:
        prefix = _HASH_PREFIX_RE.match(text)
        if prefix and prefix.group(1).lower() != "sha256":
            raise HashFormatError(f"unsupported hash algorithm {prefix.group(1)!r}; only sha256")
        raise HashFormatError(f"not a sha256 hash: {value!r} (want sha256:<64 hex digits>)")
    return "sha256:" + m.group(1).lower()


def format_hash(hex_digest: str) -> str:
    return parse_hash(hex_digest)


def validate_map_id(map_id: str) -> str:
    """Check an id before it is used to build a URL or a path (codec-spec 6.1)."""
    if not isinstance(map_id, str) or not map_id:
        raise MapValidationError("id", "must be a non-empty string")
    if not _ID_RE.match(map_id):
        raise MapValidationError("id", f"{map_id!r} must match [a-z0-9._/-]+")
    if ".." in map_id or map_id.startswith("/") or map_id.endswith("/"):
        raise MapValidationError("id", f"{map_id!r} must not contain '..' or start/end with '/'")
    return map_id


#: The highest id a map may give a token. The decode tables are lists indexed by id
#: (detokenizer.py), so one id of 2**31 in a 60-byte map asked for lists of 16 GiB. The
#: largest vocabularies in use are ~262k (Gemma 3), and a map within the clients' 64 MiB
#: cap holds at most ~6M entries: this refuses sparse ids, never a real vocabulary.
MAX_TOKEN_ID = 2**23 - 1

# keys_by_id is a list while the ids are this dense (real maps: ~1 slot per key, cl100k's
# holes aside), so a map whose ids run far past its size cannot make it allocate a huge one.
_MAX_SLOTS_PER_KEY = 4


@dataclass(frozen=True, eq=False, slots=True)
class TokenizerMap:
    """A parsed, validated tokenizer map. Immutable; identity is ``hash``."""

    raw: bytes = field(repr=False)
    hash: str
    id: str
    version: str
    vocab_size: int
    vocab: dict[str, int] = field(repr=False)
    encoder: Encoder
    merges: list[str] = field(repr=False)
    pre_tokenizer_pattern: str | None
    pre_tokenizer_program: dict[str, Any] | None = field(repr=False)
    byte_fallback: tuple[int, int] | None
    special_tokens: dict[str, int] = field(repr=False)
    tool_calling: dict[str, Any] | None = field(repr=False)
    zstd_dictionaries: list[dict[str, Any]] = field(repr=False)
    metaspace_prepend_scheme: PrependScheme
    extra: dict[str, Any] = field(repr=False)
    # Values derived from the (immutable) fields, computed on first use: max_id,
    # keys_by_id.
    _derived: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    @property
    def max_id(self) -> int:
        found = self._derived.get("max_id")
        if found is None:
            found = self._derived["max_id"] = max(
                max(self.vocab.values(), default=-1), max(self.special_tokens.values(), default=-1)
            )
        return found

    def keys_by_id(self) -> list[str | None] | None:
        """id -> vocab key as a list (``None`` at a hole; of keys sharing an id, the last,
        as the decode tables have it), filled the first time it is asked for (measured 1/3
        faster than a dict); ``None`` when the ids are too sparse for a list. The starter
        paths that encode and decode while the fast ones are built share it (issue 15:
        tokenizer.py ``_aligned_base``, detokenizer.py ``_Starter``)."""
        if "keys_by_id" not in self._derived:
            size, vocab, table = self.max_id + 1, self.vocab, None
            if size <= _MAX_SLOTS_PER_KEY * len(vocab) + 1024:
                table = [None] * size
                # A plain loop: Python 3.11 specialises `table[i] = key` for a list and an
                # int, 2-3x faster in a fresh process than the C-level
                # map(table.__setitem__, ...), which calls through a method wrapper
                # (cl100k: ~2 ms against ~6; issue 15, BENCHMARKS.md "Third pass").
                for key, i in vocab.items():
                    table[i] = key
            self._derived["keys_by_id"] = table
        return self._derived["keys_by_id"]

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset(self.special_tokens.values())

    def to_dict(self) -> dict[str, Any]:
        """The document as parsed (including unknown keys)."""
        return _json_decoder.decode(self.raw)


_KNOWN_KEYS = {
    "id", "version", "vocab_size", "vocab", "tokens", "encoder", "merges",
    "pre_tokenizer_pattern", "pre_tokenizer_program", "byte_fallback_start",
    "byte_fallback_end", "special_tokens", "tool_calling", "zstd_dictionaries",
    "metaspace_prepend_scheme",
}  # fmt: skip

# The usual document in one typed decode: msgspec checks in C, while parsing, what the
# Python passes over `vocab` and `merges` check after an untyped decode (every id a
# non-negative int, bools refused; every merge a string), which were ~1/10 of map
# load-to-ready (issue 15). Any other key, `published_at` aside (the published maps carry
# it; it lands in `extra`), sends the document down the untyped path, as does any fault.
_NonNegativeId = Annotated[int, msgspec.Meta(ge=0)]
_CHECKED_TYPES: dict[str, Any] = {
    "vocab": dict[str, _NonNegativeId] | msgspec.UnsetType,
    "merges": list[str] | msgspec.UnsetType,
}
_CheckedDocument = msgspec.defstruct(
    "_CheckedDocument",
    [(key, _CHECKED_TYPES.get(key, Any), msgspec.UNSET)
     for key in sorted(_KNOWN_KEYS | {"published_at"})],
    forbid_unknown_fields=True,
)  # fmt: skip
_checked_decoder = msgspec.json.Decoder(_CheckedDocument)


def load_map_bytes(
    data: bytes, *, expected_hash: str | None = None, source: str = ""
) -> TokenizerMap:
    """Parse and validate a map from its raw bytes.

    ``expected_hash`` (any form :func:`parse_hash` accepts) is checked against the sha256
    of ``data`` before anything is parsed: the hash is the trust anchor, the bytes are not.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError("load_map_bytes wants the raw bytes of the map")
    data = bytes(data)
    actual = sha256_hash(data)
    if expected_hash is not None:
        expected = parse_hash(expected_hash)
        if expected != actual:
            raise MapHashMismatch(expected, actual, source)
    try:
        doc = _decode_checked(data)
        checked = doc is not None
        if doc is None:  # not the usual shape: parse again, untyped, to name the fault
            doc = _json_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise MapValidationError("<document>", f"is not valid JSON: {exc}") from exc
    except RecursionError:  # msgspec recurses per level: a peer's `[[[[...` (peer_json.py)
        raise MapValidationError("<document>", "nests deeper than Python's recursion limit") \
            from None
    if not isinstance(doc, dict):
        raise MapValidationError("<document>", "must be a JSON object")
    return _from_document(doc, data, actual, checked=checked)


def _decode_checked(data: bytes) -> dict[str, Any] | None:
    """The document, its ``vocab`` and ``merges`` already checked by the typed decoder;
    ``None`` for anything else (not JSON, not an object, an unknown key, an id or a merge of
    another type, ``"merges": null``...). Where it succeeds it holds the very values the
    untyped decode gives: the typed decoder accepts a subset of what that one does, value
    for value (a repeated key: the last one, as there)."""
    try:
        doc = _checked_decoder.decode(data)
    except msgspec.MsgspecError:
        return None
    return {key: value for key in doc.__struct_fields__
            if (value := getattr(doc, key)) is not msgspec.UNSET}  # fmt: skip


def _from_document(
    doc: dict[str, Any], raw: bytes, digest: str, *, checked: bool = False
) -> TokenizerMap:
    """``checked``: ``vocab`` and ``merges``, where present, came through the typed decoder
    (:func:`_decode_checked`), so their per-entry checks have been made."""
    map_id = validate_map_id(_require(doc, "id", str))
    version = doc.get("version", "1")
    if not isinstance(version, str):
        raise MapValidationError("version", "must be a string")
    vocab = doc["vocab"] if checked and "vocab" in doc else _vocab(doc)
    vocab_size = _require(doc, "vocab_size", int)
    if isinstance(vocab_size, bool) or vocab_size < 1:
        raise MapValidationError("vocab_size", "must be an integer >= 1")

    encoder = doc.get("encoder") or "identity"
    if encoder not in ENCODERS:
        raise MapValidationError("encoder", f"must be one of {ENCODERS} or absent, got {encoder!r}")

    merges = doc.get("merges") or []
    if not checked and not (isinstance(merges, list) and all(isinstance(m, str) for m in merges)):
        raise MapValidationError("merges", "must be a list of 'left right' strings")

    pattern = doc.get("pre_tokenizer_pattern")
    if pattern is not None and not isinstance(pattern, str):
        raise MapValidationError("pre_tokenizer_pattern", "must be a string")
    program = doc.get("pre_tokenizer_program")
    if program is not None:
        if not isinstance(program, dict) or "version" not in program:
            raise MapValidationError("pre_tokenizer_program", "must be an object with `version`")
        if not ("ops" in program or "stages" in program):
            raise MapValidationError("pre_tokenizer_program", "needs `ops` (v1) or `stages` (v2)")
    if encoder == "byte_level" and pattern is None and program is None:
        raise MapValidationError(
            "pre_tokenizer_program", "is required for byte_level maps (or pre_tokenizer_pattern)"
        )

    fallback = _byte_fallback(doc)
    special = doc.get("special_tokens") or {}
    if not isinstance(special, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
        for k, v in special.items()
    ):
        raise MapValidationError("special_tokens", "must map token strings to non-negative ids")

    tops = {"vocab": max(vocab.values(), default=-1),
            "special_tokens": max(special.values(), default=-1)}
    for name, top in tops.items():
        if top > MAX_TOKEN_ID:
            raise MapValidationError(name, f"uses id {top}; ids go up to {MAX_TOKEN_ID}")

    tool_calling = doc.get("tool_calling")
    if tool_calling is not None:
        _check_tool_calling(tool_calling, special)

    dicts = doc.get("zstd_dictionaries") or []
    if not isinstance(dicts, list):
        raise MapValidationError("zstd_dictionaries", "must be a list")
    for i, entry in enumerate(dicts):
        _check_dict_entry(i, entry)

    scheme = doc.get("metaspace_prepend_scheme") or KNOWN_PREPEND_SCHEMES.get(map_id, "always")
    if scheme not in ("always", "first", "never"):
        raise MapValidationError("metaspace_prepend_scheme", "must be always, first or never")

    tmap = TokenizerMap(
        raw=raw,
        hash=digest,
        id=map_id,
        version=version,
        vocab_size=vocab_size,
        vocab=vocab,
        encoder=encoder,
        merges=merges,
        pre_tokenizer_pattern=pattern,
        pre_tokenizer_program=program,
        byte_fallback=fallback,
        special_tokens=dict(special),
        tool_calling=tool_calling,
        zstd_dictionaries=list(dicts),
        metaspace_prepend_scheme=scheme,
        extra={k: v for k, v in doc.items() if k not in _KNOWN_KEYS},
    )
    tmap._derived["max_id"] = max(tops.values())  # the decode tables need it next
    return tmap


def _require(doc: dict[str, Any], key: str, typ: type) -> Any:
    if key not in doc:
        raise MapValidationError(key, "is missing")
    value = doc[key]
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise MapValidationError(key, f"must be {typ.__name__}, got {type(value).__name__}")
    return value


def _vocab(doc: dict[str, Any]) -> dict[str, int]:
    if "vocab" in doc:
        vocab = doc["vocab"]
        if not isinstance(vocab, dict):
            raise MapValidationError("vocab", "must be an object token -> id")
        values = vocab.values()
        # One C-level pass for the common case (49k-200k entries); name the culprit only on
        # failure. `type(v) is int` also rejects bools, which are ints to isinstance.
        if not all(type(v) is int for v in values) or (values and min(values) < 0):
            for key, value in vocab.items():
                if type(value) is not int or value < 0:
                    raise MapValidationError(f"vocab[{key!r}]", "must be a non-negative integer id")
        return vocab
    if "tokens" in doc:  # legacy v1: id-string -> text
        tokens = doc["tokens"]
        if not isinstance(tokens, dict):
            raise MapValidationError("tokens", "must be an object id -> text")
        vocab = {}
        for key, text in tokens.items():
            if not key.isdigit() or not isinstance(text, str):
                raise MapValidationError(f"tokens[{key!r}]", "must map a decimal id to text")
            vocab[text] = int(key)
        return vocab
    raise MapValidationError("vocab", "is missing (a map needs `vocab` or legacy `tokens`)")


def _byte_fallback(doc: dict[str, Any]) -> tuple[int, int] | None:
    start, end = doc.get("byte_fallback_start"), doc.get("byte_fallback_end")
    if start is None and end is None:
        return None
    if start is None or end is None:
        raise MapValidationError("byte_fallback_start", "and byte_fallback_end come as a pair")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end)):
        raise MapValidationError("byte_fallback_start", "and byte_fallback_end must be integers")
    if end - start != 255:
        raise MapValidationError("byte_fallback_end", f"must be start + 255, got {start}..{end}")
    return (start, end)


def _check_tool_calling(block: Any, special: dict[str, int]) -> None:
    if not isinstance(block, dict):
        raise MapValidationError("tool_calling", "must be an object")
    markers = block.get("markers")
    if not isinstance(markers, dict):
        raise MapValidationError("tool_calling.markers", "must be an object with start and end")
    for which in ("start", "end"):
        name = markers.get(which)
        if not isinstance(name, str):
            raise MapValidationError(f"tool_calling.markers.{which}", "must be a string")
        if name not in special:
            raise MapValidationError(
                f"tool_calling.markers.{which}", f"{name!r} is not a key of special_tokens"
            )


def _check_dict_entry(i: int, entry: Any) -> None:
    where = f"zstd_dictionaries[{i}]"
    if not isinstance(entry, dict):
        raise MapValidationError(where, "must be an object")
    if entry.get("format") not in ("msgpack", "protobuf", "msgpack-delta", "protobuf-delta"):
        raise MapValidationError(f"{where}.format", "must name a stream format")
    if not isinstance(entry.get("url"), str):
        raise MapValidationError(f"{where}.url", "must be a string")
    try:
        parse_hash(entry.get("hash", ""))
    except HashFormatError as exc:
        raise MapValidationError(f"{where}.hash", str(exc)) from exc


def load_map_file(path: str | Path, *, expected_hash: str | None = None) -> TokenizerMap:
    p = Path(path)
    return load_map_bytes(p.read_bytes(), expected_hash=expected_hash, source=str(p))


# --- bundled maps and aliases ---------------------------------------------------------

def bundled_map_path(map_id: str) -> Path:
    """Path of a map shipped inside the package (``tokenwire/data/maps/<id>.json``)."""
    validate_map_id(map_id)
    path = Path(str(resources.files("tokenwire") / "data" / "maps" / f"{map_id}.json"))
    if not path.is_file():
        raise MapNotFound(f"no bundled map {map_id!r}")
    return path


_aliases: dict[str, str] | None = None

#: Model ids the codec-maps ``aliases.json`` lacks, for the maps we ship: the instruct and
#: 1.7B SmolLM2 checkpoints share the base models' tokenizer (and llama.cpp/Ollama name the
#: GGUF after them, so an upstream lists these names).
EXTRA_ALIASES: dict[str, str] = {
    f"HuggingFaceTB/SmolLM2-{size}{kind}": "huggingfacetb/smollm2"
    for size in ("135M", "360M", "1.7B") for kind in ("", "-Instruct")
}


def aliases() -> dict[str, str]:
    """Hugging Face model id -> map id: the codec-maps ``aliases.json`` plus
    :data:`EXTRA_ALIASES`."""
    global _aliases
    if _aliases is None:
        raw = (resources.files("tokenwire") / "data" / "aliases.json").read_bytes()
        table = {k: v for k, v in _json_decoder.decode(raw).items() if not k.startswith("_")}
        _aliases = {**EXTRA_ALIASES, **table}
    return _aliases


def resolve_alias(name: str) -> str:
    """Map a Hugging Face model id (case-insensitive) or a map id to a map id."""
    table = aliases()
    if name in table:
        return table[name]
    lowered = {k.lower(): v for k, v in table.items()}
    if name.lower() in lowered:
        return lowered[name.lower()]
    if _ID_RE.match(name) and "/" in name:
        return name
    raise MapNotFound(f"{name!r} is neither a known model alias nor a map id")


class MapCache:
    """Maps by content hash. Maps are immutable, so entries never expire; the cap bounds
    memory when a peer keeps naming new maps (least recently used goes first)."""

    def __init__(self, max_entries: int = 16) -> None:
        self._max = max_entries
        self._maps: dict[str, TokenizerMap] = {}

    def get(self, digest: str) -> TokenizerMap | None:
        key = parse_hash(digest)
        found = self._maps.pop(key, None)
        if found is not None:
            self._maps[key] = found  # move to the most-recent end
        return found

    def put(self, tmap: TokenizerMap) -> TokenizerMap:
        self._maps.pop(tmap.hash, None)
        self._maps[tmap.hash] = tmap
        while len(self._maps) > self._max:
            del self._maps[next(iter(self._maps))]
        return tmap

    def load_bytes(self, data: bytes, *, expected_hash: str | None = None) -> TokenizerMap:
        if expected_hash is not None:
            hit = self.get(expected_hash)
            if hit is not None:
                return hit
        return self.put(load_map_bytes(data, expected_hash=expected_hash))

    def __contains__(self, digest: str) -> bool:
        return parse_hash(digest) in self._maps

    def __len__(self) -> int:
        return len(self._maps)
