"""Metaspace encoding fast paths (issue 18 item 4): every way of cutting and merging a segment
gives the ids of one whole-sequence merge and of HF `tokenizers`, and each per-map check
falls back when its property does not hold.

The corpus differential for the pure-Python engine is test_tokenizer_differential.py; the
tiktoken engine gets the same corpus check here. The Llama-2 map is not shipped; its merges
are identical to Phi-3's (checked by hand against codec-maps' llama-2.json, BENCHMARKS.md).
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import corpus, fixture_map_path
from tests.hf_oracle import hf_encode, hf_tokenizer
from tokenwire.codec.maps import TokenizerMap, load_map_bytes, load_map_file
from tokenwire.codec.metaspace import METASPACE, MetaspaceEncoder, leading_runs_split
from tokenwire.codec.metaspace_tiktoken import needs_python, product_ranks
from tokenwire.codec.tokenizer import Tokenizer
from tokenwire.errors import TokenizeError

PHI3 = "microsoft/phi-3"
TEXTS = [s for samples in corpus().values() for s in samples]

# Letters, others, metaspace runs, isolated characters (digits, newline, CJK), a character
# the vocabulary lacks (byte fallback), a combining mark, and repeats that make trigrams recur.
ALPHABET = [
    *"abcethrsn ▁.,;:()-'\"\n\t0129中文ßé",
    *["\u0301", "\U0001d11e", "😀", "ab", "the", "  ", "aaa", "--"],
]


@cache
def phi3(scheme: str | None = None) -> TokenizerMap:
    tmap = load_map_file(fixture_map_path(PHI3))
    return tmap if scheme is None else dataclasses.replace(tmap, metaspace_prepend_scheme=scheme)


@cache
def encoder(native: bool, scheme: str | None = None) -> MetaspaceEncoder:
    return MetaspaceEncoder(phi3(scheme), native=native)


@cache
def oracle(scheme: str | None = None) -> Any:
    return hf_tokenizer(phi3(scheme))


def whole(enc: MetaspaceEncoder, text: str) -> list[int]:
    """One merge over the whole normalised segment: no cuts, no tiktoken."""
    normalized = enc.normalize(text, at_text_start=True)
    return list(enc.bpe.encode_uncached(normalized)) if normalized else []


def test_phi3_passes_both_checks() -> None:
    assert encoder(True).cuts == "classes"
    assert encoder(True).native
    assert product_ranks(encoder(True).bpe.ranks) is not None


@pytest.mark.parametrize("scheme", [None, "first"])
def test_tiktoken_engine_equals_hf_on_the_corpus(scheme: str | None) -> None:
    tok = Tokenizer.from_map(phi3(scheme), "tiktoken")
    assert tok.backend == "tiktoken"
    bad = [t for t in TEXTS if tok.encode(t) != hf_encode(oracle(scheme), t)]
    assert bad == [], f"{len(bad)} of {len(TEXTS)} differ, first: {bad[:1]!r}"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(ALPHABET), max_size=80).map("".join))
def test_cut_and_native_merges_equal_one_whole_merge_and_hf(text: str) -> None:
    expected = whole(encoder(False), text)
    assert encoder(False).encode_segment(text, at_text_start=True) == expected  # cuts only
    assert encoder(True).encode_segment(text, at_text_start=True) == expected  # + tiktoken
    assert expected == hf_encode(oracle(), text)


def test_long_pieces_and_repeated_contested_trigrams_take_the_python_merge() -> None:
    found = product_ranks(encoder(True).bpe.ranks)
    assert found is not None
    contested = found.contested
    assert "▁the" in contested[("▁", "t", "h")]  # "▁the" is made by three pairs
    assert needs_python("▁the▁the", contested)  # two pairs of one product could compete
    assert needs_python("▁▁▁▁▁▁▁▁▁x", contested)  # "▁▁▁▁" at several offsets
    assert needs_python("▁▁▁▁x", contested)  # "▁▁▁" (two pairs) at offsets 0 and 1
    assert needs_python("a" * 300, contested)  # long
    assert not needs_python("▁consideration", contested)  # no trigram repeats
    assert not needs_python("ab", contested)
    text = "▁" * 700 + "ab" * 400 + " aaaaaaa " + "x" * 300
    assert encoder(True).encode_segment(text, at_text_start=True) == whole(encoder(False), text)


def _with_extra_merge(tmap: TokenizerMap, token: str) -> TokenizerMap:
    """``tmap`` with one more token, made by a merge of its first character and the rest
    that ranks first, so the merge wins wherever its pair occurs."""
    vocab = dict(tmap.vocab)
    vocab[token] = max(vocab.values()) + 1
    return dataclasses.replace(tmap, vocab=vocab, merges=[f"{token[0]} {token[1:]}", *tmap.merges])


@pytest.mark.parametrize(
    ("token", "cuts"),
    [
        ("s.", "metaspace"),  # a letter joined to an other: no class cuts
        ("s" + METASPACE, "none"),  # a letter joined to a following metaspace: no cuts at all
    ],
)
def test_a_product_crossing_a_cut_turns_the_cut_off(token: str, cuts: str) -> None:
    tmap = _with_extra_merge(phi3(), token)
    enc = MetaspaceEncoder(tmap, native=False)
    assert enc.cuts == cuts
    hf = hf_tokenizer(tmap)
    for text in ["this is. a test", "lots of s. and s s", "yes.no s  x"]:
        ids = enc.encode_segment(text, at_text_start=True)
        assert ids == whole(enc, text) == hf_encode(hf, text)
        assert tmap.vocab[token] in ids  # the crossing merge really happens


def test_merges_not_grouped_by_product_keep_the_python_engine() -> None:
    merges = list(phi3().merges)
    moved = next(i for i, m in enumerate(merges) if m == "▁ the")  # "▁the" has three pairs
    merges.append(merges.pop(moved))
    tmap = dataclasses.replace(phi3(), merges=merges)
    assert Tokenizer.from_map(tmap).backend == "python"
    with pytest.raises(TokenizeError):
        Tokenizer.from_map(tmap, "tiktoken")
    hf = hf_tokenizer(tmap)
    assert Tokenizer.from_map(tmap).encode(" the theme") == hf_encode(hf, " the theme")


def test_a_split_that_is_not_a_merge_keeps_the_python_engine() -> None:
    merges = [m for m in phi3().merges if m != "▁ the"]  # "▁" and "the" are both symbols
    tmap = dataclasses.replace(phi3(), merges=merges)
    assert product_ranks(MetaspaceEncoder(tmap).bpe.ranks) is None
    assert Tokenizer.from_map(tmap).backend == "python"


def _tiny_map(tokens: list[str], merges: list[str]) -> TokenizerMap:
    """A metaspace map with byte fallback over ``tokens``, prepending nothing."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    vocab.update({t: 259 + i for i, t in enumerate(tokens)})
    return load_map_bytes(json.dumps({
        "id": "test/tiny-metaspace", "version": "2", "vocab_size": len(vocab), "vocab": vocab,
        "encoder": "metaspace", "merges": merges, "byte_fallback_start": 3,
        "byte_fallback_end": 258, "special_tokens": {"<unk>": 0, "<s>": 1, "</s>": 2},
        "metaspace_prepend_scheme": "never",
    }).encode())  # fmt: skip


def test_a_piece_that_is_an_unreachable_token_is_merged_not_looked_up() -> None:
    # "b c" ranks first, so "abcd" ends as a|bc|d and never reaches the token "abcd" that
    # "ab cd" makes; tiktoken would return a piece that is a token whole (the sentinel).
    tmap = _tiny_map(["▁", "a", "b", "c", "d", "bc", "ab", "cd", "abcd"],
                     ["b c", "a b", "c d", "ab cd"])  # fmt: skip
    tok = Tokenizer.from_map(tmap, "tiktoken")
    v = tmap.vocab
    for text in ["abcd", "ab", "abcdé", "cd"]:
        assert tok.encode(text) == hf_encode(hf_tokenizer(tmap), text)
    assert tok.encode("abcd") == [v["a"], v["bc"], v["d"]]
    assert tok.encode("ab") == [v["ab"]]


def test_a_missing_character_sharing_bytes_with_a_known_one_is_byte_fallback() -> None:
    # tiktoken assembles the known character's first bytes, then stops: those bytes must
    # still come out as byte-fallback ids, as HF gives them.
    vocab = phi3().vocab
    known = {c.encode()[:2] for c in vocab if len(c) == 1 and len(c.encode()) == 3}
    missing = next(chr(cp) for cp in range(0x4E00, 0xA000)
                   if chr(cp) not in vocab and chr(cp).encode()[:2] in known)  # fmt: skip
    for text in [missing, f"a{missing}b", f"中{missing}{missing}文"]:
        assert encoder(True).encode_segment(text, at_text_start=True) == hf_encode(oracle(), text)


# Indentation and other metaspace runs in front of words, symbols and isolated characters.
RUNS_ALPHABET = [
    *["▁", "▁▁", "▁▁▁▁", "▁" * 8, "▁" * 17, " ", "    ", "\n", "\t"],
    *["def", "self", "x", "(", ")", ":", "the", "中", "0", "\U0001d11e", "é", "aaa", "--"],
]


def test_phi3_splits_metaspace_runs_off_words() -> None:
    assert leading_runs_split(encoder(True).bpe.ranks, phi3().vocab)
    assert encoder(True)._split_runs_id == phi3().vocab[METASPACE]
    assert encoder(False)._split_runs_id is None  # pure Python: never built


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(RUNS_ALPHABET), max_size=40).map("".join))
def test_metaspace_runs_split_off_words_equal_one_whole_merge_and_hf(text: str) -> None:
    enc = MetaspaceEncoder(phi3(), native=True)  # fresh: every piece is a cache miss
    expected = whole(encoder(False), text)
    assert enc.encode_segment(text, at_text_start=True) == expected
    assert expected == hf_encode(oracle(), text)


def test_a_pure_merge_ranked_before_a_mixed_one_keeps_runs_whole() -> None:
    merges = list(phi3().merges)
    merges.insert(0, merges.pop(merges.index("▁ ▁")))  # "▁▁" now merges before "▁d"
    tmap = dataclasses.replace(phi3(), merges=merges)
    enc = MetaspaceEncoder(tmap, native=True)
    assert not leading_runs_split(enc.bpe.ranks, tmap.vocab)
    assert enc._split_runs_id is None
    hf = hf_tokenizer(tmap)
    for text in ["    def f", "  x", "        return self", "   (a)"]:
        ids = enc.encode_segment(text, at_text_start=True)
        assert ids == whole(enc, text) == hf_encode(hf, text)
    v = tmap.vocab
    assert enc.encode_segment("    def", at_text_start=False)[:1] == [v["▁▁▁▁"]]


def test_a_mixed_product_after_two_metaspaces_keeps_runs_whole() -> None:
    tmap = _with_extra_merge(phi3(), "▁▁def")
    assert not leading_runs_split(MetaspaceEncoder(tmap).bpe.ranks, tmap.vocab)
