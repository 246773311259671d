"""Bytes the vocabulary lacks and very long runs (issue 18 item 1, issue 11 item 3).

* A byte a byte_level vocab has no token for is dropped exactly as the model's own
  tokenizer drops it: HF ``tokenizers`` removes it before merging (our default,
  ``on_missing="drop"``), llama.cpp after merging (``"drop_after_merge"``); ``"raise"`` keeps
  the strict refusal. Checked on inputs made of exactly those bytes, for every map that
  lacks some (SmolLM2 bundled, Falcon).
* A run of ~1M whitespace characters used to overflow the stack of tiktoken's regex VM (a
  Rust ``PanicException``). Runs of every character class are checked against HF at sizes
  it can handle, and at sizes past the old panic.
"""

from __future__ import annotations

import random
from functools import cache
from typing import Any

import pytest

from tests.conftest import fixture_map_path
from tests.hf_oracle import hf_encode, hf_tokenizer, real_pre_tokenizer
from tokenwire.codec.byte_level import BYTE_TO_CHAR
from tokenwire.codec.maps import TokenizerMap, bundled_map_path, load_map_file
from tokenwire.codec.tokenizer import NATIVE_REGEX_MAX_CHARS, Tokenizer
from tokenwire.errors import VocabMiss

BACKENDS = ["tiktoken", "python"]


@cache
def smollm2() -> TokenizerMap:
    return load_map_file(bundled_map_path("huggingfacetb/smollm2"))


@cache
def falcon() -> TokenizerMap:
    return load_map_file(fixture_map_path("tiiuae/falcon"))


@cache
def hf_for(map_id: str) -> Any:
    if map_id == "huggingfacetb/smollm2":
        return hf_tokenizer(smollm2(), pre_tokenizer=real_pre_tokenizer(map_id))
    return hf_tokenizer(falcon())  # Falcon's own pattern: what the map's program says


@cache
def ours(map_id: str, backend: str, on_missing: str = "drop") -> Tokenizer:
    tmap = smollm2() if map_id == "huggingfacetb/smollm2" else falcon()
    return Tokenizer.from_map(tmap, backend, on_missing=on_missing)  # type: ignore[arg-type]


def missing_chars(tmap: TokenizerMap) -> list[str]:
    """Characters whose UTF-8 holds a byte the vocab lacks (a lead byte: one code point of
    the range it starts)."""
    out = []
    for b in range(256):
        if BYTE_TO_CHAR[b] in tmap.vocab:
            continue
        if b < 0x80:
            out.append(chr(b))
        elif 0xF0 <= b <= 0xF4:
            out += [chr(((b & 0x07) << 18) | 0x10000 * k) for k in (0, 1)] + [
                chr(((b & 0x07) << 18) + 0x3FFFF)]
    return out


def _made_of_missing_bytes(tmap: TokenizerMap, n: int) -> list[str]:
    rng = random.Random(18)
    missing = missing_chars(tmap)
    around = ["!", "!!", ".", " ", "a", "ab", "\n", "1", "é", "中", "-", "==", "\t", "'s"]
    texts = [m for m in missing] + [m * 3 for m in missing]
    texts += [f"a{m}b" for m in missing] + [f"!{m}!" for m in missing]
    for _ in range(n):
        texts.append("".join(rng.choice(missing + around) for _ in range(rng.randint(1, 10))))
    return texts


MAPS_WITH_MISSING = ["huggingfacetb/smollm2", "tiiuae/falcon"]


# C0, C1 and F5..FF never occur in UTF-8, so a vocab may lack them at no cost.
_IN_UTF8 = [b for b in range(256) if b not in (0xC0, 0xC1) and b < 0xF5]


def test_smollm2_and_falcon_lack_the_bytes_the_issue_names() -> None:
    lacks = {b for b in _IN_UTF8 if BYTE_TO_CHAR[b] not in smollm2().vocab}
    assert lacks == {0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xF1, 0xF2}
    assert 0x0B in {b for b in _IN_UTF8 if BYTE_TO_CHAR[b] not in falcon().vocab}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_byte_the_vocab_lacks_is_dropped_like_hf_and_llama_cpp(backend: str) -> None:
    assert ours("huggingfacetb/smollm2", backend).encode("a\x1db") == [81, 82]


@pytest.mark.parametrize("map_id", MAPS_WITH_MISSING)
@pytest.mark.parametrize("backend", BACKENDS)
def test_missing_bytes_are_dropped_like_hf_before_merging(map_id: str, backend: str) -> None:
    tok, hf = ours(map_id, backend), hf_for(map_id)
    bad = [t for t in _made_of_missing_bytes(tok.map, 1500) if tok.encode(t) != hf_encode(hf, t)]
    assert bad == []


@pytest.mark.parametrize("map_id", MAPS_WITH_MISSING)
@pytest.mark.parametrize("backend", BACKENDS)
def test_strict_option_refuses_a_missing_byte(map_id: str, backend: str) -> None:
    tok = ours(map_id, backend, "raise")
    for ch in missing_chars(tok.map):
        with pytest.raises(VocabMiss):
            tok.encode(f"x{ch}y")


def test_on_missing_must_be_a_known_policy() -> None:
    with pytest.raises(ValueError, match="on_missing"):
        Tokenizer.from_map(smollm2(), on_missing="ignore")  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def llama_smollm2() -> Any:
    llama_cpp = pytest.importorskip("llama_cpp")
    from tokenwire.gguf_tokenizer import smollm2_gguf_path

    return llama_cpp.Llama(model_path=str(smollm2_gguf_path()), vocab_only=True, verbose=False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_drop_after_merge_equals_llama_cpp_on_missing_bytes(llama_smollm2: Any,
                                                             backend: str) -> None:  # fmt: skip
    tok = ours("huggingfacetb/smollm2", backend, "drop_after_merge")
    texts = _made_of_missing_bytes(tok.map, 1500)
    truth = [llama_smollm2.tokenize(t.encode(), add_bos=False, special=False) for t in texts]
    bad = [t for t, ids in zip(texts, truth, strict=True) if tok.encode(t) != ids]
    assert bad == []
    # ...and the two engines really disagree on some of these inputs.
    hf = hf_for("huggingfacetb/smollm2")
    assert any(hf_encode(hf, t) != ids for t, ids in zip(texts, truth, strict=True))


# --- long runs ---------------------------------------------------------------------------

RUNS = {
    "spaces": " ", "newlines": "\n", "tabs": "\t", "crlf": "\r\n", "ideographic space": "\u3000",
    "mixed whitespace": " \n\t\u00a0", "letter": "a", "accented letter": "é", "cjk": "中",
    "digit": "1", "digits": "1234567890", "punctuation": "!", "mixed punctuation": "!?.,;",
    "emoji": "😀", "word and space": "ab ",
}  # fmt: skip


def _run(unit: str, chars: int) -> str:
    return unit * (chars // len(unit))


@pytest.mark.parametrize("name", list(RUNS))
def test_long_runs_equal_hf_in_both_backends(name: str) -> None:
    # 100k: HF and the pure-Python backend run in about a second; the tiktoken backend also
    # takes its split path (text longer than NATIVE_REGEX_MAX_CHARS).
    text = _run(RUNS[name], 100_000)
    assert len(text) > NATIVE_REGEX_MAX_CHARS
    truth = hf_encode(hf_for("huggingfacetb/smollm2"), text)
    for backend in BACKENDS:
        assert ours("huggingfacetb/smollm2", backend).encode(text) == truth, backend
    short = text[: NATIVE_REGEX_MAX_CHARS]  # the native path, at its largest
    assert ours("huggingfacetb/smollm2", "tiktoken").encode(short) == hf_encode(
        hf_for("huggingfacetb/smollm2"), short)


@pytest.mark.parametrize("name", ["spaces", "newlines", "mixed whitespace", "ideographic space"])
def test_runs_that_used_to_panic_equal_hf(name: str) -> None:
    # 1.1 M characters: past fancy-regex's 1,000,000-entry stack (a PanicException before).
    text = _run(RUNS[name], 1_100_000)
    tok = ours("huggingfacetb/smollm2", "tiktoken")
    assert tok.encode(text) == hf_encode(hf_for("huggingfacetb/smollm2"), text)


def test_long_text_with_specials_and_cl100k_runs() -> None:
    tmap = load_map_file(fixture_map_path("openai/cl100k_base"))
    tok = Tokenizer.from_map(tmap, "tiktoken")
    hf = hf_tokenizer(tmap, specials=tmap.special_tokens)
    text = "x" + " " * 1_100_000 + "<|endoftext|>" + "\n" * 1_100_000 + "y"
    assert tok.encode(text, allowed_special="all") == hf_encode(hf, text)


@pytest.mark.parametrize("name", ["spaces", "letter", "digit", "newlines", "punctuation",
                                  "mixed whitespace", "cjk"])
def test_long_runs_equal_hf_with_a_metaspace_map(name: str) -> None:
    # The metaspace path has no native regex; its pure-Python BPE is O(n log n) per word.
    tmap = load_map_file(fixture_map_path("microsoft/phi-3"))
    text = _run(RUNS[name], 30_000)
    assert Tokenizer.from_map(tmap).encode(text) == hf_encode(hf_tokenizer(tmap), text)
