"""Map generation (codec-spec 3.1, 3.5, 3.6): from HF tokenizer.json and GGUF metadata.

The point of a generated map is that our tokenizer on it gives the model's own ids, so the
central tests build real HF tokenizers (SmolLM2, Falcon, Phi-3 style) with ``tokenizers``,
save them as tokenizer.json, generate a map and encode the differential corpus both ways.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from tests.conftest import CODEC_FIXTURES, corpus, fixture_map_path
from tests.hf_oracle import metaspace_normalizer_always, real_pre_tokenizer
from tokenwire.codec.byte_level import BYTE_TO_CHAR
from tokenwire.codec.generate import (
    GGUF_PRE_PROGRAMS,
    GGUFTokenizerMeta,
    GgufTokenType,
    map_document_bytes,
    map_from_gguf_metadata,
    map_from_tokenizer_json,
    merges_from_scores,
)
from tokenwire.codec.maps import bundled_map_path, load_map_bytes
from tokenwire.codec.pretok import compile_program
from tokenwire.codec.pretok_lower import lower_hf_pretokenizer
from tokenwire.codec.tokenizer import Tokenizer as OurTokenizer
from tokenwire.errors import GenerateError, VocabMiss

PUBLISHED = "2026-11-29T00:00:00Z"
SPEC_ORDER = [
    "id", "version", "vocab_size", "vocab", "encoder", "merges", "pre_tokenizer_pattern",
    "pre_tokenizer_program", "byte_fallback_start", "byte_fallback_end",
    "metaspace_prepend_scheme", "special_tokens", "tool_calling", "zstd_dictionaries",
    "published_at",
]  # fmt: skip


def _fixture(map_id: str) -> dict[str, Any]:
    return json.loads(fixture_map_path(map_id).read_bytes())


def _samples() -> list[str]:
    return [s for samples in corpus().values() for s in samples]


def _conformance_programs() -> dict[str, dict[str, Any]]:
    doc = json.loads((CODEC_FIXTURES / "pretok-program" / "pretok-program-cases.json").read_text())
    return {case["name"]: case["program"] for case in doc["cases"]}


def _hf_tokenizer_json(
    tmp_path: Path, fixture: dict[str, Any], pre: Any, *, normalizer: Any = None,
    byte_fallback: bool = False, decoder: Any = None,
) -> dict[str, Any]:
    """A real HF tokenizer over a fixture map's vocab/merges, saved and read back."""
    merges = [tuple(m.split(" ")) for m in fixture["merges"]]
    tok = Tokenizer(models.BPE(vocab=fixture["vocab"], merges=merges, byte_fallback=byte_fallback))
    if pre is not None:
        tok.pre_tokenizer = pre
    if normalizer is not None:
        tok.normalizer = normalizer
    if decoder is not None:
        tok.decoder = decoder
    tok.add_special_tokens(
        [AddedToken(s, special=True, normalized=False) for s in fixture["special_tokens"]]
    )
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return json.loads(path.read_text("utf-8"))


def _differential(map_bytes: bytes, tokenizer_json: dict[str, Any], tmp_path: Path) -> tuple:
    """(mismatches, our vocab misses) over the corpus; specials matched on both sides."""
    path = tmp_path / "roundtrip.json"
    path.write_text(json.dumps(tokenizer_json), "utf-8")
    hf = Tokenizer.from_file(str(path))
    ours = OurTokenizer.from_map(load_map_bytes(map_bytes))
    mismatches, misses = [], []
    for text in _samples():
        expected = hf.encode(text, add_special_tokens=False).ids
        try:
            got = ours.encode(text, allowed_special="all")
        except VocabMiss:
            misses.append((text, expected))
            continue
        if got != expected:
            mismatches.append((text, got, expected))
    return mismatches, misses


# --- serialisation -------------------------------------------------------------------------


def test_serialisation_is_codec_maps_byte_format() -> None:
    # codec-spec 3.2: maps are hashed as raw bytes; codec-maps writes JSON.stringify(o, null, 2)
    # == json.dumps(indent=2, ensure_ascii=False), no trailing newline. Check on a real map.
    raw = fixture_map_path("tiiuae/falcon").read_bytes()
    doc = json.loads(raw)
    assert json.dumps(doc, indent=2, ensure_ascii=False).encode() == raw
    out = map_document_bytes(doc)
    assert not out.endswith(b"\n")
    assert json.loads(out) == doc


def test_keys_follow_spec_3_1_order_and_unknown_keys_go_last() -> None:
    doc = {"_note": "x", "special_tokens": {}, "published_at": PUBLISHED, "vocab": {"a": 0},
           "id": "a/b", "version": "2", "vocab_size": 1}  # fmt: skip
    keys = list(json.loads(map_document_bytes(doc)))
    assert keys == ["id", "version", "vocab_size", "vocab", "special_tokens", "published_at",
                    "_note"]  # fmt: skip


def test_published_at_is_a_parameter_and_output_is_deterministic() -> None:
    meta = _smollm2_meta()
    a = map_from_gguf_metadata(meta, map_id="huggingfacetb/smollm2")
    b = map_from_gguf_metadata(meta, map_id="huggingfacetb/smollm2")
    assert a == b and "published_at" not in json.loads(a)
    c = map_from_gguf_metadata(meta, map_id="huggingfacetb/smollm2", published_at=PUBLISHED)
    assert json.loads(c)["published_at"] == PUBLISHED


# --- GGUF metadata (in memory) -----------------------------------------------------------


def _meta_from_fixture(map_id: str, **over: Any) -> GGUFTokenizerMeta:
    """GGUF-shaped metadata for a fixture map: tokens by id, specials CONTROL."""
    fx = _fixture(map_id)
    by_id = sorted(fx["vocab"].items(), key=lambda kv: kv[1])
    assert [i for _, i in by_id] == list(range(len(by_id)))
    special = set(fx["special_tokens"])
    types = []
    for tok, _ in by_id:
        if tok in special:
            types.append(GgufTokenType.CONTROL)
        elif tok.startswith("<0x") and len(tok) == 6:
            types.append(GgufTokenType.BYTE)
        else:
            types.append(GgufTokenType.NORMAL)
    fields: dict[str, Any] = dict(
        model="gpt2" if fx["encoder"] == "byte_level" else "llama",
        pre="smollm" if map_id == "huggingfacetb/smollm2" else None,
        tokens=tuple(t for t, _ in by_id), token_types=tuple(types), merges=tuple(fx["merges"]),
    )  # fmt: skip
    fields.update(over)
    return GGUFTokenizerMeta(**fields)


def _smollm2_meta() -> GGUFTokenizerMeta:
    return _meta_from_fixture("huggingfacetb/smollm2")


def test_bundled_smollm2_map_is_the_generator_output() -> None:
    # The shipped map must be exactly what `tokenwire maps generate --smollm2` writes (its
    # README); the fixture vocab/merges equal the GGUF's (tests/test_gguf_smollm2.py).
    out = map_from_gguf_metadata(_smollm2_meta(), map_id="huggingfacetb/smollm2",
                                 published_at=PUBLISHED)  # fmt: skip
    assert out == bundled_map_path("huggingfacetb/smollm2").read_bytes()


def test_gguf_byte_level_map_keeps_vocab_merges_and_control_tokens() -> None:
    fx = _fixture("huggingfacetb/smollm2")
    doc = json.loads(map_from_gguf_metadata(_smollm2_meta(), map_id="huggingfacetb/smollm2"))
    assert list(doc) == [k for k in SPEC_ORDER if k in doc]
    assert doc["vocab"] == fx["vocab"] and doc["merges"] == fx["merges"]
    assert doc["special_tokens"] == fx["special_tokens"]
    assert doc["vocab_size"] == len(fx["vocab"]) and doc["encoder"] == "byte_level"
    assert "tool_calling" not in doc  # SmolLM2 has no tool-call marker tokens


def test_gguf_smollm_pre_is_the_smollm2_v2_program_of_the_conformance_fixture() -> None:
    doc = json.loads(map_from_gguf_metadata(_smollm2_meta(), map_id="huggingfacetb/smollm2"))
    assert doc["pre_tokenizer_program"] == _conformance_programs()["smollm2_worked_example"]


@pytest.mark.parametrize(
    ("pre", "case"),
    [("smollm", "smollm2_worked_example"), ("falcon", "falcon_worked_example"),
     ("deepseek-v3", "deepseek_cjk_and_latin"), ("llama-bpe", "llama3_digit_run_bounded"),
     ("gpt-4o", "letters_cased_o200k_camel_case_split")],
)  # fmt: skip
def test_gguf_pre_table_matches_spec_programs(pre: str, case: str) -> None:
    assert GGUF_PRE_PROGRAMS[pre] == _conformance_programs()[case]


def test_qwen2_pre_splits_digits_one_per_piece() -> None:
    # codec-spec 3.5 caveat: Qwen-2's regex has \p{N} (one digit), so max_run 1.
    assert compile_program(GGUF_PRE_PROGRAMS["qwen2"]).split("#1234") == ["#", "1", "2", "3", "4"]


@pytest.mark.parametrize(
    ("pre", "hf_pre"),
    [("smollm", real_pre_tokenizer("huggingfacetb/smollm2")),
     ("falcon", real_pre_tokenizer("tiiuae/falcon")),
     ("gpt-2", pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))],
)  # fmt: skip
def test_gguf_table_equals_lowering_of_the_same_hf_pretokenizer(pre: str, hf_pre: Any) -> None:
    program, _ = lower_hf_pretokenizer(json.loads(_with_pre(hf_pre)), None)
    assert program == GGUF_PRE_PROGRAMS[pre]


def test_user_defined_tokens_are_special_and_tool_calling_is_detected() -> None:
    # Qwen-style: <tool_call> is a USER_DEFINED (HF non-special added) token. It must be in
    # special_tokens so it is matched atomically and can be a tool_calling marker (3.6).
    tokens = ("a", "b", "ab", "<|endoftext|>", "<tool_call>", "</tool_call>")
    N, C, U = GgufTokenType.NORMAL, GgufTokenType.CONTROL, GgufTokenType.USER_DEFINED
    meta = GGUFTokenizerMeta(model="gpt2", pre="qwen2", tokens=tokens,
                             token_types=(N, N, N, C, U, U), merges=("a b",))  # fmt: skip
    doc = json.loads(map_from_gguf_metadata(meta, map_id="qwen/tiny"))
    assert doc["special_tokens"] == {"<|endoftext|>": 3, "<tool_call>": 4, "</tool_call>": 5}
    assert doc["tool_calling"] == {
        "convention": "qwen25", "markers": {"start": "<tool_call>", "end": "</tool_call>"},
        "args_format": "json", "result_format": "text",
    }  # fmt: skip


def test_gguf_sentencepiece_map_has_byte_fallback_and_prepend_scheme() -> None:
    meta = _meta_from_fixture("microsoft/phi-3")
    doc = json.loads(map_from_gguf_metadata(meta, map_id="microsoft/phi-3"))
    assert doc["encoder"] == "metaspace"
    assert (doc["byte_fallback_start"], doc["byte_fallback_end"]) == (3, 258)
    assert doc["metaspace_prepend_scheme"] == "always"
    never = _meta_from_fixture("microsoft/phi-3", add_space_prefix=False)
    assert json.loads(map_from_gguf_metadata(never, map_id="a/b"))["metaspace_prepend_scheme"] == (
        "never"
    )


def test_sentencepiece_merges_are_rebuilt_from_scores() -> None:
    N = GgufTokenType.NORMAL
    tokens = ("a", "b", "c", "ab", "bc", "abc")
    # Higher score merges first: "ab" (-1) before "bc" (-2); "abc" = ab+c or a+bc.
    merges = merges_from_scores(tokens, (0, 0, 0, -1.0, -2.0, -3.0), (N,) * 6)
    assert merges == ["a b", "b c", "a bc", "ab c"]
    meta = GGUFTokenizerMeta(model="llama", pre=None, tokens=tokens, token_types=(N,) * 6,
                             scores=(0, 0, 0, -1.0, -2.0, -3.0))  # fmt: skip
    assert json.loads(map_from_gguf_metadata(meta, map_id="x/y"))["merges"] == merges


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(alphabet="abc", min_size=2, max_size=4), min_size=1, max_size=12,
                unique=True), st.randoms())  # fmt: skip
def test_rebuilt_merges_are_valid_and_ranked_by_score(pieces: list[str], rnd: Any) -> None:
    tokens = ["a", "b", "c", *[p for p in pieces if p not in "abc"]]
    scores = [0.0, 0.0, 0.0] + [float(-rnd.randint(0, 5)) for _ in tokens[3:]]
    merges = merges_from_scores(tokens, scores, [GgufTokenType.NORMAL] * len(tokens))
    vocab = {t: i for i, t in enumerate(tokens)}
    ranks = [scores[vocab[m.replace(" ", "")]] for m in merges]
    assert all(left in vocab and right in vocab for left, right in (m.split() for m in merges))
    assert ranks == sorted(ranks, reverse=True)


# --- HF tokenizer.json: the differential tests ------------------------------------------


def test_smollm2_from_tokenizer_json_tokenizes_like_hf(tmp_path: Path) -> None:
    fx = _fixture("huggingfacetb/smollm2")
    tj = _hf_tokenizer_json(tmp_path, fx, real_pre_tokenizer("huggingfacetb/smollm2"),
                            decoder=decoders.ByteLevel())  # fmt: skip
    out = map_from_tokenizer_json(tj, map_id="huggingfacetb/smollm2", published_at=PUBLISHED)
    # One tokenizer, one map: the tokenizer.json path gives the GGUF path's bytes.
    assert out == bundled_map_path("huggingfacetb/smollm2").read_bytes()
    mismatches, misses = _differential(out, tj, tmp_path)
    assert mismatches == [] and misses == []


def test_falcon_from_tokenizer_json_tokenizes_like_hf(tmp_path: Path) -> None:
    fx = _fixture("tiiuae/falcon")
    tj = _hf_tokenizer_json(tmp_path, fx, real_pre_tokenizer("tiiuae/falcon"),
                            decoder=decoders.ByteLevel())  # fmt: skip
    out = map_from_tokenizer_json(tj, map_id="tiiuae/falcon")
    doc = json.loads(out)
    assert doc["pre_tokenizer_program"] == _conformance_programs()["falcon_worked_example"]
    assert "pre_tokenizer_pattern" not in doc  # no single regex is honest for this Sequence
    mismatches, misses = _differential(out, tj, tmp_path)
    # Falcon has no token for some control bytes (\x0b, \x1c, ...): both drop them alike,
    # and the corpus has such texts.
    assert mismatches == [] and misses == []
    absent = {chr(b) for b, c in enumerate(BYTE_TO_CHAR) if c not in fx["vocab"]}
    assert "\x0b" in absent
    assert any(absent & set(text) for text in _samples())


@pytest.mark.parametrize(
    ("pre", "normalizer", "scheme"),
    [(None, metaspace_normalizer_always(), "always"),
     (pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False), None,
      "first")],
)  # fmt: skip
def test_metaspace_from_tokenizer_json_tokenizes_like_hf(
    tmp_path: Path, pre: Any, normalizer: Any, scheme: str
) -> None:
    fx = _fixture("microsoft/phi-3")
    tj = _hf_tokenizer_json(tmp_path, fx, pre, normalizer=normalizer, byte_fallback=True)
    out = map_from_tokenizer_json(tj, map_id="microsoft/phi-3")
    doc = json.loads(out)
    assert doc["encoder"] == "metaspace" and doc["metaspace_prepend_scheme"] == scheme
    assert (doc["byte_fallback_start"], doc["byte_fallback_end"]) == (3, 258)
    mismatches, misses = _differential(out, tj, tmp_path)
    assert mismatches == [] and misses == []


# --- bad inputs ----------------------------------------------------------------------------

_BL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


def _tiny(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "added_tokens": [], "normalizer": None, "pre_tokenizer": _BL, "decoder": None,
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]},
    }  # fmt: skip
    for key, value in over.items():
        if key.startswith("model_"):
            doc["model"][key.removeprefix("model_")] = value
        else:
            doc[key] = value
    return doc


_PREPEND_REPLACE = {"type": "Sequence", "normalizers": [
    {"type": "Prepend", "prepend": "▁"},
    {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
]}  # fmt: skip
_SPLIT_TRUE = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True}
_BAD_HF = [
    ("model", _tiny(model=None), "no `model` object"),
    ("unigram", _tiny(model_type="Unigram"), "only BPE"),
    ("wordpiece prefix", _tiny(model_continuing_subword_prefix="##"), "cannot be expressed"),
    ("empty merges", _tiny(model_merges=[]), "non-empty list"),
    ("merge shape", _tiny(model_merges=["ab"]), "is not 'left right'"),
    ("merge part", _tiny(model_merges=["a c"]), "'c' is not in the vocab"),
    ("merge pair", _tiny(model_merges=[["a", 1]]), "neither 'a b' nor [a, b]"),
    ("vocab id", _tiny(model_vocab={"a": -1}), "non-negative integer id"),
    ("added id", _tiny(added_tokens=[{"id": 7, "content": "ab"}]), "but the vocab says 2"),
    ("neither", _tiny(pre_tokenizer={"type": "Whitespace"}), "neither byte-level"),
    ("lowering", _tiny(pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "BertPreTokenizer"}, _BL]}), "cannot lower the pre-tokenizer"),
    ("split", _tiny(pre_tokenizer=_SPLIT_TRUE, model_byte_fallback=True), "split=true"),
    ("normaliser", _tiny(pre_tokenizer=None, normalizer={"type": "NFKC"},
                         model_byte_fallback=True), "metaspace normaliser must be"),
    ("bytes", _tiny(pre_tokenizer=None, model_byte_fallback=True,
                    normalizer=_PREPEND_REPLACE,
                    model_vocab={"a": 0, "b": 1, "ab": 2, "<0x00>": 3}), "<0x01> is missing"),
]  # fmt: skip


@pytest.mark.parametrize(("doc", "message"), [(d, m) for _, d, m in _BAD_HF],
                         ids=[name for name, _, _ in _BAD_HF])  # fmt: skip
def test_bad_tokenizer_json_raises_generate_error(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(GenerateError, match=_escape(message)):
        map_from_tokenizer_json(doc, map_id="test/bad")


def test_bad_map_id_raises_generate_error() -> None:
    with pytest.raises(GenerateError, match="bad map id"):
        map_from_tokenizer_json(_tiny(), map_id="Bad ID")


_N = GgufTokenType.NORMAL
_BAD_GGUF = [
    ("model", dict(model="bert"), "'bert' is not supported"),
    ("no pre", dict(pre=None), "no tokenizer.ggml.pre"),
    ("unknown pre", dict(pre="mystery"), "unknown llama.cpp pre-tokenizer 'mystery'"),
    ("types", dict(token_types=(_N,)), "token_type has 1 entries for 3 tokens"),
    ("no merges", dict(merges=()), "without tokenizer.ggml.merges"),
    ("spm", dict(model="llama", merges=()), "neither tokenizer.ggml.merges nor scores"),
]  # fmt: skip


@pytest.mark.parametrize(("over", "message"), [(o, m) for _, o, m in _BAD_GGUF],
                         ids=[name for name, _, _ in _BAD_GGUF])  # fmt: skip
def test_bad_gguf_metadata_raises_generate_error(over: dict[str, Any], message: str) -> None:
    fields: dict[str, Any] = dict(model="gpt2", pre="gpt-2", tokens=("a", "b", "ab"),
                                  token_types=(_N, _N, _N), merges=("a b",))  # fmt: skip
    meta = GGUFTokenizerMeta(**(fields | over))
    with pytest.raises(GenerateError, match=_escape(message)):
        map_from_gguf_metadata(meta, map_id="test/bad")


def _escape(text: str) -> str:
    import re

    return re.escape(text)


def test_split_regex_is_used_only_through_lowering() -> None:
    # A Split with an unknown regex is refused by the lowering, never guessed.
    pre = json.loads(_with_pre(pre_tokenizers.Split(Regex("[a-z]+"), behavior="isolated")))
    with pytest.raises(GenerateError, match="cannot lower"):
        map_from_tokenizer_json(_tiny(pre_tokenizer={"type": "Sequence", "pretokenizers": [
            pre, _BL]}), map_id="test/bad")  # fmt: skip


def _with_pre(pre: Any) -> str:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    return json.dumps(json.loads(tok.to_str())["pre_tokenizer"])


def test_what_a_map_cannot_express_is_refused_unless_lossy_is_explicit() -> None:
    from tokenwire.codec.generate import map_from_tokenizer_json
    from tokenwire.errors import GenerateError

    doc = {
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"],
                  "ignore_merges": True},
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "decoder": {"type": "ByteLevel"},
        "added_tokens": [],
    }
    with pytest.raises(GenerateError, match="ignore_merges"):
        map_from_tokenizer_json(doc, map_id="test/lossy")
    doc["model"]["ignore_merges"] = False
    with pytest.raises(GenerateError, match="normaliser 'NFC'"):
        map_from_tokenizer_json(doc, map_id="test/lossy")
    assert map_from_tokenizer_json(doc, map_id="test/lossy", allow_lossy=True)
