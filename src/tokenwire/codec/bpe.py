"""Pure-Python byte-pair encoding with Hugging Face `tokenizers` semantics.

This is the engine for metaspace maps and the fallback for byte_level maps when tiktoken is
not installed. Semantics follow HF's ``BPE`` model (codec-spec §3.4 step 4): a word starts
as one symbol per character; the adjacent pair with the lowest *pair* rank (its index in
``merges``) is merged, leftmost first on ties, one merge at a time, until no ranked pair is
left. Pair ranks matter, not product ranks: SentencePiece-converted merge lists (phi-3)
name the same product through several pairs at different ranks.

A character with no vocab id becomes its UTF-8 bytes through the map's byte-fallback range
(codec-spec §3.1 ``byte_fallback_start``), or raises :class:`~tokenwire.errors.VocabMiss`;
it is never dropped (peer-bench §1: the reference client drops Falcon's ``\\x0b``). Such a
character can never be part of a merge (HF refuses merges whose parts are not in the vocab),
so deciding the fallback after merging gives the same ids as HF deciding it before.
"""

from __future__ import annotations

import heapq
import sys
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from itertools import pairwise

from tokenwire.errors import MapValidationError, VocabMiss

__all__ = ["BPE", "DEFAULT_CACHE_SIZE", "MAX_CACHED_WORD", "merge_symbols", "parse_merges"]

#: Words remembered per tokenizer. Natural text repeats a few thousand words; 64k entries of
#: short tuples is a few MB, and the bound keeps an adversarial stream of distinct words from
#: growing memory without limit (the reference client's cache is unbounded, peer-bench §1).
DEFAULT_CACHE_SIZE = 1 << 16

#: Longer words are merged without caching: they rarely repeat, and caching them would let
#: one huge word pin megabytes in the cache.
MAX_CACHED_WORD = 256

# Below this many symbols a linear scan per merge beats heap bookkeeping; above it the
# heap keeps a long word (a paragraph of CJK, a run of 100k letters) at O(n log n).
_HEAP_THRESHOLD = 48

_NO_RANK = sys.maxsize  # "no merge for this pair": larger than any rank


def merge_symbols(symbols: list[str], ranks: Mapping[tuple[str, str], int]) -> list[str]:
    """Apply BPE merges to ``symbols``: lowest pair rank first, leftmost on ties."""
    if len(symbols) < 2:
        return symbols
    if len(symbols) > _HEAP_THRESHOLD:
        return _merge_heap(symbols, ranks)
    return _merge_scan(list(symbols), ranks)


def _merge_scan(symbols: list[str], ranks: Mapping[tuple[str, str], int]) -> list[str]:
    """Short words: a list of pair ranks, searched with C-level ``min``/``index`` (leftmost
    of equally ranked pairs, as in HF's queue) and patched only next to each merge.
    Profiled on the issue-18 corpus with phi-3, the older rescan of every pair after every
    merge was 64% of metaspace encode time."""
    get = ranks.get
    pair_ranks = [get(pair, _NO_RANK) for pair in pairwise(symbols)]
    while pair_ranks:
        best_rank = min(pair_ranks)
        if best_rank == _NO_RANK:
            break
        i = pair_ranks.index(best_rank)
        merged = symbols[i] + symbols[i + 1]
        symbols[i : i + 2] = [merged]
        del pair_ranks[i]
        if i > 0:
            pair_ranks[i - 1] = get((symbols[i - 1], merged), _NO_RANK)
        if i < len(pair_ranks):
            pair_ranks[i] = get((merged, symbols[i + 1]), _NO_RANK)
    return symbols


def _merge_heap(symbols: list[str], ranks: Mapping[tuple[str, str], int]) -> list[str]:
    """Same result as :func:`_merge_scan` in O(n log n): a doubly linked list of symbols
    and a heap of candidate pairs keyed ``(rank, position)`` (HF's own layout)."""
    n = len(symbols)
    sym: list[str | None] = list(symbols)
    nxt = list(range(1, n + 1))
    prv = list(range(-1, n - 1))
    get = ranks.get
    heap = [(r, i, symbols[i], symbols[i + 1]) for i in range(n - 1)
            if (r := get((symbols[i], symbols[i + 1]))) is not None]  # fmt: skip
    heapq.heapify(heap)
    while heap:
        _, i, left, right = heapq.heappop(heap)
        j = nxt[i]
        # A popped entry is stale when either symbol has changed since it was pushed.
        # Symbols only ever grow, so equal strings mean the very same symbols.
        if sym[i] != left or j >= n or sym[j] != right:
            continue
        merged = left + right
        sym[i] = merged
        sym[j] = None
        k = nxt[j]
        nxt[i] = k
        if k < n:
            prv[k] = i
            if (r := get((merged, sym[k]))) is not None:  # type: ignore[arg-type]
                heapq.heappush(heap, (r, i, merged, sym[k]))
        p = prv[i]
        if p >= 0 and (r := get((sym[p], merged))) is not None:  # type: ignore[arg-type]
            heapq.heappush(heap, (r, p, sym[p], merged))
    return [s for s in sym if s is not None]


def parse_merges(merges: Sequence[str]) -> dict[tuple[str, str], int]:
    """``"left right"`` strings -> pair rank; the first occurrence of a pair keeps its rank."""
    ranks: dict[tuple[str, str], int] = {}
    for rank, line in enumerate(merges):
        left, sep, right = line.partition(" ")
        if not sep or not left or not right or " " in right:
            raise MapValidationError(f"merges[{rank}]", f"{line!r} is not 'left right'")
        ranks.setdefault((left, right), rank)
    return ranks


class BPE:
    """Words (strings of vocab characters) -> ids, with a bounded LRU cache per instance.

    ``byte_fallback`` is the inclusive id range of ``<0x00>``..``<0xFF>``; without it an
    unknown symbol raises :class:`VocabMiss`.
    """

    def __init__(
        self,
        vocab: Mapping[str, int],
        merges: Sequence[str],
        *,
        byte_fallback: tuple[int, int] | None = None,
        map_id: str = "",
        cache_size: int = DEFAULT_CACHE_SIZE,
        ranks: Mapping[tuple[str, str], int] | None = None,
    ) -> None:
        self.vocab = vocab
        self.ranks = parse_merges(merges) if ranks is None else ranks  # prebuilt: tokenizer.py
        self.byte_fallback = byte_fallback
        self.map_id = map_id
        #: :meth:`encode_uncached` behind the LRU cache, for callers that keep words short.
        self.cached: Callable[[str], tuple[int, ...]] = lru_cache(maxsize=cache_size)(
            self.encode_uncached
        )

    def encode_word(self, word: str) -> tuple[int, ...]:
        """The ids of one pre-tokenized word (already in vocab characters), cached."""
        if len(word) <= MAX_CACHED_WORD:
            return self.cached(word)
        return self.encode_uncached(word)

    def cache_info(self) -> object:
        return self.cached.cache_info()  # type: ignore[attr-defined]

    def encode_uncached(self, word: str) -> tuple[int, ...]:
        """:meth:`encode_word` without the cache (for callers that cache on their own key)."""
        vocab = self.vocab
        whole = vocab.get(word)
        if whole is not None and len(word) == 1:
            return (whole,)
        out: list[int] = []
        for symbol in merge_symbols(list(word), self.ranks):
            tid = vocab.get(symbol)
            if tid is None:
                out.extend(self._fallback(symbol))
            else:
                out.append(tid)
        return tuple(out)

    def _fallback(self, symbol: str) -> list[int]:
        if self.byte_fallback is None:
            raise VocabMiss(symbol, self.map_id)
        start = self.byte_fallback[0]
        return [start + b for b in symbol.encode("utf-8")]
