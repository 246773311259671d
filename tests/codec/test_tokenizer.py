"""Rules of text -> ids (codec-spec §3.4, §9.1 items 18-19, §10 item 8), one test per rule.

The differential checks against HF `tokenizers` live in test_tokenizer_differential.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import fixture_map_path
from tests.hf_oracle import hf_encode, hf_tokenizer
from tokenwire.codec.bpe import BPE, _merge_heap, _merge_scan
from tokenwire.codec.byte_level import BYTE_TO_CHAR
from tokenwire.codec.maps import TokenizerMap, load_map_bytes, load_map_file
from tokenwire.codec.metaspace import NATIVE_AFTER_MISSES, MetaspaceEncoder
from tokenwire.codec.tokenizer import Tokenizer
from tokenwire.errors import TokenizeError, VocabMiss

BYTE_LEVEL = ["openai/cl100k_base", "huggingfacetb/smollm2", "tiiuae/falcon"]
BACKENDS = ["tiktoken", "python"]


@cache
def fixture_map(map_id: str) -> TokenizerMap:
    return load_map_file(fixture_map_path(map_id))


@cache
def tokenizer(map_id: str, backend: str = "auto") -> Tokenizer:
    return Tokenizer.from_map(fixture_map(map_id), backend)


def _small_map(doc: dict) -> TokenizerMap:
    return load_map_bytes(json.dumps(doc).encode())


# --- special tokens are opt-in ---------------------------------------------------------


@pytest.mark.parametrize(
    "map_id", ["openai/cl100k_base", "huggingfacetb/smollm2", "microsoft/phi-3"]
)
def test_special_token_text_in_untrusted_input_is_encoded_as_text(map_id: str) -> None:
    tmap = fixture_map(map_id)
    tok = tokenizer(map_id)
    for name in tmap.special_tokens:
        text = f"user says {name} and {name}{name}"
        ids = tok.encode(text)
        assert not set(ids) & tmap.special_ids, name
        assert ids == hf_encode(_hf(map_id), text)


@cache
def _hf(map_id: str, with_specials: bool = False):  # type: ignore[no-untyped-def]
    tmap = fixture_map(map_id)
    return hf_tokenizer(tmap, specials=tmap.special_tokens if with_specials else ())


@pytest.mark.parametrize(
    "map_id", ["openai/cl100k_base", "huggingfacetb/smollm2", "microsoft/phi-3"]
)
def test_allowed_special_all_emits_control_ids_like_hf_added_tokens(map_id: str) -> None:
    tmap = fixture_map(map_id)
    tok = tokenizer(map_id)
    for name, tid in tmap.special_tokens.items():
        text = f"a {name}b{name} c"
        ids = tok.encode(text, allowed_special="all")
        assert ids.count(tid) == 2, name
        assert ids == hf_encode(_hf(map_id, True), text)


def test_allowed_special_subset_allows_only_the_named_tokens() -> None:
    tok = tokenizer("openai/cl100k_base")
    text = "<|endoftext|><|fim_prefix|>"
    ids = tok.encode(text, allowed_special={"<|endoftext|>"})
    assert ids[0] == 100257
    assert 100258 not in ids
    assert ids[1:] == tok.encode("<|fim_prefix|>")


def test_allowed_special_unknown_name_is_refused() -> None:
    with pytest.raises(TokenizeError, match="not special tokens"):
        tokenizer("openai/cl100k_base").encode("x", allowed_special={"<|nope|>"})


def test_allowed_special_matches_the_longest_special_token() -> None:
    tmap = _small_map({
        "id": "test/identity", "version": "2", "vocab_size": 5,
        "vocab": {"a": 0, "<": 1, ">": 2, "<x>": 3, "<x>>": 4},
        "special_tokens": {"<x>": 3, "<x>>": 4},
    })  # fmt: skip
    tok = Tokenizer.from_map(tmap)
    assert tok.encode("a<x>>a<x>a", allowed_special="all") == [0, 4, 0, 3, 0]
    assert tok.encode("<x>>", allowed_special={"<x>"}) == [3, 2]


# --- nothing is dropped silently -------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_byte_missing_from_vocab_raises_vocab_miss_when_strict(backend: str) -> None:
    # Falcon's vocab has no token for \x0b; by default it is dropped as HF drops it.
    tok = Tokenizer.from_map(fixture_map("tiiuae/falcon"), backend, on_missing="raise")
    with pytest.raises(VocabMiss) as info:
        tok.encode("tab\x0bhere")
    assert info.value.symbol == "\x0b"
    with pytest.raises(VocabMiss):
        tok.encode("\x0b")
    assert tokenizer("tiiuae/falcon", backend).encode("\x0b") == []


def test_metaspace_unknown_character_becomes_byte_fallback_ids() -> None:
    tmap = fixture_map("microsoft/phi-3")
    start = tmap.byte_fallback[0]  # type: ignore[index]
    char = "\U0001d11e"  # MUSICAL SYMBOL G CLEF: not in the phi-3 vocab
    assert char not in tmap.vocab
    ids = tokenizer("microsoft/phi-3").encode(char)
    assert ids[1:] == [start + b for b in char.encode()]


def test_identity_map_uses_longest_prefix_match() -> None:
    tmap = _small_map({
        "id": "test/identity", "version": "2", "vocab_size": 4,
        "vocab": {"a": 0, "ab": 1, "abc": 2, "b": 3},
    })  # fmt: skip
    tok = Tokenizer.from_map(tmap)
    assert tok.encode("abcab") == [2, 1]
    assert tok.encode("ba") == [3, 0]
    with pytest.raises(VocabMiss):
        tok.encode("abz")


def test_identity_placeholder_map_raises_on_text_and_allows_its_special() -> None:
    tok = tokenizer("anthropic/claude-3-text")
    assert tok.encode("") == []
    assert tok.encode("<|placeholder|>", allowed_special="all") == [0]
    with pytest.raises(VocabMiss):
        tok.encode("<|placeholder|>")
    with pytest.raises(VocabMiss):
        tok.encode("hello")


def test_lone_surrogate_is_a_tokenize_error() -> None:
    for backend in BACKENDS:
        with pytest.raises(TokenizeError):
            tokenizer("openai/cl100k_base", backend).encode("a\ud800b")
    with pytest.raises(TokenizeError):
        tokenizer("microsoft/phi-3").encode("a\udfffb")


# --- metaspace: SentencePiece behaviour, not the reference approximation ----------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", []),
        (" ", [259]),  # "▁▁": the prepended ▁ plus the space
        ("a  b", [263, 29871, 289]),  # no whitespace collapsing
        ("a\tb", [263, 12, 29890]),  # the tab survives
        ("\n", [29871, 13]),
    ],
)
def test_metaspace_always_prepends_and_never_collapses_whitespace(
    text: str, expected: list[int]
) -> None:
    assert tokenizer("microsoft/phi-3").encode(text) == expected


def test_metaspace_first_prepends_only_at_text_start() -> None:
    tmap = dataclasses.replace(fixture_map("microsoft/phi-3"), metaspace_prepend_scheme="first")
    tok = Tokenizer.from_map(tmap)
    hf = hf_tokenizer(tmap, specials=tmap.special_tokens)
    assert tok.encode(" Hello") == tok.encode("Hello") == [15043]
    text = "<|user|>hi<|end|> ok"
    ids = tok.encode(text, allowed_special="all")
    assert ids == hf_encode(hf, text)
    assert ids[1] == tmap.vocab["hi"]  # no ▁ after a special token with scheme "first"


def test_metaspace_cut_before_spaces_is_exact() -> None:
    enc = MetaspaceEncoder(fixture_map("microsoft/phi-3"))
    assert enc.cuts == "classes"
    text = "Hello  world,\tthis is\n  a test of   spaces. 中文 テスト ok"
    whole = list(enc.bpe.encode_uncached(enc.normalize(text, at_text_start=True)))
    assert enc.encode_segment(text, at_text_start=True) == whole


# --- the BPE core -----------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from("abcd"), min_size=0, max_size=120),
    st.dictionaries(
        st.tuples(st.sampled_from(["a", "b", "c", "d", "ab", "cd", "abab", "bc"]),
                  st.sampled_from(["a", "b", "c", "d", "ab", "cd", "abcd", "c"])),
        st.integers(0, 6), max_size=12,
    ),
)  # fmt: skip
def test_heap_merge_equals_lowest_rank_leftmost_scan(symbols: list[str], ranks: dict) -> None:
    assert _merge_heap(list(symbols), ranks) == _merge_scan(list(symbols), ranks)


def test_merge_uses_pair_rank_not_product_rank() -> None:
    # "a bc" and "ab c" both make "abc"; HF ranks pairs, so which pair exists decides.
    vocab = {"a": 0, "b": 1, "c": 2, "bc": 3, "ab": 4, "abc": 5}
    bpe = BPE(vocab, ["b c", "a b", "ab c"])
    assert bpe.encode_word("abc") == (0, 3)  # "b c" wins first, and there is no "a bc"


def test_word_cache_is_bounded() -> None:
    tok = Tokenizer.from_map(fixture_map("microsoft/phi-3"), cache_size=8)
    tok.encode(" ".join(f"w{i}" for i in range(100)))
    assert tok._engine.encoder.cache_info().currsize <= 8  # type: ignore[attr-defined]


def test_remapped_ranks_when_ids_are_not_in_merge_order() -> None:
    # Merge products whose ids fall in the opposite order of the merges: tiktoken gets
    # merge-order ranks and the rank -> id list maps them back.
    vocab = {c: i for i, c in enumerate(BYTE_TO_CHAR)}
    merges = ["a b", "ab c", "Ġ ab", "c c"]
    for i, m in enumerate(merges):
        vocab[m.replace(" ", "")] = 400 - i
    tmap = _small_map({
        "id": "test/remap", "version": "2", "vocab_size": len(vocab), "vocab": vocab,
        "encoder": "byte_level", "merges": merges, "pre_tokenizer_pattern": r" ?\w+|\s+|\W+",
    })  # fmt: skip
    fast, slow = Tokenizer.from_map(tmap, "tiktoken"), Tokenizer.from_map(tmap, "python")
    assert fast._engine.remap is not None  # type: ignore[attr-defined]
    hf = hf_tokenizer(tmap)
    for text in ["abc ab cc", "abcc abab", " ab", "xyz!"]:
        assert fast.encode(text) == slow.encode(text) == hf_encode(hf, text)


# --- API --------------------------------------------------------------------------------


def test_calls_counts_every_encoded_text() -> None:
    tok = Tokenizer.from_map(fixture_map("openai/r50k_base"))
    tok.encode("a")
    tok.encode_batch(["b", "c"])
    assert tok.calls == 3


def test_backend_auto_picks_tiktoken_where_it_is_exact() -> None:
    assert tokenizer("openai/cl100k_base").backend == "tiktoken"
    assert Tokenizer.from_map(fixture_map("microsoft/phi-3"), "tiktoken").backend == "tiktoken"
    assert tokenizer("microsoft/phi-3", "python").backend == "python"


def test_metaspace_auto_moves_to_tiktoken_once_busy() -> None:
    tok = Tokenizer.from_map(fixture_map("microsoft/phi-3"))
    python = tokenizer("microsoft/phi-3", "python")
    assert tok.backend == "python"  # a map is ready before the tiktoken engine is built
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(w) for w in itertools.product(letters, repeat=3)][:NATIVE_AFTER_MISSES]
    for i in range(0, len(words), 16):
        text = " ".join(words[i : i + 16])
        assert tok.encode(text) == python.encode(text)
    assert tok.backend == "tiktoken"
    text = "after the switch, the same ids"
    assert tok.encode(text) == python.encode(text)


def test_tiktoken_backend_is_refused_for_identity_maps() -> None:
    with pytest.raises(TokenizeError):
        Tokenizer.from_map(fixture_map("anthropic/claude-3-text"), "tiktoken")
    with pytest.raises(ValueError):
        Tokenizer.from_map(fixture_map("microsoft/phi-3"), "rust")  # type: ignore[arg-type]


@pytest.mark.parametrize("map_id", BYTE_LEVEL)
def test_backends_agree_on_long_single_pieces(map_id: str) -> None:
    # Pieces over the cache limit and over the heap threshold take the uncached paths.
    text = "a" * 700 + " " + "ab" * 400 + " " + "中文" * 300 + " " * 300 + "x"
    assert tokenizer(map_id, "tiktoken").encode(text) == tokenizer(map_id, "python").encode(text)
