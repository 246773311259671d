"""Differential tests: our ids == Hugging Face `tokenizers` ids, 0 mismatches
(codec-spec §10 item 6), on the whole corpus and on a fuzz over a tricky alphabet.

Oracles (tests/hf_oracle.py), per map:

* cl100k, r50k: HF with the map's pattern, and tiktoken built from the map's vocab with
  tiktoken's own ``pat_str`` (the real OpenAI semantics: ranks are ids).
* SmolLM2, Falcon: HF with the map's OWN pattern (is our BPE exact?), and separately the
  model's REAL pre-tokenizer, which the map's v1 program only approximates (codec-spec §3.5
  caveats, §9.1 item 17); the faithful v2 programs reach 0 mismatches against it, except
  for one class of Falcon texts that no v2 program can express (see
  ``falcon_byte_digit_hazard``). The published maps' own v1 program and pattern also
  disagree with each other (``test_published_program_and_pattern_disagree``), so the
  "own pattern" cases drop the program and use the pattern, which is what HF is given.
* phi-3: HF with the Llama-2 normaliser (scheme "always"), and a synthetic Mistral-v3 check
  (the same vocab with scheme "first") against HF's Metaspace pre-tokenizer.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any

import pytest
import tiktoken
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiktoken_ext.openai_public import r50k_pat_str

from tests.conftest import corpus, fixture_map_path
from tests.hf_oracle import hf_encode, hf_tokenizer, real_pre_tokenizer
from tokenwire.codec.byte_level import BYTE_TO_CHAR, chars_to_bytes
from tokenwire.codec.detokenizer import Detokenizer
from tokenwire.codec.maps import TokenizerMap, load_map_file
from tokenwire.codec.tokenizer import Tokenizer

# tiktoken's own cl100k pattern (tiktoken_ext.openai_public.cl100k_base, which downloads).
CL100K_PAT_STR = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
TIKTOKEN_PAT = {"openai/cl100k_base": CL100K_PAT_STR, "openai/r50k_base": r50k_pat_str}

# The v2 programs that transcribe the real HF Sequence pre-tokenizers (codec-spec §3.5).
_BYTE_LEVEL_OPS: list[dict[str, Any]] = [
    {"op": "literals", "patterns": ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]},
    {"op": "letters", "lead_space": True},
    {"op": "numbers", "lead_space": True},
    {"op": "punct_run", "lead_space": True},
    {"op": "trailing_ws"},
    {"op": "ws_run"},
]
FAITHFUL_V2: dict[str, dict[str, Any]] = {
    "huggingfacetb/smollm2": {"version": 2, "stages": [
        {"stage": "digits_isolate", "mode": "individual"},
        {"stage": "alternation", "ops": _BYTE_LEVEL_OPS},
    ]},
    "tiiuae/falcon": {"version": 2, "stages": [
        {"stage": "punctuation_contiguous"},
        {"stage": "alternation", "ops": _BYTE_LEVEL_OPS},
        {"stage": "digits_isolate", "mode": "grouped"},
        {"stage": "digit_triples_isolate"},
    ]},
}  # fmt: skip

# (case name, map id, variant): variant "first" switches the prepend scheme, "pattern"
# drops the program so the map's legacy pattern is used.
CASES = [
    ("cl100k", "openai/cl100k_base", None),
    ("r50k", "openai/r50k_base", None),
    ("smollm2-own-pattern", "huggingfacetb/smollm2", "pattern"),
    ("falcon-own-pattern", "tiiuae/falcon", "pattern"),
    ("phi3-always", "microsoft/phi-3", None),
    ("phi3-as-mistral-first", "microsoft/phi-3", "first"),
]

TEXTS = [s for samples in corpus().values() for s in samples]


@cache
def tmap_for(map_id: str, scheme: str | None = None, faithful: bool = False) -> TokenizerMap:
    tmap = load_map_file(fixture_map_path(map_id))
    if scheme == "pattern":
        tmap = dataclasses.replace(tmap, pre_tokenizer_program=None)
    elif scheme is not None:
        tmap = dataclasses.replace(tmap, metaspace_prepend_scheme=scheme)
    if faithful:
        tmap = dataclasses.replace(
            tmap, pre_tokenizer_program=FAITHFUL_V2[map_id], pre_tokenizer_pattern=None
        )
    return tmap


@cache
def ours(map_id: str, scheme: str | None, backend: str, faithful: bool = False) -> Tokenizer:
    return Tokenizer.from_map(tmap_for(map_id, scheme, faithful), backend)


@cache
def oracle(map_id: str, scheme: str | None, real: bool = False, specials: bool = False) -> Any:
    tmap = tmap_for(map_id, scheme)
    return hf_tokenizer(
        tmap,
        pre_tokenizer=real_pre_tokenizer(map_id) if real else None,
        specials=tmap.special_tokens if specials else (),
    )


@cache
def tiktoken_truth(map_id: str) -> tiktoken.Encoding:
    tmap = tmap_for(map_id)
    ranks = {chars_to_bytes(k): v for k, v in tmap.vocab.items() if k not in tmap.special_tokens}
    return tiktoken.Encoding(map_id, pat_str=TIKTOKEN_PAT[map_id], mergeable_ranks=ranks,  # type: ignore[arg-type]
                             special_tokens={})  # fmt: skip


def missing_bytes(tmap: TokenizerMap) -> frozenset[int]:
    if tmap.encoder != "byte_level":
        return frozenset()
    return frozenset(b for b in range(256) if BYTE_TO_CHAR[b] not in tmap.vocab)


def backends_for(map_id: str) -> list[str]:
    return ["tiktoken", "python"] if tmap_for(map_id).encoder == "byte_level" else ["python"]


def check_equal(tok: Tokenizer, hf: Any, text: str, **kw: Any) -> bool:
    """ours == HF, bytes the map cannot represent included (both drop them)."""
    return tok.encode(text, **kw) == hf_encode(hf, text)


def mismatches(tok: Tokenizer, hf: Any, texts: list[str], **kw: Any) -> list[str]:
    return [t for t in texts if not check_equal(tok, hf, t, **kw)]


# --- the corpus ---------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "map_id", "scheme"), CASES, ids=[c[0] for c in CASES])
def test_encode_equals_hf_on_the_corpus(name: str, map_id: str, scheme: str | None) -> None:
    hf = oracle(map_id, scheme)
    for backend in backends_for(map_id):
        bad = mismatches(ours(map_id, scheme, backend), hf, TEXTS)
        assert bad == [], f"{name}/{backend}: {len(bad)} mismatches, first {bad[0][:80]!r}"


@pytest.mark.parametrize(("name", "map_id", "scheme"), CASES, ids=[c[0] for c in CASES])
def test_allowed_special_equals_hf_added_tokens(name: str, map_id: str, scheme: str | None) -> None:
    tmap = tmap_for(map_id, scheme)
    names = list(tmap.special_tokens)
    texts = list(corpus()["special_lookalikes"])
    texts += [f"{a}x {b}\n{a}{b} " for a, b in zip(names, names[1:] + names[:1], strict=True)]
    texts += [" " + n for n in names] + [n + " tail" for n in names]
    hf = oracle(map_id, scheme, specials=True)
    for backend in backends_for(map_id):
        bad = mismatches(ours(map_id, scheme, backend), hf, texts, allowed_special="all")
        assert bad == [], f"{name}/{backend}: {bad[:3]!r}"


@pytest.mark.parametrize("map_id", ["openai/cl100k_base", "openai/r50k_base"])
def test_openai_maps_equal_tiktoken_with_its_own_pattern(map_id: str) -> None:
    truth = tiktoken_truth(map_id)
    for backend in backends_for(map_id):
        tok = ours(map_id, None, backend)
        bad = [t for t in TEXTS if tok.encode(t) != truth.encode_ordinary(t)]
        assert bad == [], f"{backend}: {bad[:2]!r}"


@pytest.mark.parametrize(("name", "map_id", "scheme"), CASES, ids=[c[0] for c in CASES])
def test_decode_of_encode_is_the_text(name: str, map_id: str, scheme: str | None) -> None:
    tok = ours(map_id, scheme, "auto")
    detok = Detokenizer(tok.map)
    missing = missing_bytes(tok.map)
    for text in TEXTS:
        if missing & set(text.encode("utf-8")):
            continue
        # HF's Metaspace(first) decoder strips the space that encode folded into the
        # prepended ▁, so a leading space cannot survive a round trip with that scheme.
        expected = text[1:] if scheme == "first" and text.startswith(" ") else text
        assert detok.decode(tok.encode(text)) == expected, text[:80]


# --- the maps' approximated pre-tokenizers (codec-spec §3.5 caveats) ------------------------


@pytest.mark.parametrize(
    ("map_id", "text"), [("huggingfacetb/smollm2", "a  1"), ("tiiuae/falcon", '  "')]
)
def test_v1_approximation_in_published_map_differs_from_the_real_model(
    map_id: str, text: str
) -> None:
    # Our encode is exact for the map as published; the map itself is unfaithful.
    approx = ours(map_id, None, "auto").encode(text)
    assert approx == hf_encode(oracle(map_id, "pattern"), text)
    assert approx != hf_encode(oracle(map_id, "pattern", real=True), text)
    faithful = ours(map_id, None, "auto", faithful=True).encode(text)
    assert faithful == hf_encode(oracle(map_id, "pattern", real=True), text)


def test_published_program_and_pattern_disagree() -> None:
    # Falcon's v1 program has `numbers{max_run 3}` where its pattern has ` ?\p{N}{1,3}`
    # (SmolLM2 likewise drops the lead space), so " ²" is one piece for the pattern and
    # two for the program; Falcon has a merge "Ġ Â", so the ids differ. codec-spec §3.5
    # requires them to agree; we follow the program (§3.4 step 2).
    text = " ²"
    shipped = ours("tiiuae/falcon", None, "auto").encode(text)
    assert shipped != ours("tiiuae/falcon", "pattern", "auto").encode(text)
    assert ours("tiiuae/falcon", "pattern", "auto").encode(text) == hf_encode(
        oracle("tiiuae/falcon", "pattern"), text
    )


# HF's Falcon Sequence runs Digits and Split([0-9]{3}) AFTER ByteLevel, i.e. over GPT-2
# byte characters, where bytes B2 B3 B9 BC BD BE are the numerals ² ³ ¹ ¼ ½ ¾ and a real
# non-ASCII digit (٣ = D9 A3 -> "Ù£") is no numeral at all. A v2 program's stages see
# text (codec-spec §3.5), so no program can transcribe that. It shows only where a merge
# joins a byte numeral's neighbours (Falcon has "Ġ Â", so " ²" differs): the corpus has
# 99 such texts and 0 mismatches, so the corpus check keeps them all; the fuzz skips them
# and the difference is pinned below.
_BYTE_NUMERALS = frozenset(b"\xb2\xb3\xb9\xbc\xbd\xbe")


def falcon_byte_digit_hazard(text: str) -> bool:
    return bool(_BYTE_NUMERALS & set(text.encode("utf-8"))) or any(
        c.isnumeric() and not c.isascii() for c in text
    )


@pytest.mark.parametrize("map_id", ["huggingfacetb/smollm2", "tiiuae/falcon"])
def test_faithful_v2_program_equals_the_real_pre_tokenizer(map_id: str) -> None:
    hf_real = oracle(map_id, "pattern", real=True)
    for backend in backends_for(map_id):
        bad = mismatches(ours(map_id, None, backend, faithful=True), hf_real, TEXTS)
        assert bad == [], f"{backend}: {len(bad)} mismatches, first {bad[0][:80]!r}"


@pytest.mark.parametrize("text", [" ²", "a ¼"])
def test_falcon_digit_stages_after_byte_level_see_byte_characters(text: str) -> None:
    assert falcon_byte_digit_hazard(text)
    faithful = ours("tiiuae/falcon", None, "auto", faithful=True).encode(text)
    assert faithful != hf_encode(oracle("tiiuae/falcon", "pattern", real=True), text)


# --- fuzz over a tricky alphabet ------------------------------------------------------------

ALPHABET = [
    " ", "  ", "\t", "\n", "\r\n", "\r", "\x0b", "\x0c", "\x1c", "\x85", "\xa0", "\u1680",
    "\u2000", "\u2028", "\u2029", "\u3000", "\u200b", "²", "½", "٣", "'S", "'s", "'ll", "'",
    "e\u0301", "\u0301", "中文", "テスト", "한국어", "👍🏽", "🇫🇷", "a", "Hello", "WORLD", "0",
    "123", "12345", "!", ".,", "\"", "(){}", "#", "▁", "ß", "İ", "<|endoftext|>", "<s>",
]  # fmt: skip
fuzz_texts = st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=10).map("".join)


def _fuzz(name: str, map_id: str, scheme: str | None, text: str) -> None:
    hf = oracle(map_id, scheme)
    for backend in backends_for(map_id):
        assert check_equal(ours(map_id, scheme, backend), hf, text), f"{name}/{backend}"


@pytest.mark.parametrize(("name", "map_id", "scheme"), CASES, ids=[c[0] for c in CASES])
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=fuzz_texts)
def test_encode_equals_hf_on_fuzzed_text(
    name: str, map_id: str, scheme: str | None, text: str
) -> None:
    _fuzz(name, map_id, scheme, text)


@pytest.mark.parametrize("map_id", ["huggingfacetb/smollm2", "tiiuae/falcon"])
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=fuzz_texts)
def test_faithful_v2_program_equals_real_pre_tokenizer_on_fuzzed_text(
    map_id: str, text: str
) -> None:
    if map_id == "tiiuae/falcon" and falcon_byte_digit_hazard(text):
        return
    hf_real = oracle(map_id, "pattern", real=True)
    for backend in backends_for(map_id):
        assert check_equal(ours(map_id, None, backend, faithful=True), hf_real, text), backend
