"""Token ids -> text, in bulk or as a stream, equal to Hugging Face ``tokenizers`` decode.

codec-spec §3.3 defines the three vocab encodings; this module turns each into one
``list[bytes]`` indexed by id, built once per map (keyed by the map's content hash), so
bulk decoding is a C-speed ``b"".join`` plus one UTF-8 decode (peer-bench §3: ~25x the
reference client). Streams keep partial UTF-8 across feeds with the stdlib incremental
decoder: a frame boundary is never a rendering boundary (§3.3), and U+FFFD appears only
for bytes that are really invalid, one per maximal invalid subpart, exactly like Rust's
``String::from_utf8_lossy`` that HF uses. So ``[E2 'A' 'B' 'C']`` is ``'\\ufffdABC'``; the
reference client drops the valid bytes after the bad one (peer-bench §1).

Per encoder (each matches the decoder HF builds for that family):

* byte_level: vocab keys through :data:`~tokenwire.codec.byte_level.CHAR_TO_BYTE`; a key
  with a character outside the table contributes its own UTF-8 (HF ``ByteLevel`` does the
  same for added tokens).
* metaspace: ``▁`` -> space; ids in ``[byte_fallback_start, byte_fallback_end]`` are raw
  bytes. HF's decoder is ``Sequence[Replace("▁", " "), ByteFallback, Fuse, Strip(" ", 1, 0)]``
  for both ``metaspace_prepend_scheme`` "always" and "first" (a bare ``Metaspace`` decoder
  cannot read ``<0xHH>`` pieces, so byte-fallback models always get the sequence). Two
  consequences: ONE leading space of the whole output is stripped (§9.1 item 18; the
  reference client keeps it), and a run of consecutive byte tokens that is not valid UTF-8
  as a whole becomes one U+FFFD *per byte of the run* (``ByteFallback``'s rule). Special
  ids hidden from the output do not break a run, because HF drops them before decoding.
  Streams therefore hold a byte run until a text token (or ``flush``) ends it. Scheme
  "never" has no strip.
* identity: the vocab key's UTF-8.

Special-token ids are hidden unless ``render_special``. Unknown ids (past the last id, or a
hole such as cl100k's 100261..100275, or negative) decode to U+FFFD; HF silently skips them,
which hides corrupt streams. This is the only intended difference from HF.
"""

from __future__ import annotations

import os
from codecs import utf_8_decode as _utf8_decode
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial

from tokenwire.codec.byte_level import chars_to_bytes, chars_to_bytes_bulk
from tokenwire.codec.maps import TokenizerMap

__all__ = [
    "MAX_CACHED_TABLES",
    "REPLACEMENT",
    "Detokenizer",
    "StreamDecoder",
]

REPLACEMENT = "\ufffd"
_REPLACEMENT_BYTES = REPLACEMENT.encode()
# The piece of ids the map does not define: U+FFFD, but a distinct object so that
# ``token_bytes`` can tell it (by identity) from a vocab key that really is U+FFFD.
_UNKNOWN = bytes(bytearray(_REPLACEMENT_BYTES))
_METASPACE = "\u2581"

# Tables for a 100k-vocab map take ~10 MB; a process rarely talks to more than a few
# models, and maps are immutable, so a small LRU keyed by content hash is enough.
MAX_CACHED_TABLES = 8


@dataclass(frozen=True, slots=True, eq=False)
class _Tables:
    """Decoding tables of one map, indexed by id (holes hold the U+FFFD piece)."""

    hidden: list[bytes]  # special ids -> b""
    shown: list[bytes]  # special ids -> their text
    hidden_text: list[str] | None  # metaspace with byte fallback: str pieces for streams
    shown_text: list[str] | None
    byte_range: tuple[int, int] | None  # ids decoded by ByteFallback's run rule
    strip_first_space: bool  # HF Strip(" ", 1, 0): one leading space of the whole output


_cache: dict[str, _Tables] = {}
# Maps whose tables a ``defer`` was asked to build (hash -> the pid that asked: a forked
# child has no builder thread), and their per-id decoders.
_deferred: dict[str, int] = {}
_starters: dict[str, _Starter] = {}
#: Runs a build later, e.g. on a thread (``tokenwire.background.in_background``).
Defer = Callable[[Callable[[], object]], object]


def _tables_for(tmap: TokenizerMap, defer: Defer | None = None) -> _Tables | None:
    """The map's tables, built now if need be; with ``defer``, ``None`` until the build it
    was handed has run (it is handed one per map)."""
    found = _cache.get(tmap.hash)
    if found is not None:
        _cache[tmap.hash] = _cache.pop(tmap.hash, found)  # most recently used at the end
        return found
    if defer is None:
        return _build_and_cache(tmap)
    asked = _deferred.get(tmap.hash)
    if asked is None:
        _deferred[tmap.hash] = os.getpid()
        defer(partial(_build_and_cache, tmap))
    elif asked != os.getpid():
        return _build_and_cache(tmap)
    return None


def _build_and_cache(tmap: TokenizerMap) -> _Tables:
    found = _build_tables(tmap)
    while len(_cache) >= MAX_CACHED_TABLES:
        _cache.pop(next(iter(_cache), ""), None)  # another thread may evict at once
    _cache[tmap.hash] = found
    _deferred.pop(tmap.hash, None)
    _starters.pop(tmap.hash, None)
    return found


class _Starter:
    """Per-id decoding of a byte_level map while its tables are built: the same pieces as
    :func:`_build_tables` (special overrides, hidden specials, U+FFFD for unknown ids), one
    lookup per id instead of converting the whole vocabulary first."""

    def __init__(self, tmap: TokenizerMap) -> None:
        self._size = tmap.max_id + 1
        table = tmap.keys_by_id()  # shared with the starter encoder's ranks (tokenizer.py)
        # None: a hole; called with 0 <= id < size only
        self._key_of: Callable[[int], str | None] = (
            table.__getitem__ if table is not None
            else dict(zip(tmap.vocab.values(), tmap.vocab, strict=True)).get
        )
        self._specials = frozenset(tmap.special_tokens.values())
        self._override = {i: _key_bytes(tmap, key) for key, i in tmap.special_tokens.items()
                          if tmap.vocab.get(key) != i}  # fmt: skip

    def piece(self, i: int, render_special: bool) -> bytes:
        if not isinstance(i, int):
            raise TypeError(f"token ids are ints, got {type(i).__name__}")
        if not 0 <= i < self._size:
            return _REPLACEMENT_BYTES
        if i in self._specials and not render_special:
            return b""
        found = self._override.get(i)
        if found is not None:
            return found
        key = self._key_of(i)
        if key is None:
            return _REPLACEMENT_BYTES  # a hole in the ids
        raw = chars_to_bytes(key)
        return key.encode() if raw is None else raw

    def decode(self, ids: Iterable[int], render_special: bool) -> str:
        data = b"".join([self.piece(i, render_special) for i in ids])
        return data.decode("utf-8", "replace")  # byte_level: no byte runs, no strip


def _starter_for(tmap: TokenizerMap) -> _Starter:
    found = _starters.get(tmap.hash)
    if found is None:
        found = _starters.setdefault(tmap.hash, _Starter(tmap))
    return found


def _key_bytes(tmap: TokenizerMap, key: str) -> bytes:
    if tmap.encoder == "byte_level":
        raw = chars_to_bytes(key)
        return key.encode() if raw is None else raw
    if tmap.encoder == "metaspace":
        return key.replace(_METASPACE, " ").encode()
    return key.encode()


def _build_tables(tmap: TokenizerMap) -> _Tables:
    size = tmap.max_id + 1
    shown: list[bytes] = [_UNKNOWN] * size
    keys = list(tmap.vocab)
    if tmap.encoder == "byte_level":  # the bulk conversion: load-to-ready time matters
        raws = chars_to_bytes_bulk(keys)
        if None not in raws and list(tmap.vocab.values()) == list(range(len(keys))):
            shown[: len(keys)] = raws  # the usual layout: keys listed in id order, no holes
        else:
            for key, i, raw in zip(keys, tmap.vocab.values(), raws, strict=True):
                shown[i] = key.encode() if raw is None else raw
    else:
        for key, i in tmap.vocab.items():
            shown[i] = _key_bytes(tmap, key)
    for key, i in tmap.special_tokens.items():
        if key not in tmap.vocab or tmap.vocab[key] != i:
            shown[i] = _key_bytes(tmap, key)
    byte_range = None
    if tmap.encoder == "metaspace" and tmap.byte_fallback is not None:
        lo, hi = tmap.byte_fallback
        byte_range = (lo, hi)
        for i in range(lo, min(hi + 1, size)):
            shown[i] = bytes([i - lo])
    hidden = list(shown)
    for i in tmap.special_tokens.values():
        hidden[i] = b""
    hidden_text = shown_text = None
    if byte_range is not None:
        shown_text = [b.decode("utf-8", "replace") for b in shown]
        hidden_text = [b.decode("utf-8", "replace") for b in hidden]
    return _Tables(
        hidden=hidden,
        shown=shown,
        hidden_text=hidden_text,
        shown_text=shown_text,
        byte_range=byte_range,
        strip_first_space=tmap.encoder == "metaspace" and tmap.metaspace_prepend_scheme != "never",
    )


def _lookup(table: Sequence[bytes] | Sequence[str], i: int, unknown: bytes | str) -> bytes | str:
    """One piece with the unknown-id rule; the slow path behind the fast joins."""
    if not isinstance(i, int):
        raise TypeError(f"token ids are ints, got {type(i).__name__}")
    if 0 <= i < len(table):
        return table[i]
    return unknown


def _finish_run(run: bytearray) -> str:
    """HF ``ByteFallback``: a byte run that is valid UTF-8 as a whole becomes its text,
    any other run becomes one U+FFFD per byte."""
    try:
        return run.decode("utf-8")
    except UnicodeDecodeError:
        return REPLACEMENT * len(run)


def _join(table: list[bytes], ids: Sequence[int]) -> bytes:
    try:
        if ids and min(ids) < 0:  # a negative index would silently wrap around
            raise IndexError
        return b"".join([table[i] for i in ids])
    except (IndexError, TypeError):
        return b"".join([_lookup(table, i, _REPLACEMENT_BYTES) for i in ids])  # type: ignore[misc]


def _decode_runs(
    text_table: list[str], lo: int, hi: int, ids: Iterable[int], run: bytearray
) -> str:
    """Metaspace with byte fallback, piece by piece: ``run`` carries the pending bytes."""
    out: list[str] = []
    n = len(text_table)
    for i in ids:
        if lo <= i <= hi:
            run.append(i - lo)
            continue
        piece = text_table[i] if 0 <= i < n else _lookup(text_table, i, REPLACEMENT)
        if not piece:  # hidden special: HF removed it before decoding, the run goes on
            continue
        if run:
            out.append(_finish_run(run))
            run.clear()
        out.append(piece)  # type: ignore[arg-type]
    return "".join(out)


class Detokenizer:
    """Decodes ids of one :class:`TokenizerMap`. Tables are built on first use and shared
    by every Detokenizer of the same map (content hash). With ``defer`` (e.g.
    ``tokenwire.background.in_background``) a byte_level map's tables are built by it, and
    :meth:`decode` looks ids up one by one until then (map load-to-ready, BENCHMARKS.md)."""

    __slots__ = ("_defer", "_map", "_tables")

    def __init__(self, tmap: TokenizerMap, *, defer: Defer | None = None) -> None:
        self._map = tmap
        self._tables: _Tables | None = None
        self._defer = defer if tmap.encoder == "byte_level" else None

    @property
    def map(self) -> TokenizerMap:
        return self._map

    def _t(self) -> _Tables:
        if self._tables is None:
            self._tables = _tables_for(self._map)
        return self._tables

    def decode(self, ids: Iterable[int], *, render_special: bool = False) -> str:
        """All of ``ids`` to text, as HF ``decode(ids, skip_special_tokens=not render_special)``.

        With ``defer``, the first decodes run per id until the deferred build has run;
        streams and :meth:`token_bytes` build the tables at once."""
        t = self._tables
        if t is None:
            t = self._tables = _tables_for(self._map, self._defer)
            if t is None:
                return _starter_for(self._map).decode(ids, render_special)
        if not isinstance(ids, list | tuple):
            ids = list(ids)
        data = _join(t.shown if render_special else t.hidden, ids)
        if t.byte_range is None:
            text = data.decode("utf-8", "replace")
        else:
            try:  # the whole output is valid UTF-8 iff every byte run is: runs sit between
                text = data.decode("utf-8")  # complete characters of text pieces
            except UnicodeDecodeError:
                table = t.shown_text if render_special else t.hidden_text
                assert table is not None
                run = bytearray()
                text = _decode_runs(table, *t.byte_range, ids, run)
                if run:
                    text += _finish_run(run)
        if t.strip_first_space and text.startswith(" "):
            text = text[1:]
        return text

    def stream(self, render_special: bool = False) -> StreamDecoder:
        """A fresh :class:`StreamDecoder` for one generated sequence."""
        return StreamDecoder(self._t(), render_special)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one id contributes to the output, special tokens rendered and no
        leading-space strip. Raises ``KeyError`` for an id the map does not define."""
        table = self._t().shown
        if not isinstance(token_id, int) or not 0 <= token_id < len(table):
            raise KeyError(token_id)
        if table[token_id] is _UNKNOWN:
            raise KeyError(token_id)
        return table[token_id]


class StreamDecoder:
    """Incremental decoding of one sequence: ``feed(ids)`` returns the text those ids
    complete, never half a character; ``flush()`` ends the stream (pending bytes, invalid
    ones as U+FFFD) and resets the decoder for reuse. Concatenated feeds plus ``flush``
    equal :meth:`Detokenizer.decode` of all ids, for any chunking."""

    __slots__ = (
        "_at_start", "_pending", "_range", "_run", "_size", "_strip", "_table", "_text_table",
    )  # fmt: skip

    def __init__(self, tables: _Tables, render_special: bool) -> None:
        self._table = tables.shown if render_special else tables.hidden
        self._size = len(self._table)
        self._text_table = tables.shown_text if render_special else tables.hidden_text
        self._range = tables.byte_range
        self._strip = tables.strip_first_space
        self._reset()

    def _reset(self) -> None:
        self._pending = b""  # an incomplete UTF-8 sequence (at most 3 bytes)
        self._run = bytearray()  # metaspace: the byte-fallback run not yet ended
        self._at_start = self._strip  # Strip applies only to the start of the output

    def feed(self, ids: Iterable[int]) -> str:
        if ids.__class__ is not list and ids.__class__ is not tuple:
            ids = list(ids)
        if self._range is None:
            # The stdlib incremental UTF-8 decoder, inlined: one id per feed is the
            # common case (one token per frame) and the Python wrapper is half its cost.
            if len(ids) == 1:
                i = ids[0]
                data = self._table[i] if 0 <= i < self._size else _join(self._table, ids)
            else:
                data = _join(self._table, ids)
            if self._pending:
                data = self._pending + data
            text, used = _utf8_decode(data, "replace", False)
            self._pending = data[used:] if used != len(data) else b""
        else:
            assert self._text_table is not None
            lo, hi = self._range
            i = ids[0] if len(ids) == 1 and not self._run else -1
            if lo <= i <= hi or not 0 <= i < self._size:
                text = _decode_runs(self._text_table, lo, hi, ids, self._run)
            else:  # one text piece and no byte run to end: the common frame
                text = self._text_table[i]
        if self._at_start and text:
            self._at_start = False
            if text[0] == " ":
                text = text[1:]
        return text

    def flush(self) -> str:
        if self._range is None:
            text = _utf8_decode(self._pending, "replace", True)[0]
        else:
            text = _finish_run(self._run) if self._run else ""
        if self._at_start and text and text[0] == " ":
            text = text[1:]
        self._reset()
        return text
