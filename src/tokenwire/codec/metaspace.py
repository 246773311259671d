"""SentencePiece-style metaspace encoding, done the way Hugging Face `tokenizers` does it.

No whitespace collapsing and no word splitting (codec-spec §9.1 item 18: the reference
client collapses space runs, splits on every whitespace character and prefixes each piece
with ``▁``, which gives wrong ids for ~72% of real texts, peer-bench §2). Instead, for each
text segment between special tokens:

* ``"always"`` (Llama-2, Phi-3, Mixtral; HF normaliser ``Sequence[Prepend("▁"),
  Replace(" ", "▁")]``): a non-empty segment gets ``▁`` in front, then every space becomes
  ``▁``. A segment that starts with a space therefore starts with ``▁▁``.
* ``"first"`` (Mistral-v3, Codestral; HF pre-tokenizer ``Metaspace(prepend_scheme="first",
  split=False)``): spaces become ``▁``; ``▁`` is prepended only to the segment that starts
  the whole text and only if it does not already start with ``▁``.
* ``"never"``: spaces become ``▁``, nothing is prepended.

Then BPE runs over the whole segment with merge priorities and byte fallback
(:class:`~tokenwire.codec.bpe.BPE`). To make that fast and cacheable the segment is cut
into pieces that BPE provably never merges across, each merged alone and cached:

* **Class cuts** (Llama-2, Phi-3). Only a few hundred characters occur in any merge product;
  call those with Unicode category L or M *letters*, the others but ``▁`` *others*, and every
  remaining character *isolated* (newline, digits, most CJK, characters the vocabulary
  lacks: each is a token or byte fallback on its own). A piece is ``▁*letters+``,
  ``▁*others+``, ``▁+`` or one isolated character, so every cut sits between a letter and
  an other, in front of a ``▁`` that follows a non-``▁``, or next to an isolated character.
  A merge joining two symbols across such a cut would produce a token containing that
  character pair; the constructor checks that no merge product contains one.
* **Metaspace cuts**: in front of every ``▁`` that follows a non-``▁`` character, used when
  the class check fails but no product contains ``x▁`` (x not ``▁``).
* Otherwise segments are merged whole.

With the tiktoken engine, a piece ``▁▁…▁W`` (k ``▁``, then ``W`` without ``▁``; indented
code) is composed from the pieces ``▁W`` and the run ``▁`` * (k-1) or * k when
:func:`leading_runs_split` holds (its docstring has the proof): ``▁W`` goes to tiktoken
and the few distinct runs are merged once each, instead of the whole piece in Python.

Each check reads the map's own merges at load; nothing is assumed about a vocabulary.
"""

from __future__ import annotations

import importlib.util
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from itertools import chain
from typing import Literal

from tokenwire.codec.bpe import BPE, DEFAULT_CACHE_SIZE, MAX_CACHED_WORD
from tokenwire.codec.maps import TokenizerMap
from tokenwire.codec.metaspace_tiktoken import TiktokenPieces, product_ranks
from tokenwire.errors import TokenizeError

__all__ = ["METASPACE", "MetaspaceEncoder"]

#: U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's stand-in for a space.
METASPACE = "\u2581"

# A chunk is a run of metaspaces plus the non-metaspace text after it, or leading text.
_CHUNK_RE = re.compile(f"{METASPACE}+[^{METASPACE}]*|[^{METASPACE}]+")
_CROSSES_CUT_RE = re.compile(f"[^{METASPACE}]{METASPACE}")
_TWO_METASPACES = METASPACE * 2

# Joins merge products for one regex scan; a map whose products contain it gets no class cuts.
_SEPARATOR = "\x00"


def class_cut_pattern(products: Sequence[str]) -> re.Pattern[str] | None:
    """The class-cut piece pattern (module docstring) if no merge product crosses one of its
    cuts, else ``None``."""
    joined = _SEPARATOR.join(products)
    if joined.count(_SEPARATOR) != len(products) - 1:
        return None
    chars = set(joined) - {_SEPARATOR, METASPACE}
    letters = {c for c in chars if unicodedata.category(c)[0] in "LM"}
    others = chars - letters
    m = METASPACE
    runs = "|".join(f"{_char_class(c)}+" for c in (letters, others) if c)
    # Every product is a piece of its own: metaspaces, then letters only or others only.
    if re.fullmatch(f"(?:{m}*(?:{runs})?{_SEPARATOR})*", joined + _SEPARATOR) is None:
        return None
    return re.compile(f"{m}*(?:{runs})|{m}+|.", re.DOTALL)


def leading_runs_split(ranks: Mapping[tuple[str, str], int], vocab: Mapping[str, int]) -> bool:
    """True if, for every ``k >= 2`` and ``W`` non-empty without ``▁``, HF's merge of
    ``▁``*k + ``W`` is: merge(``▁W``) = T; if T's first symbol is not the lone ``▁``,
    merge(``▁``*(k-1)) + T, else merge(``▁``*k) + T[1:].

    It holds when (checked here, on the map's merges) ``▁`` is a token, every *pure* merge
    (product all ``▁``) ranks after every *mixed* one, and no mixed product starts with
    ``▁▁``. Proof: HF merges the lowest-ranked pair present, so while a mixed pair is present
    no pure pair merges (phase 1). In phase 1 the first k-1 ``▁`` stay single: their pairs are
    ``(▁, ▁)`` (pure) or ``(▁, ▁…)`` with a mixed right symbol (a product starting ``▁▁``,
    none exists); so phase 1 is exactly the merge of ``▁W`` alone (the same pairs in the same
    order; a lone ``▁W`` has no pure pair), giving T. Then only pure pairs are left: the
    single ``▁`` in front (k-1, plus T's first symbol if it is the lone ``▁``) merge as that
    run alone would, and no new mixed pair appears (it would start with ``▁▁``).
    """
    if METASPACE not in vocab:
        return False
    last_mixed, first_pure = -1, len(ranks)
    for (left, right), rank in ranks.items():
        product = left + right
        if product.strip(METASPACE):
            if product.startswith(METASPACE * 2):
                return False
            last_mixed = max(last_mixed, rank)
        else:
            first_pure = min(first_pure, rank)
    return last_mixed < first_pure


def _char_class(chars: Iterable[str]) -> str:
    return "[" + "".join(sorted(map(re.escape, chars))) + "]"


#: Distinct pieces merged in Python before ``native="auto"`` builds the tiktoken engine.
#: Building it reads every merge (the checks, then the ranks: ~100 ms for Llama-2 on an idle
#: core, as long as the rest of loading the map), which a tokenizer that encodes a prompt or
#: two never earns back; this way a map is ready as soon as the Python engine is, and a
#: tokenizer that is kept busy switches within its first few texts.
NATIVE_AFTER_MISSES = 256


class MetaspaceEncoder:
    """Encodes text segments (no special tokens inside) of one metaspace map.

    ``native`` merges pieces in tiktoken's Rust core where that gives HF's ids
    (:mod:`tokenwire.codec.metaspace_tiktoken`): ``"auto"`` starts in Python and switches
    after :data:`NATIVE_AFTER_MISSES` distinct pieces if tiktoken is installed and the map
    passes the check; ``True`` builds it at once (:class:`TokenizeError` if it cannot be
    exact); ``False`` is pure Python. ``native`` (the attribute) says whether it is in use.
    """

    def __init__(
        self,
        tmap: TokenizerMap,
        *,
        cache_size: int = DEFAULT_CACHE_SIZE,
        native: bool | Literal["auto"] = False,
    ) -> None:
        self.map = tmap
        self.scheme = tmap.metaspace_prepend_scheme
        self.bpe, pattern = _bpe_and_cuts(tmap)
        #: How segments are cut: "classes", "metaspace" or "none" (merged whole).
        self.cuts = (
            "none" if pattern is None else "metaspace" if pattern is _CHUNK_RE else "classes"
        )
        self._pieces = None if pattern is None else pattern.findall
        self._native = _native_for(tmap, required=True) if native is True else None
        # ids of "▁" if runs are split off pieces (leading_runs_split), with tiktoken only:
        # it is what makes the split pay, and the check costs a pass over the merges
        self._split_runs_id = self._runs_id() if self._native is not None else None
        # "auto" with a chance of success counts misses down to the switch
        self._until_native = NATIVE_AFTER_MISSES if native == "auto" and _can_be_native(tmap) else 0
        self._cached: Callable[[str], tuple[int, ...]] = lru_cache(maxsize=cache_size)(
            self._encode_piece
        )

    @property
    def native(self) -> bool:
        return self._native is not None

    def cache_info(self) -> object:
        return self._cached.cache_info()  # type: ignore[attr-defined]

    def _runs_id(self) -> int | None:
        return self.map.vocab[METASPACE] if _runs_split_for(self.map) else None

    def _encode_piece(self, piece: str) -> tuple[int, ...]:
        if self._until_native:
            self._until_native -= 1
            if not self._until_native:
                self._native = _native_for(self.map, required=False)
                self._split_runs_id = self._runs_id() if self._native is not None else None
        if self._split_runs_id is not None and piece.startswith(_TWO_METASPACES):
            word = piece.lstrip(METASPACE)
            if word and METASPACE not in word:
                return self._split_run(piece, len(piece) - len(word), self._split_runs_id)
        ids = None if self._native is None else self._native.encode(piece)
        return self.bpe.encode_uncached(piece) if ids is None else ids

    def _split_run(self, piece: str, run: int, metaspace_id: int) -> tuple[int, ...]:
        """``piece`` = ``▁`` * run + a word, composed as :func:`leading_runs_split` says."""
        encode = self._cached if len(piece) <= MAX_CACHED_WORD else self._encode_piece
        word = encode(piece[run - 1 :])
        if word[0] != metaspace_id:
            return encode(piece[: run - 1]) + word
        return encode(piece[:run]) + word[1:]

    def normalize(self, segment: str, *, at_text_start: bool) -> str:
        """The segment as the BPE model sees it (HF normaliser / pre-tokenizer output)."""
        if not segment:
            return ""
        body = segment.replace(" ", METASPACE)
        if self.scheme == "always":
            return METASPACE + body
        if self.scheme == "first" and at_text_start and not body.startswith(METASPACE):
            return METASPACE + body
        return body

    def encode_segment(self, segment: str, *, at_text_start: bool) -> list[int]:
        text = self.normalize(segment, at_text_start=at_text_start)
        if not text:
            return []
        pieces = [text] if self._pieces is None else self._pieces(text)
        if max(map(len, pieces)) <= MAX_CACHED_WORD:  # the common case: one C-level loop
            return list(chain.from_iterable(map(self._cached, pieces)))
        # long pieces rarely repeat, and caching one would pin megabytes
        cached, uncached = self._cached, self._encode_piece
        return list(chain.from_iterable(
            cached(p) if len(p) <= MAX_CACHED_WORD else uncached(p) for p in pieces
        ))  # fmt: skip


@lru_cache(maxsize=4)  # per map object: every tokenizer of a map shares the work
def _bpe_and_cuts(tmap: TokenizerMap) -> tuple[BPE, re.Pattern[str] | None]:
    bpe = BPE(
        tmap.vocab, tmap.merges, byte_fallback=tmap.byte_fallback, map_id=tmap.id,
        cache_size=0,  # no state: encoders cache pieces themselves, whichever engine merges
    )  # fmt: skip
    products = [left + right for left, right in bpe.ranks]
    pattern = class_cut_pattern(products)
    if pattern is None and not any(map(_CROSSES_CUT_RE.search, products)):
        pattern = _CHUNK_RE
    return bpe, pattern


@lru_cache(maxsize=4)
def _runs_split_for(tmap: TokenizerMap) -> bool:
    return leading_runs_split(_bpe_and_cuts(tmap)[0].ranks, tmap.vocab)


def _can_be_native(tmap: TokenizerMap) -> bool:
    return tmap.byte_fallback is not None and importlib.util.find_spec("tiktoken") is not None


@lru_cache(maxsize=4)
def _native_for(tmap: TokenizerMap, *, required: bool) -> TiktokenPieces | None:
    found = product_ranks(_bpe_and_cuts(tmap)[0].ranks) if _can_be_native(tmap) else None
    if found is not None:
        return TiktokenPieces(tmap, found)
    if not required:
        return None
    raise TokenizeError(
        f"map {tmap.id!r} cannot be merged by tiktoken exactly: tiktoken is not installed, the "
        "map has no byte fallback, or its merges are not grouped by product and complete"
    )
