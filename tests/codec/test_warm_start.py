"""Ready at once, fast once built (issue 15, map load-to-ready).

With ``defer``, a byte_level map encodes and decodes right after loading on exact slow
paths (the pure-Python BPE with merge-line ranks; per-id pieces) while tiktoken's core and
the decode tables are built by ``defer`` (a thread: tokenwire/background.py). These tests
hand the builds to a ``defer`` that holds them back, so the slow paths answer, and check
them against the fast paths and Hugging Face on real maps and the differential corpus; then
run the builds and check the fast path takes over.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
from collections.abc import Callable
from functools import cache

import pytest

from tests.conftest import corpus, fixture_map_path
from tests.hf_oracle import hf_encode, hf_tokenizer
from tokenwire.codec import detokenizer, tokenizer
from tokenwire.codec.bpe import parse_merges
from tokenwire.codec.byte_level import BYTE_TO_CHAR
from tokenwire.codec.detokenizer import Detokenizer, _build_tables
from tokenwire.codec.maps import TokenizerMap, load_map_bytes, load_map_file
from tokenwire.codec.tokenizer import Tokenizer

BYTE_LEVEL = ["huggingfacetb/smollm2", "openai/cl100k_base", "tiiuae/falcon"]


def corpus_samples() -> list[str]:
    return [s for samples in corpus().values() for s in samples]


@cache
def _map(map_id: str) -> TokenizerMap:
    return load_map_file(fixture_map_path(map_id))


class _HeldBack:
    """A ``defer`` that keeps the builds it is handed until :meth:`run_all`."""

    def __init__(self) -> None:
        self.queued: list[Callable[[], object]] = []

    def __call__(self, build: Callable[[], object]) -> None:
        self.queued.append(build)

    def run_all(self) -> None:
        while self.queued:
            self.queued.pop(0)()


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> _HeldBack:
    monkeypatch.setattr(detokenizer, "_cache", {})
    monkeypatch.setattr(detokenizer, "_deferred", {})
    monkeypatch.setattr(detokenizer, "_starters", {})
    return _HeldBack()


@pytest.mark.parametrize("map_id", BYTE_LEVEL)
def test_starter_encode_equals_tiktoken_engine(held: _HeldBack, map_id: str) -> None:
    tmap = _map(map_id)
    warm = Tokenizer.from_map(tmap, defer=held)
    fast = Tokenizer.from_map(tmap, "tiktoken")
    assert held.queued and warm.backend == "tiktoken"
    for text in corpus_samples()[::7]:
        assert warm.encode(text) == fast.encode(text), text[:80]
    name = next(iter(tmap.special_tokens))
    assert warm.encode(f"a{name}b", allowed_special="all") == fast.encode(
        f"a{name}b", allowed_special="all")
    assert warm._engine.core is None and not warm.built  # type: ignore[attr-defined]
    held.run_all()
    assert warm.built
    assert warm.encode("Hello world") == fast.encode("Hello world")
    assert warm._engine.core is not None  # type: ignore[attr-defined]


def test_starter_encode_matches_hf_on_smollm2(held: _HeldBack) -> None:
    tmap = load_map_file(fixture_map_path("huggingfacetb/smollm2"))
    warm, hf = Tokenizer.from_map(tmap, defer=held), hf_tokenizer(tmap)
    for text in corpus_samples()[1::11]:
        assert warm.encode(text) == hf_encode(hf, text), text[:80]


def test_map_tiktoken_cannot_rank_stays_on_python_engine(held: _HeldBack) -> None:
    # "a bc" and "ab c" both make "abc": tiktoken ranks products, so it cannot hold this map.
    vocab = {c: i for i, c in enumerate(BYTE_TO_CHAR)}
    merges = ["b c", "a b", "a bc", "ab c"]
    for m in merges:
        vocab.setdefault(m.replace(" ", ""), len(vocab))
    tmap = load_map_bytes(json.dumps({
        "id": "test/repeated", "version": "2", "vocab_size": len(vocab), "vocab": vocab,
        "encoder": "byte_level", "merges": merges, "pre_tokenizer_pattern": r" ?\w+|\s+|\W+",
    }).encode())  # fmt: skip
    warm = Tokenizer.from_map(tmap, defer=held)
    before = warm.encode("abc abcabc")
    held.run_all()
    assert warm.backend == "python"
    assert warm.encode("abc abcabc") == before == Tokenizer.from_map(tmap, "python").encode(
        "abc abcabc") == hf_encode(hf_tokenizer(tmap), "abc abcabc")


def test_broken_tiktoken_leaves_a_deferred_load_on_the_python_engine(
    held: _HeldBack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A deferred load only looks for tiktoken (importing it is ~5 ms of a fresh process's
    # first load); the import, on the builder, may still fail.
    tmap = _map("huggingfacetb/smollm2")
    warm = Tokenizer.from_map(tmap, defer=held)
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # `import tiktoken` raises ImportError
    held.run_all()
    assert warm.built and warm.backend == "python"
    text = "Hello world, ünïcödé 😀"
    assert warm.encode(text) == Tokenizer.from_map(tmap, "python").encode(text)


def test_forked_child_builds_in_place(held: _HeldBack, monkeypatch: pytest.MonkeyPatch) -> None:
    # After a fork the builder thread is gone: what it was handed would never run.
    warm = Tokenizer.from_map(_map("huggingfacetb/smollm2"), defer=held)
    monkeypatch.setattr(tokenizer.os, "getpid", lambda: -1)
    assert warm.encode("Hello") == Tokenizer.from_map(_map("huggingfacetb/smollm2"),
                                                       "tiktoken").encode("Hello")
    assert warm._engine.core is not None  # type: ignore[attr-defined]


def _id_lists(tmap: TokenizerMap) -> list[list[int]]:
    rng = random.Random(15)
    top = tmap.max_id
    specials = sorted(tmap.special_ids)
    lists = [[rng.randrange(top + 1) for _ in range(rng.randrange(1, 40))] for _ in range(300)]
    lists += [[specials[0], 1, 2, specials[-1]], [-1, 0, top, top + 1, 10**9], [], [True, 5]]
    if tmap.id == "openai/cl100k_base":
        lists.append(list(range(100250, 100280)))  # the hole 100261..100275
    return lists


@pytest.mark.parametrize("map_id", BYTE_LEVEL)
def test_starter_decode_equals_table_decode(held: _HeldBack, map_id: str) -> None:
    tmap = _map(map_id)
    tables = _build_tables(tmap)
    warm = Detokenizer(tmap, defer=held)
    for ids in _id_lists(tmap):
        for shown in (False, True):
            data = b"".join(detokenizer._lookup(tables.shown if shown else tables.hidden, i,
                                                detokenizer._REPLACEMENT_BYTES) for i in ids)
            assert warm.decode(ids, render_special=shown) == data.decode("utf-8", "replace")
    assert warm._tables is None and len(held.queued) == 1  # one build, handed over once
    with pytest.raises(TypeError):
        warm.decode(["1"])  # type: ignore[list-item]
    held.run_all()
    assert warm.decode([1, 2]) == Detokenizer(tmap).decode([1, 2])
    assert warm._tables is not None


def test_forked_child_builds_decode_tables_in_place(held: _HeldBack,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    tmap = _map("huggingfacetb/smollm2")
    Detokenizer(tmap, defer=held).decode([1])
    monkeypatch.setattr(detokenizer.os, "getpid", lambda: -1)
    warm = Detokenizer(tmap, defer=held)
    assert warm.decode([28120]) == Detokenizer(tmap).decode([28120])
    assert warm._tables is not None


def test_without_defer_nothing_is_deferred() -> None:
    tok = Tokenizer.from_map(_map("huggingfacetb/smollm2"))
    assert tok.built and tok._engine.core is not None  # type: ignore[attr-defined]
    detok = Detokenizer(_map("huggingfacetb/smollm2"))
    detok.decode([1])
    assert detok._tables is not None


def test_streams_and_other_encoders_build_at_once(held: _HeldBack) -> None:
    smol = Detokenizer(_map("huggingfacetb/smollm2"), defer=held)
    assert smol.stream().feed([28120]) == smol.decode([28120])  # tables built in place
    phi = Detokenizer(_map("microsoft/phi-3"), defer=held)
    assert phi.decode([3 + 0x41]) == "A"
    assert not held.queued


@pytest.mark.parametrize("map_id", BYTE_LEVEL)
def test_starter_ranks_equal_parse_merges(map_id: str) -> None:
    merges = _map(map_id).merges
    ranks, ref = tokenizer._JoinedPairRanks(merges), parse_merges(merges)
    assert len(ranks) == len(ref) and all(ranks.get(p) == r for p, r in ref.items())


def _repeated_line_map() -> TokenizerMap:
    # "a b" is merge 0 and again merge 2: the first rank counts (parse_merges, HF). On
    # "abc" that decides between "ab"+"c" (rank 0 first) and "a"+"bc" (rank 2 after "b c").
    vocab = {c: i for i, c in enumerate(BYTE_TO_CHAR)}
    merges = ["a b", "b c", "a b"]
    for m in merges:
        vocab.setdefault(m.replace(" ", ""), len(vocab))
    return load_map_bytes(json.dumps({
        "id": "test/repeated-line", "version": "2", "vocab_size": len(vocab), "vocab": vocab,
        "encoder": "byte_level", "merges": merges, "pre_tokenizer_pattern": r" ?\w+|\s+|\W+",
    }).encode())  # fmt: skip


def test_starter_ranks_keep_the_first_rank_of_a_repeated_line(held: _HeldBack) -> None:
    tmap = _repeated_line_map()
    assert tokenizer._JoinedPairRanks(tmap.merges).get(("a", "b")) == 0
    warm = Tokenizer.from_map(tmap, defer=held)
    expected = Tokenizer.from_map(tmap, "python").encode("abc abcabc")
    assert warm.encode("abc abcabc") == expected
    assert expected[0] == tmap.vocab["ab"]


def test_starter_decode_with_repeated_ids_and_holes_equals_table_decode(held: _HeldBack) -> None:
    # Two keys with id 300 (the tables keep the last), a hole at 301, a special that is also
    # a vocab key and one that is not.
    vocab = {c: i for i, c in enumerate(BYTE_TO_CHAR)}
    vocab |= {"ab": 300, "cd": 300, "ef": 302, "<s>": 303}
    tmap = load_map_bytes(json.dumps({
        "id": "test/odd-ids", "version": "2", "vocab_size": len(vocab), "vocab": vocab,
        "encoder": "byte_level", "pre_tokenizer_pattern": r"\w+",
        "special_tokens": {"<s>": 303, "<|x y|>": 305},
    }).encode())  # fmt: skip
    tables = _build_tables(tmap)
    warm = Detokenizer(tmap, defer=held)
    for ids in ([300], [301], [302, 303, 304, 305, 306], [97, 300, -1], list(range(295, 310))):
        for shown in (False, True):
            data = b"".join(detokenizer._lookup(tables.shown if shown else tables.hidden, i,
                                                detokenizer._REPLACEMENT_BYTES) for i in ids)
            assert warm.decode(ids, render_special=shown) == data.decode("utf-8", "replace")
    assert warm.decode([300]) == "cd" and warm._tables is None


def test_starter_decode_of_sparse_ids_equals_table_decode(held: _HeldBack) -> None:
    # Ids far past the vocab's size: the starter indexes them with a dict, not a list.
    vocab = {c: i for i, c in enumerate(BYTE_TO_CHAR)} | {"ab": 10**6, "cd": 10**6 - 5}
    tmap = load_map_bytes(json.dumps({
        "id": "test/sparse-ids", "version": "2", "vocab_size": len(vocab), "vocab": vocab,
        "encoder": "byte_level", "pre_tokenizer_pattern": r"\w+",
    }).encode())  # fmt: skip
    warm = Detokenizer(tmap, defer=held)
    ids = [97, 10**6, 10**6 - 5, 10**6 - 1, 10**6 + 1, 300]
    slow = warm.decode(ids)
    assert isinstance(detokenizer._starters[tmap.hash]._key_of.__self__, dict)  # type: ignore[attr-defined]
    assert slow == Detokenizer(tmap).decode(ids) == "aabcd\ufffd\ufffd\ufffd"


def _other_splits(merges: list[str]) -> list[tuple[str, str]]:
    """Pairs whose concatenation is a merge product but which are not its merge line."""
    out = []
    for line in merges[::97]:
        a, b = line.split(" ", 1)
        word = a + b
        out += [(word[:i], word[i:]) for i in range(1, len(word)) if i != len(a)]
    return out


@pytest.mark.parametrize("map_id", BYTE_LEVEL)
def test_aligned_ranks_equal_parse_merges(map_id: str) -> None:
    tmap = _map(map_id)
    ranks, ref = tokenizer._starter_ranks(tmap), parse_merges(tmap.merges)
    assert isinstance(ranks, tokenizer._AlignedPairRanks)  # every shipped byte_level map
    assert len(ranks) == len(ref) and all(ranks.get(p) == r for p, r in ref.items())
    others = _other_splits(tmap.merges)
    assert others and all(ranks.get(p) == ref.get(p) for p in others)
    assert ranks.get(("no such", "pair")) is None


def _byte_level_map(merges: list[str], extra: dict[str, int] | None = None) -> TokenizerMap:
    vocab = {c: i for i, c in enumerate(BYTE_TO_CHAR)}
    for m in merges:
        vocab.setdefault(m.replace(" ", ""), len(vocab))
    vocab |= extra or {}
    return load_map_bytes(json.dumps({
        "id": "test/layout", "version": "2", "vocab_size": len(vocab), "vocab": vocab,
        "encoder": "byte_level", "merges": merges, "pre_tokenizer_pattern": r" ?\w+|\s+|\W+",
    }).encode())  # fmt: skip


@pytest.mark.parametrize("merges, extra, aligned", [
    (["a b", "b c", "ab c"], None, True),
    (["b c", "a b", "a bc", "ab c"], None, False),  # a repeated product
    (["a b", "b c", "a b"], None, False),  # a repeated line
    (["a b", "b c", "ab c"], {"bc": 300}, False),  # merge 1's product is not id base + 1
    (["a b", "b c", "ab c"], {"zz": 257}, False),  # two keys with id base + 1, the last not bc
    (["a b", "c\nd e"], {"ab": 256, "ab\nc": 256, "de": 257}, False),  # cut by a newline
    (["a b", "b c"], {"far": 10**6}, False),  # ids too sparse for the id -> key list
])  # fmt: skip
@pytest.mark.parametrize("chunk", [1, 2, tokenizer._ALIGN_CHUNK])  # faults on a slice's edge
def test_starter_ranks_on_and_off_the_aligned_layout(
    held: _HeldBack, merges: list[str], extra: dict[str, int] | None, aligned: bool, chunk: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(tokenizer, "_ALIGN_CHUNK", chunk)
    tmap = _byte_level_map(merges, extra)
    assert (tokenizer._aligned_base(tmap) is not None) is aligned
    kind = tokenizer._AlignedPairRanks if aligned else tokenizer._JoinedPairRanks
    assert isinstance(tokenizer._starter_ranks(tmap), kind)
    warm, python = Tokenizer.from_map(tmap, defer=held), Tokenizer.from_map(tmap, "python")
    for text in ("abc abcabc", "bcab cba", "a b c"):
        assert warm.encode(text) == python.encode(text)


@pytest.mark.parametrize("where", [0, 4095, 4096, 30_000, -1])
def test_a_real_map_off_its_layout_in_any_slice_is_refused(where: int) -> None:
    """The aligned check compares slice by slice (issue 15): one product moved off its id,
    in the first, a middle or the last slice, or on a slice's edge, is found."""
    tmap = _map("huggingfacetb/smollm2")
    assert tokenizer._aligned_base(tmap) == 252
    merges = list(tmap.merges)
    k = where % len(merges)
    a, b = merges[k].split(" ", 1)
    merges[k] = f"{a} {b}x"  # the line's product is no longer the key with id base + k
    moved = dataclasses.replace(tmap, merges=merges)
    assert tokenizer._aligned_base(moved) is None
