"""Metaspace BPE pieces merged in tiktoken's Rust core, where the map's merges allow it.

HF merges the adjacent pair with the lowest *pair* rank (its index in ``merges``); tiktoken
merges the adjacent pair whose *concatenation* has the lowest rank, leftmost on ties. For a
SentencePiece-converted merge list (Llama-2, Phi-3) the two agree on a piece when
:func:`product_ranks` accepts the map, which it checks at load:

1. **Grouped**: all pairs making one product stand together in ``merges``, so ordering
   pairs by rank orders them by product first. Ranking each product by its place picks,
   at every step, a pair of the same product HF picks.
2. **Complete**: every way to split a product into two symbols (products or single
   characters) is a merge, so tiktoken never joins a pair HF has no merge for.

They can still differ when two *different* pairs of the product being merged are present
at once (HF takes the lower pair rank, tiktoken the leftmost). That needs the product to
occur at two offsets of the piece, and a product with two pairs has at least three
characters. :meth:`TiktokenPieces.encode` declines every piece in which a product made by
several pairs occurs at two offsets (found through its first three characters repeating,
which is rare), and every long piece, where tiktoken's quadratic merge would be slow; the
caller merges those in Python, which implements HF's rule itself.

tiktoken returns a piece that is itself a token as that token without merging. HF does not
promise that (a product is not always reachable from its own characters), so every piece
is given to tiktoken with a trailing 0xFF byte, which no token contains: the piece is then
never a token, tiktoken runs the whole merge, and the 0xFF token is dropped from the end.

tiktoken works on UTF-8 bytes. Every single-character token and each proper prefix of its
bytes is ranked below every product, so characters are assembled before any merge; a
character the vocabulary lacks is left as bytes (or as a prefix of a known character's
bytes) and becomes its byte-fallback ids, which is what HF gives it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import chain, count, groupby

from tokenwire.codec.maps import TokenizerMap

__all__ = ["ProductRanks", "TiktokenPieces", "needs_python", "product_ranks"]

#: Pieces longer than this are merged in Python: tiktoken's merge rescans the piece after
#: every merge (quadratic), the Python heap merge is O(n log n).
MAX_NATIVE_PIECE = 256


# Never part of UTF-8, so no token contains it (module docstring: tiktoken's whole-piece
# shortcut).
_SENTINEL = b"\xff"


Trigram = tuple[str, str, str]


@dataclass(frozen=True)
class ProductRanks:
    """What :func:`product_ranks` found: products in rank order, and the products made by
    more than one pair, by their first three characters."""

    order: list[str]
    contested: Mapping[Trigram, tuple[str, ...]]


def needs_python(piece: str, contested: Mapping[Trigram, tuple[str, ...]]) -> bool:
    """True if tiktoken might disagree with HF on ``piece`` (module docstring)."""
    n = len(piece)
    if n > MAX_NATIVE_PIECE:
        return True
    # The common cases, fastest first: no character repeats, or no trigram does.
    if n < 3 or len(set(piece)) == n:
        return False
    trigrams = list(zip(piece, piece[1:], piece[2:], strict=False))
    if len(set(trigrams)) == n - 2:
        return False
    for trigram, seen in Counter(trigrams).items():
        if seen > 1 and trigram in contested:
            for product in contested[trigram]:
                first = piece.find(product)
                if first >= 0 and piece.find(product, first + 1) >= 0:
                    return True
    return False


def product_ranks(ranks: Mapping[tuple[str, str], int]) -> ProductRanks | None:
    """The merge products in rank order if tiktoken's rule gives HF's ids (module
    docstring, checks 1 and 2), else ``None``. ``ranks`` iterates in rank order
    (:func:`~tokenwire.codec.bpe.parse_merges` builds it so)."""
    products = [left + right for left, right in ranks]
    order = [product for product, _ in groupby(products)]
    if len(order) != len(set(order)):
        return None  # some product's pairs are not contiguous
    pairs_of = Counter(products)
    symbols = pairs_of.keys() | set("".join(order))
    # Two characters have one split, and it is the merge. One list of every valid split's
    # product is the fast way to count them (this runs once per map, ~50 ms for Llama-2).
    splits = Counter([product for product in order if len(product) > 2
                      for k in range(1, len(product))
                      if product[:k] in symbols and product[k:] in symbols])  # fmt: skip
    if any(splits[product] != pairs_of[product] for product in order if len(product) > 2):
        return None  # every merge is a valid split, so some valid split is not a merge
    by_trigram: dict[Trigram, list[str]] = {}
    for product in order:
        if pairs_of[product] > 1:
            by_trigram.setdefault((product[0], product[1], product[2]), []).append(product)
    return ProductRanks(order, {key: tuple(found) for key, found in by_trigram.items()})


class TiktokenPieces:
    """One tiktoken core ranking a metaspace map's characters and products; ``encode``
    gives the ids of one piece (no special tokens, already normalised)."""

    def __init__(self, tmap: TokenizerMap, found: ProductRanks) -> None:
        import tiktoken

        products = found.order
        self._contested = found.contested
        assert tmap.byte_fallback is not None
        start = tmap.byte_fallback[0]
        vocab = tmap.vocab
        # rank -> id; single bytes first (tiktoken needs every one), then characters and
        # the proper prefixes of their bytes, then the products, so products rank last. A
        # prefix left over (a character the vocab lacks) is several byte-fallback ids: its
        # id is -1 and _prefixes has them.
        ids = [vocab[chr(b)] if b < 0x80 and chr(b) in vocab else start + b for b in range(256)]
        ranks = {bytes([b]): b for b in range(256)}
        self._prefixes: dict[int, tuple[int, ...]] = {}
        for char in (key for key in vocab if len(key) == 1):
            data = char.encode("utf-8")
            for end in range(2, len(data) + 1):
                if data[:end] not in ranks:
                    ranks[data[:end]] = len(ids)
                    if end < len(data):
                        self._prefixes[len(ids)] = tuple(start + b for b in data[:end])
                    ids.append(vocab[char] if end == len(data) else -1)
        ranks.update(zip(map(str.encode, products), count(len(ids))))
        ids.extend(map(vocab.__getitem__, products))
        self._ids = ids
        self._encode = tiktoken.Encoding(
            f"tokenwire:{tmap.id}:metaspace", pat_str=r"(?s:.+)",
            mergeable_ranks=ranks, special_tokens={},
        )._core_bpe.encode_single_piece  # fmt: skip

    def encode(self, piece: str) -> tuple[int, ...] | None:
        """The ids of ``piece``, or ``None`` if it must be merged in Python."""
        if needs_python(piece, self._contested):
            return None
        ranks = self._encode(piece.encode() + _SENTINEL)
        ranks.pop()  # the sentinel's own token
        ids = tuple(map(self._ids.__getitem__, ranks))
        if -1 not in ids:
            return ids
        prefixes = self._prefixes
        return tuple(chain.from_iterable(
            prefixes[r] if r in prefixes else (i,) for r, i in zip(ranks, ids, strict=True)
        ))  # fmt: skip
