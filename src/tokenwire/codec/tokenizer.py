"""Text -> token ids, exactly as the model's own tokenizer (Hugging Face `tokenizers`) does it.

codec-spec §3.4 gives the reference algorithm; this module keeps its shape and fixes what
§9.1 items 17-19 list as wrong in the reference client:

* **Special tokens are opt-in** (§10 item 8). Special-token strings inside untrusted text
  are encoded as ordinary text unless the caller names them in ``allowed_special`` (a set
  of token strings, or ``"all"``); matching is leftmost-longest over the map's
  ``special_tokens`` keys, like HF's added-vocabulary split. The reference client always
  turns them into control ids, which is an injection hole.
* **byte_level** pre-tokenizes with the map's ``pre_tokenizer_program`` (preferred) or
  ``pre_tokenizer_pattern`` (§3.4 step 2) and merges with tiktoken when it is installed:
  ranks are the vocab ids of the merge products, which on every shipped map grow in merge
  order, so tiktoken's product-rank BPE picks the same merges as HF's pair-rank BPE and
  returns vocab ids directly (otherwise ranks follow merge order and a list maps them back
  to ids). Peer-bench §3/§4 measured this exact against HF and ~2.5x the reference
  client's cold speed. Without tiktoken the pure-Python :class:`~tokenwire.codec.bpe.BPE`
  does the same work.
* **metaspace** is SentencePiece-exact (:mod:`tokenwire.codec.metaspace`), with the
  Llama-2 vs Mistral-v3 prepend difference taken from ``metaspace_prepend_scheme``; pieces
  are merged by tiktoken where a per-map check proves it gives HF's ids
  (:mod:`tokenwire.codec.metaspace_tiktoken`), in Python otherwise.
* **identity** maps use longest-prefix match over the vocab (§3.4 step 6).
* A byte the vocabulary lacks (SmolLM2 has no token for 0x04, 0x06, 0x13, 0x14, 0x16,
  0x1d, 0xf1, 0xf2; Falcon none for 0x0b) is dropped the way the model's own tokenizer
  drops it (``on_missing="drop"``, HF ``tokenizers``: removed before merging, so its
  neighbours in the piece may merge); ``"drop_after_merge"`` is llama.cpp's way (removed
  after merging, so it keeps its neighbours apart; the two differ on ~2% of texts made of
  such bytes and punctuation); ``"raise"`` refuses with :class:`~tokenwire.errors.VocabMiss`.
* Texts longer than :data:`NATIVE_REGEX_MAX_CHARS` are never given to tiktoken's regex
  whole (its backtracking VM panics on a run of ~1M whitespace characters): they are cut
  into their own pre-tokenizer pieces, which BPE never merges across, so the ids are those
  of the whole text.

``Tokenizer.calls`` counts encoded texts so a caller (the gateway) can assert that a
response was never re-tokenized.
"""

from __future__ import annotations

import importlib
import importlib.util
import operator
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from functools import lru_cache
from itertools import chain, islice
from typing import Literal, Protocol

from tokenwire.codec.bpe import BPE, DEFAULT_CACHE_SIZE, MAX_CACHED_WORD, merge_symbols
from tokenwire.codec.byte_level import (
    BYTE_TO_CHAR,
    CHAR_TO_BYTE,
    chars_to_bytes_bulk,
)
from tokenwire.codec.maps import TokenizerMap
from tokenwire.codec.metaspace import MetaspaceEncoder
from tokenwire.errors import TokenizeError, UnsupportedProgram, VocabMiss

__all__ = [
    "BACKENDS",
    "NATIVE_REGEX_MAX_CHARS",
    "ON_MISSING",
    "AllowedSpecial",
    "Backend",
    "Defer",
    "OnMissing",
    "Tokenizer",
]

Backend = Literal["auto", "tiktoken", "python"]
BACKENDS: tuple[str, ...] = ("auto", "tiktoken", "python")
AllowedSpecial = AbstractSet[str] | Literal["all"]
OnMissing = Literal["drop", "drop_after_merge", "raise"]
#: Runs a build later, e.g. on a thread (``tokenwire.background.in_background``); the codec
#: core never starts threads itself (sans-IO).
Defer = Callable[[Callable[[], None]], object]
ON_MISSING: tuple[str, ...] = ("drop", "drop_after_merge", "raise")

#: Longest text handed to tiktoken's native regex in one call. fancy-regex runs the
#: look-ahead alternatives (``\s+(?!\S)``) in a backtracking VM whose stack holds about one
#: entry per character of the run being matched, and tiktoken turns the VM's StackOverflow
#: (at 1,000,000 entries; measured: 999,523 spaces pass, 1,000,523 panic) into a Rust panic.
#: One match attempt never spans more than the text, so 64 Ki characters stay 15x below it;
#: a longer text is split into its pre-tokenizer pieces in Python (``regex`` keeps its
#: backtracking stack on the heap) and tiktoken merges each piece, which needs no regex.
NATIVE_REGEX_MAX_CHARS = 1 << 16

# Compiled special-token matchers kept per tokenizer; callers use a handful of sets
# (none, "all", the chat-template roles), and the bound stops a caller that builds a new
# set per request from growing the table.
_MAX_SPECIAL_PATTERNS = 32

# latin-1 code point == byte value, so `.decode("latin-1").translate(...)` maps UTF-8
# bytes to GPT-2 byte characters in two C calls.
_LATIN1_TO_GPT2 = str.maketrans({b: c for b, c in enumerate(BYTE_TO_CHAR)})


class _PreTokenizer(Protocol):
    single_regex: str | None

    def split(self, text: str) -> list[str]: ...


class _Engine(Protocol):
    def encode_segment(self, text: str, at_text_start: bool) -> list[int]: ...


class _RegexPreTokenizer:
    """All non-empty ``findall`` pieces of one pattern (used only while
    :mod:`tokenwire.codec.pretok` is unavailable)."""

    def __init__(self, pattern: str) -> None:
        import regex

        self.single_regex: str | None = pattern
        self._findall = regex.compile(pattern).findall

    def split(self, text: str) -> list[str]:
        return [p for p in self._findall(text) if p]


def _pre_tokenizer(tmap: TokenizerMap) -> _PreTokenizer:
    """The map's program if it has one, else its legacy pattern (codec-spec §3.4 step 2)."""
    try:
        pretok = importlib.import_module("tokenwire.codec.pretok")
    except ImportError:
        pretok = None
    program = tmap.pre_tokenizer_program
    if program is not None and ("ops" in program or "stages" in program):
        if pretok is not None:
            return pretok.compile_program(program)
        if tmap.pre_tokenizer_pattern is None:
            raise UnsupportedProgram("pre_tokenizer_program needs tokenwire.codec.pretok")
    if tmap.pre_tokenizer_pattern is not None:
        if pretok is not None:
            return pretok.compile_pattern(tmap.pre_tokenizer_pattern)
        return _RegexPreTokenizer(tmap.pre_tokenizer_pattern)
    raise UnsupportedProgram(f"byte_level map {tmap.id!r} has no pre-tokenizer")


@lru_cache(maxsize=4)  # from_map asks twice (backend choice, then ranks); maps are immutable
def _merge_products(tmap: TokenizerMap) -> list[str]:
    return [line.replace(" ", "", 1) for line in tmap.merges]


def _products_as_bytes(products: list[str]) -> list[bytes]:
    raw = chars_to_bytes_bulk(products)
    if None in raw:
        bad = products[raw.index(None)]
        raise TokenizeError(f"merge product {bad!r} is not written in byte-level characters")
    return raw  # type: ignore[return-value]


class _JoinedPairRanks(Mapping[tuple[str, str], int]):
    """Pair ranks keyed by the merge lines themselves, for the pure-Python engine that
    encodes while tiktoken's core is built, on a map :func:`_aligned_base` refuses (see
    :class:`_AlignedPairRanks`): one C-level dict build, several times cheaper
    than splitting every line into a pair (``bpe.parse_merges``); a lookup pays one string
    join. Exact for byte_level maps, whose symbols never hold a space. The first occurrence
    of a line keeps its rank, as in ``parse_merges``: built forwards (measured 1/4 faster
    than backwards, issue 15), a repeated line keeps its last rank, so a map with one is
    built again backwards."""

    def __init__(self, merges: Sequence[str]) -> None:
        lines = dict(zip(merges, range(len(merges)), strict=True))
        if len(lines) != len(merges):  # a line repeats: the first must keep its rank
            lines = dict(zip(reversed(merges), range(len(merges) - 1, -1, -1), strict=True))
        self._lines = lines

    def get(self, pair: tuple[str, str], default: int | None = None) -> int | None:  # type: ignore[override]
        return self._lines.get(f"{pair[0]} {pair[1]}", default)

    def __getitem__(self, pair: tuple[str, str]) -> int:
        return self._lines[f"{pair[0]} {pair[1]}"]

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return (tuple(line.split(" ", 1)) for line in self._lines)  # type: ignore[misc]

    def __len__(self) -> int:
        return len(self._lines)


class _AlignedPairRanks(Mapping[tuple[str, str], int]):
    """Pair ranks with no table of their own, for a map whose merge ``k`` makes the vocab
    key with id ``base + k`` (every shipped byte_level map: base 252 on SmolLM2, 256 on
    cl100k and r50k, 240 on Falcon), as :func:`_aligned_base` checks. The rank of ``(a, b)``
    is ``k = vocab[a + b] - base`` if ``merges[k]`` is ``"a b"``, else there is none: a
    line ``"a b"`` at any index ``j`` makes ``a + b`` the key with id ``base + j``, so it
    can stand at ``k`` only, once. So for symbols without a space (byte_level) this answers
    as :class:`_JoinedPairRanks`, whose dict of the merge lines was ~1/4 of cl100k's map
    load-to-ready (issue 15); a lookup pays a concatenation and a string compare more."""

    def __init__(self, tmap: TokenizerMap, base: int) -> None:
        self._vocab, self._merges, self._base = tmap.vocab, tmap.merges, base

    def get(self, pair: tuple[str, str], default: int | None = None) -> int | None:  # type: ignore[override]
        a, b = pair
        i = self._vocab.get(a + b)
        if i is None:
            return default
        k = i - self._base
        if 0 <= k < len(self._merges) and self._merges[k] == f"{a} {b}":
            return k
        return default

    def __getitem__(self, pair: tuple[str, str]) -> int:
        found = self.get(pair)
        if found is None:
            raise KeyError(pair)
        return found

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return (tuple(line.split(" ", 1)) for line in self._merges)  # type: ignore[misc]

    def __len__(self) -> int:
        return len(self._merges)


#: Merge lines compared per slice by :func:`_aligned_base`: the joined strings of a slice
#: stay in the CPU cache between the passes over them (one join of the whole list is ~2 MB
#: on cl100k); measured ~1/4 faster than joining everything at once (issue 15).
_ALIGN_CHUNK = 4096


def _aligned_base(tmap: TokenizerMap) -> int | None:
    """``base`` if every ``merges[k]``, its spaces taken out, is the vocab key with id
    ``base + k``; else ``None``. The two sides are compared as joined strings, slice by
    slice: nothing is hashed (hashing and inserting every line is what the dict costs),
    and the id -> key list is the starter decoder's. A newline inside a line fails the
    count, so equal joined strings cut into equal pieces; the keys need no count of their
    own (taking the spaces out leaves the newlines where they were, so equal strings have
    the same ones), which saves a pass over ~0.9 MB (SmolLM2; twice that on cl100k) on
    the ready path."""
    merges, by_id = tmap.merges, tmap.keys_by_id()
    if not merges or by_id is None:
        return None
    base = tmap.vocab.get(merges[0].replace(" ", ""))
    if base is None or base + len(merges) > len(by_id):
        return None
    for lo in range(0, len(merges), _ALIGN_CHUNK):
        chunk = merges[lo : lo + _ALIGN_CHUNK]
        try:
            keys = "\n".join(by_id[base + lo : base + lo + len(chunk)])  # type: ignore[arg-type]
        except TypeError:  # a hole in the ids
            return None
        lines = "\n".join(chunk)
        if lines.count("\n") != len(chunk) - 1 or lines.replace(" ", "") != keys:
            return None
    return base


def _starter_ranks(tmap: TokenizerMap) -> Mapping[tuple[str, str], int]:
    base = _aligned_base(tmap)
    return _JoinedPairRanks(tmap.merges) if base is None else _AlignedPairRanks(tmap, base)


class _TiktokenByteLevel:
    """byte_level BPE in tiktoken's Rust core.

    tiktoken merges the adjacent pair whose *concatenation* has the lowest rank; HF merges
    the pair with the lowest merge index. They agree when every product has one merge and
    ranks grow with merge index, so: single bytes keep any rank (tiktoken never ranks them
    while merging), merge products are ranked in merge order, and only bytes and products
    are given to tiktoken (a vocab token no merge produces must never be formed).

    With ``defer`` (``backend="auto"``) the ranks and the core, ~3/4 of a map's
    load-to-ready time (BENCHMARKS.md), are built when ``defer`` runs :meth:`build` (on a
    thread), and the exact pure-Python engine encodes until then; a map tiktoken cannot rank
    (a repeated product) stays on the Python engine. Steady state is the same code as before.
    """

    def __init__(
        self, tmap: TokenizerMap, pretok: _PreTokenizer, cache_size: int, on_missing: OnMissing,
        *, defer: Defer | None = None,
    ) -> None:  # fmt: skip
        self.map_id = tmap.id
        self.pretok = pretok
        self.on_missing = on_missing
        self.missing = bytes(b for b in range(256) if BYTE_TO_CHAR[b] not in tmap.vocab)
        self.core = None
        self.remap: list[int] | None = None
        self.miss_floor: int | None = None
        self._single_piece: Callable[[bytes], list[int]] | None = None
        self._whole_text: Callable[[str], list[int]] | None = None
        self._piece = lru_cache(maxsize=cache_size)(self._piece_uncached)
        self._starter: _PythonByteLevel | None = None
        self._tmap: TokenizerMap | None = None
        self.unrankable = False  # tiktoken cannot hold the map: the Python engine stays
        if defer is None:
            self._build(tmap)
            return
        self._starter = _PythonByteLevel(tmap, pretok, cache_size, on_missing,
                                         ranks=_starter_ranks(tmap))
        self._tmap = tmap
        self._pid = os.getpid()
        defer(self.build)

    def build(self) -> None:
        """Build the tiktoken engine now unless it is built (idempotent; the result is
        published with one attribute store, so encodes on other threads see all or none)."""
        tmap = self._tmap
        if tmap is None or self._starter is None:
            return
        try:
            self._build(tmap)
        except (TokenizeError, ImportError):  # ImportError: installed, but broken (from_map)
            self.unrankable = True
            return
        self._tmap = None
        self._starter = None  # published last: encode_segment switches on it

    def _build(self, tmap: TokenizerMap) -> None:
        import tiktoken

        ranks, remap, floor = _tiktoken_ranks(tmap)
        core = None
        if self.pretok.single_regex is not None:
            try:
                enc = tiktoken.Encoding(
                    f"tokenwire:{tmap.id}", pat_str=self.pretok.single_regex,
                    mergeable_ranks=ranks, special_tokens={},
                )  # fmt: skip
                core = enc._core_bpe  # skips the wrapper's surrogate repair, see encode
            except ValueError:  # a pattern fancy-regex cannot compile: split in Python
                core = None
        self._ranks, self.remap, self.miss_floor, self.core = ranks, remap, floor, core

    @property
    def backend(self) -> str:
        """"tiktoken", or "python" when tiktoken turned out unable to rank the map."""
        return "python" if self.unrankable else "tiktoken"

    @property
    def built(self) -> bool:
        return self._starter is None or self.unrankable

    def encode_segment(self, text: str, at_text_start: bool) -> list[int]:
        starter = self._starter
        if starter is not None:
            if not self.unrankable and os.getpid() != self._pid:
                self.build()  # a forked child: the thread that was to build it is gone
            starter = self._starter
            if starter is not None:
                return starter.encode_segment(text, at_text_start)
        if self.on_missing == "drop" and self.missing and _has_any(text, self.missing):
            # HF drops the byte before merging: BPE each piece without it.
            ranks = [r for piece in self.pretok.split(text) for r in self._single(
                piece.encode("utf-8").translate(None, self.missing))]  # fmt: skip
        elif (ranks := self._native(text)) is None:
            ranks = _encode_pieces(self.pretok.split(text), self._piece, self._piece_uncached)
        return self._to_ids(ranks)

    def _native(self, text: str) -> list[int] | None:
        """tiktoken's ranks of ``text``, or None where its regex is not to be used: past
        :data:`NATIVE_REGEX_MAX_CHARS`, and where fancy-regex gave up on the map's pattern
        (a pattern that backtracks past its limit: tiktoken unwraps the error into a pyo3
        ``PanicException``, a ``BaseException``). The pieces are then split in Python,
        where a map's own pattern runs within a time budget (pretok.compile_pattern)."""
        if self.core is None or len(text) > NATIVE_REGEX_MAX_CHARS:
            return None
        try:
            return self.core.encode_ordinary(text)
        except BaseException as exc:
            if type(exc).__name__ != "PanicException":
                raise
            return None

    def _to_ids(self, ranks: list[int]) -> list[int]:
        """tiktoken ranks -> vocab ids; a missing byte (see _tiktoken_ranks) is dropped or
        refused per ``on_missing``."""
        floor = self.miss_floor
        if self.remap is not None:
            remap = self.remap
            ids = [remap[r] for r in ranks]
            if floor is not None and -1 in ids:
                if self.on_missing == "raise":  # a missing byte keeps rank == its value
                    raise VocabMiss(chr(ranks[ids.index(-1)]), self.map_id)
                ids = [t for t in ids if t != -1]
            return ids
        if floor is not None and ranks and max(ranks) >= floor:
            if self.on_missing == "raise":
                first = next(t for t in ranks if t >= floor)
                raise VocabMiss(chr(first - floor), self.map_id)
            return [t for t in ranks if t < floor]
        return ranks

    def _single(self, data: bytes) -> list[int]:
        if self._single_piece is None:  # built on first use: most texts never need it
            import tiktoken

            enc = tiktoken.Encoding(
                f"tokenwire:{self.map_id}:pieces", pat_str=r"(?s:.+)",
                mergeable_ranks=self._ranks, special_tokens={},
            )  # fmt: skip
            self._whole_text = enc._core_bpe.encode_ordinary
            self._single_piece = enc._core_bpe.encode_single_piece
        if len(data) > MAX_CACHED_WORD and self._whole_text is not None:
            # tiktoken's encode_single_piece keeps the GIL for the whole merge: one piece
            # near 8 MB (a run of spaces) held it ~8 s, stalling every thread, the event
            # loop included (POST /tokenize). encode_ordinary releases it; with the pattern
            # ``(?s:.+)`` its one piece is the whole text, so the ranks are the same. It
            # wants str: bytes that are not UTF-8 (a byte dropped mid-character) keep the
            # single-piece call. Short pieces keep it too (no GIL round trip per word).
            try:
                return self._whole_text(data.decode("utf-8"))
            except UnicodeDecodeError:
                pass
        return self._single_piece(data) if data else []

    def _piece_uncached(self, piece: str) -> tuple[int, ...]:
        return tuple(self._single(piece.encode("utf-8")))


def _has_any(text: str, missing: bytes) -> bool:
    data = text.encode("utf-8")
    return len(data.translate(None, missing)) != len(data)


def _encode_pieces(
    pieces: list[str],
    cached: Callable[[str], tuple[int, ...]],
    uncached: Callable[[str], tuple[int, ...]],
) -> list[int]:
    """Concatenated ids of ``pieces``; the common case runs as one C-level loop."""
    if not pieces:
        return []
    if max(map(len, pieces)) <= MAX_CACHED_WORD:
        return list(chain.from_iterable(map(cached, pieces)))
    return list(chain.from_iterable(
        cached(p) if len(p) <= MAX_CACHED_WORD else uncached(p) for p in pieces
    ))  # fmt: skip


def _tiktoken_ranks(tmap: TokenizerMap) -> tuple[dict[bytes, int], list[int] | None, int | None]:
    """(mergeable ranks, rank -> id list or None when ranks are ids, miss marker)."""
    vocab = tmap.vocab
    products = _merge_products(tmap)
    if _has_repeated_product(tmap):
        raise TokenizeError(f"map {tmap.id!r}: a merge product repeats; tiktoken cannot rank it")
    product_ids = list(map(vocab.__getitem__, products))
    product_bytes = _products_as_bytes(products)
    missing = [b for b in range(256) if BYTE_TO_CHAR[b] not in vocab]
    ranks: dict[bytes, int] = {}
    if all(map(operator.lt, product_ids, islice(product_ids, 1, None))):  # ids rise
        top = max(vocab.values()) + 1
        for b in range(256):
            ranks[bytes([b])] = vocab.get(BYTE_TO_CHAR[b], top + b)
        ranks.update(zip(product_bytes, product_ids, strict=True))
        return ranks, None, (top if missing else None)
    remap: list[int] = []
    for b in range(256):
        ranks[bytes([b])] = b
        remap.append(vocab.get(BYTE_TO_CHAR[b], -1))
    ranks.update(zip(product_bytes, range(256, 256 + len(products)), strict=True))
    remap.extend(product_ids)
    return ranks, remap, (-1 if missing else None)


class _PythonByteLevel:
    """byte_level BPE in pure Python (the fallback when tiktoken is absent)."""

    def __init__(
        self, tmap: TokenizerMap, pretok: _PreTokenizer, cache_size: int, on_missing: OnMissing,
        ranks: Mapping[tuple[str, str], int] | None = None,
    ) -> None:  # fmt: skip
        self.map_id = tmap.id
        self.split = pretok.split
        self.on_missing = on_missing
        self.bpe = BPE(tmap.vocab, tmap.merges, map_id=tmap.id, cache_size=0, ranks=ranks)
        missing = [BYTE_TO_CHAR[b] for b in range(256) if BYTE_TO_CHAR[b] not in tmap.vocab]
        self._drop_missing = str.maketrans(dict.fromkeys(missing)) if missing else None
        self._piece = lru_cache(maxsize=cache_size)(self._piece_uncached)

    def encode_segment(self, text: str, at_text_start: bool) -> list[int]:
        return _encode_pieces(self.split(text), self._piece, self._piece_uncached)

    def _piece_uncached(self, piece: str) -> tuple[int, ...]:
        word = piece.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_GPT2)
        if self._drop_missing is not None and self.on_missing != "raise":
            if self.on_missing == "drop":  # HF: gone before merging
                return self.bpe.encode_uncached(word.translate(self._drop_missing))
            vocab = self.bpe.vocab  # llama.cpp: merged around, then dropped
            return tuple(vocab[s] for s in merge_symbols(list(word), self.bpe.ranks) if s in vocab)
        try:
            return self.bpe.encode_uncached(word)
        except VocabMiss as exc:
            raw = bytes(CHAR_TO_BYTE[c] for c in exc.symbol if c in CHAR_TO_BYTE)
            raise VocabMiss(raw.decode("latin-1"), self.map_id) from exc


class _Metaspace:
    def __init__(self, tmap: TokenizerMap, cache_size: int, backend: Backend) -> None:
        native = {"auto": "auto", "tiktoken": True, "python": False}[backend]
        self.encoder = MetaspaceEncoder(tmap, cache_size=cache_size, native=native)  # type: ignore[arg-type]

    @property
    def backend(self) -> str:  # "auto" switches to tiktoken once the tokenizer is busy
        return "tiktoken" if self.encoder.native else "python"

    def encode_segment(self, text: str, at_text_start: bool) -> list[int]:
        return self.encoder.encode_segment(text, at_text_start=at_text_start)


class _Identity:
    """Longest-prefix match over the vocab (codec-spec §3.4 step 6). Special-token keys are
    left out: they match only through ``allowed_special``. An unknown character raises
    (the reference client emits id 0 for it)."""

    def __init__(self, tmap: TokenizerMap) -> None:
        self.map_id = tmap.id
        specials = tmap.special_tokens
        self.vocab = {k: v for k, v in tmap.vocab.items() if k and k not in specials}
        self.max_len = max(map(len, self.vocab), default=0)

    def encode_segment(self, text: str, at_text_start: bool) -> list[int]:
        vocab, out, i, n = self.vocab, [], 0, len(text)
        while i < n:
            for length in range(min(self.max_len, n - i), 0, -1):
                tid = vocab.get(text[i : i + length])
                if tid is not None:
                    out.append(tid)
                    i += length
                    break
            else:
                raise VocabMiss(text[i], self.map_id)
        return out


def _tiktoken_available(*, import_now: bool = True) -> bool:
    """Whether tiktoken can be used. ``import_now=False`` only looks for it: importing it is
    ~5 ms of a fresh process's first load, which a deferred build pays on the builder."""
    if not import_now:
        return importlib.util.find_spec("tiktoken") is not None
    try:
        importlib.import_module("tiktoken")
    except ImportError:
        return False
    return True


@lru_cache(maxsize=4)
def _has_repeated_product(tmap: TokenizerMap) -> bool:
    products = _merge_products(tmap)
    return len(set(products)) != len(products)


class Tokenizer:
    """Encodes text to the ids the model's own tokenizer would produce.

    Build with :meth:`from_map`. ``backend`` is the engine in use (``"tiktoken"``,
    ``"python"``; a metaspace map under ``"auto"`` starts in Python and moves to tiktoken
    once busy, :data:`~tokenwire.codec.metaspace.NATIVE_AFTER_MISSES`); ``calls`` counts
    encoded texts.
    """

    def __init__(self, tmap: TokenizerMap, engine: _Engine, backend: str) -> None:
        self.map = tmap
        self._backend = backend
        self.calls = 0
        self._engine = engine
        self._specials = dict(tmap.special_tokens)
        self._patterns: dict[frozenset[str], re.Pattern[str]] = {}

    @classmethod
    def from_map(
        cls,
        tmap: TokenizerMap,
        backend: Backend = "auto",
        *,
        cache_size: int = DEFAULT_CACHE_SIZE,
        on_missing: OnMissing = "drop",
        defer: Defer | None = None,
    ) -> Tokenizer:
        """A tokenizer for ``tmap``. ``"auto"`` uses tiktoken for byte_level maps when it
        is installed and exact for the map, the pure-Python engine otherwise.

        ``on_missing`` says what happens to a byte a byte_level vocab has no token for:
        ``"drop"`` (HF ``tokenizers``, the default), ``"drop_after_merge"`` (llama.cpp) or
        ``"raise"`` (:class:`VocabMiss`). Metaspace maps use byte fallback; identity maps
        always raise.

        ``defer`` (e.g. ``tokenwire.background.in_background``) takes the tiktoken build of
        ``"auto"`` off the caller: the exact pure-Python engine encodes until ``defer`` has
        run it (map load-to-ready, BENCHMARKS.md). It also takes the pre-tokenizer's sweep of
        the ``regex`` module's Unicode tables (codec/pinned_regex.py), queued after the core;
        exact answers until then."""
        tok = cls._from_map_now(tmap, backend, cache_size, on_missing, defer)
        if defer is not None:
            try:
                pinned = importlib.import_module("tokenwire.codec.pinned_regex")
            except ImportError:  # no regex module: no PinnedRegex to sweep for
                pinned = None
            if pinned is not None:
                pinned.defer_dispute_sweep(defer)
        return tok

    @classmethod
    def _from_map_now(
        cls, tmap: TokenizerMap, backend: Backend, cache_size: int, on_missing: OnMissing,
        defer: Defer | None,
    ) -> Tokenizer:  # fmt: skip
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if on_missing not in ON_MISSING:
            raise ValueError(f"on_missing must be one of {ON_MISSING}, got {on_missing!r}")
        if tmap.encoder == "byte_level":
            pretok = _pre_tokenizer(tmap)
            if backend == "tiktoken":
                engine: _Engine = _TiktokenByteLevel(tmap, pretok, cache_size, on_missing)
                return cls(tmap, engine, "tiktoken")
            if backend == "auto" and _tiktoken_available(import_now=defer is None):
                if defer is not None:  # ready at once on the Python engine, tiktoken once built
                    engine = _TiktokenByteLevel(tmap, pretok, cache_size, on_missing, defer=defer)
                    return cls(tmap, engine, "tiktoken")
                if not _has_repeated_product(tmap):
                    engine = _TiktokenByteLevel(tmap, pretok, cache_size, on_missing)
                    return cls(tmap, engine, "tiktoken")
            return cls(tmap, _PythonByteLevel(tmap, pretok, cache_size, on_missing), "python")
        if tmap.encoder == "metaspace":
            return cls(tmap, _Metaspace(tmap, cache_size, backend), "python")
        if backend == "tiktoken":
            raise TokenizeError(f"the tiktoken backend needs a BPE map, not {tmap.encoder}")
        return cls(tmap, _Identity(tmap), "python")

    @property
    def backend(self) -> str:
        """The engine in use: a metaspace map under "auto" moves to tiktoken once busy; a
        byte_level map loaded with ``defer`` reports "tiktoken" (its steady state), or "python"
        if tiktoken turned out unable to rank it."""
        return getattr(self._engine, "backend", self._backend)

    @property
    def built(self) -> bool:
        """False while a deferred build (``from_map(defer=...)``) has not run yet."""
        return getattr(self._engine, "built", True)

    def build(self) -> None:
        """Run a deferred build now, if it has not run (idempotent)."""
        build = getattr(self._engine, "build", None)
        if build is not None:
            build()

    def encode(self, text: str, *, allowed_special: AllowedSpecial = frozenset()) -> list[int]:
        """The ids of ``text``. Special-token strings are plain text unless allowed."""
        if not isinstance(text, str):
            raise TypeError(f"encode wants str, got {type(text).__name__}")
        self.calls += 1
        try:
            if not allowed_special:
                return self._engine.encode_segment(text, True)
            return self._encode_with_specials(text, self._special_pattern(allowed_special))
        except UnicodeEncodeError as exc:  # lone surrogates have no UTF-8 form
            raise TokenizeError(f"text is not valid Unicode: {exc.reason}") from exc

    def encode_batch(
        self, texts: Iterable[str], *, allowed_special: AllowedSpecial = frozenset()
    ) -> list[list[int]]:
        return [self.encode(t, allowed_special=allowed_special) for t in texts]

    def _encode_with_specials(self, text: str, pattern: re.Pattern[str]) -> list[int]:
        # Segments between specials are encoded on their own, as HF does after splitting
        # off added tokens; only the one at offset 0 counts as the start of the text.
        engine, specials = self._engine, self._specials
        out: list[int] = []
        pos = 0
        for m in pattern.finditer(text):
            if m.start() > pos:
                out.extend(engine.encode_segment(text[pos : m.start()], pos == 0))
            out.append(specials[m.group()])
            pos = m.end()
        if pos < len(text):
            out.extend(engine.encode_segment(text[pos:], pos == 0))
        return out

    def _special_pattern(self, allowed: AllowedSpecial) -> re.Pattern[str]:
        names = frozenset(self._specials) if allowed == "all" else frozenset(allowed)
        found = self._patterns.get(names)
        if found is not None:
            return found
        unknown = sorted(names - self._specials.keys())
        if unknown:
            raise TokenizeError(f"not special tokens of map {self.map.id!r}: {unknown}")
        pattern = _longest_first(sorted(names))
        if len(self._patterns) >= _MAX_SPECIAL_PATTERNS:
            self._patterns.clear()
        self._patterns[names] = pattern
        return pattern


def _longest_first(names: Sequence[str]) -> re.Pattern[str]:
    # Python's alternation takes the first alternative that matches at the leftmost
    # position, so ordering by length makes it leftmost-longest (HF's added-token split).
    ordered = sorted(names, key=lambda s: (-len(s), s))
    return re.compile("|".join(re.escape(s) for s in ordered))
