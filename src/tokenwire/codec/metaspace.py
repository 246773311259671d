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

Each check reads the map's own merges at load; nothing is assumed about a vocabulary.
"""

from __future__ import annotations

import importlib.util
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
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
    # One C-level pass writes each product as classes (L letter, O other, S metaspace).
    table = str.maketrans({**dict.fromkeys(letters, "L"), **dict.fromkeys(others, "O"),
                           METASPACE: "S", _SEPARATOR: " "})  # fmt: skip
    if re.search("LO|OL|[LO]S", joined.translate(table)):
        return None
    m = METASPACE
    runs = [f"{m}*{_char_class(c)}+" for c in (letters, others) if c]
    return re.compile("|".join([*runs, f"{m}+", "."]), re.DOTALL)


def _char_class(chars: Iterable[str]) -> str:
    return "[" + "".join(sorted(map(re.escape, chars))) + "]"


class MetaspaceEncoder:
    """Encodes text segments (no special tokens inside) of one metaspace map.

    ``native`` merges pieces in tiktoken's Rust core where that gives HF's ids
    (:mod:`tokenwire.codec.metaspace_tiktoken`): ``"auto"`` when tiktoken is installed and
    the map passes the check, ``True`` demands it (:class:`TokenizeError` otherwise),
    ``False`` is pure Python. ``self.native`` says which it is.
    """

    def __init__(
        self,
        tmap: TokenizerMap,
        *,
        cache_size: int = DEFAULT_CACHE_SIZE,
        native: bool | Literal["auto"] = False,
    ) -> None:
        self.scheme = tmap.metaspace_prepend_scheme
        self.bpe = BPE(
            tmap.vocab, tmap.merges, byte_fallback=tmap.byte_fallback, map_id=tmap.id,
            cache_size=0,  # pieces are cached below, whichever engine merges them
        )  # fmt: skip
        products = [left + right for left, right in self.bpe.ranks]
        pattern = class_cut_pattern(products)
        if pattern is None and not any(map(_CROSSES_CUT_RE.search, products)):
            pattern = _CHUNK_RE
        #: How segments are cut: "classes", "metaspace" or "none" (merged whole).
        self.cuts = (
            "none" if pattern is None else "metaspace" if pattern is _CHUNK_RE else "classes"
        )
        self._pieces = None if pattern is None else pattern.findall
        self._native = _native_pieces(tmap, self.bpe, native)
        self.native = self._native is not None
        self._cached: Callable[[str], tuple[int, ...]] = lru_cache(maxsize=cache_size)(
            self._encode_piece
        )

    def cache_info(self) -> object:
        return self._cached.cache_info()  # type: ignore[attr-defined]

    def _encode_piece(self, piece: str) -> tuple[int, ...]:
        ids = None if self._native is None else self._native.encode(piece)
        return self.bpe.encode_uncached(piece) if ids is None else ids

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


def _native_pieces(
    tmap: TokenizerMap, bpe: BPE, native: bool | Literal["auto"]
) -> TiktokenPieces | None:
    if native is False:
        return None
    found = product_ranks(bpe.ranks) if tmap.byte_fallback is not None else None
    available = importlib.util.find_spec("tiktoken") is not None
    if found is not None and available:
        return TiktokenPieces(tmap, found)
    if native == "auto":
        return None
    why = "tiktoken is not installed" if found is not None else (
        "its merges are not grouped by product and complete, or it has no byte fallback")
    raise TokenizeError(f"map {tmap.id!r} cannot be merged by tiktoken exactly: {why}")
