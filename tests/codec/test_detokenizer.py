"""Detokenizer: ids -> text equal to Hugging Face ``tokenizers`` (and tiktoken), streamed
without ever emitting half a character (codec-spec §3.3, §9.1 item 18).

The oracles are real peers built from the same map: a ``tokenizers.Tokenizer`` with the
decoder HF uses for the family, and for cl100k a ``tiktoken.Encoding`` whose ranks are
the map's ids.
"""

from __future__ import annotations

import itertools
import json
from functools import cache
from typing import Any

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

from tests.conftest import corpus, fixture_map_path
from tokenwire.codec.byte_level import BYTE_TO_CHAR, CHAR_TO_BYTE, chars_to_bytes
from tokenwire.codec.detokenizer import REPLACEMENT, Detokenizer, _tables_for
from tokenwire.codec.maps import TokenizerMap, load_map_bytes, load_map_file

DIFFERENTIAL_MAPS = ["huggingfacetb/smollm2", "openai/cl100k_base", "microsoft/phi-3"]


@cache
def _map(map_id: str) -> TokenizerMap:
    return load_map_file(fixture_map_path(map_id))


@cache
def _hf(map_id: str) -> Tokenizer:
    """The HF tokenizer a model of this family ships, rebuilt from the map."""
    tmap = _map(map_id)
    merges = [tuple(m.split(" ", 1)) for m in tmap.merges]
    if tmap.encoder == "byte_level":
        tok = Tokenizer(models.BPE(tmap.vocab, merges))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
    else:  # Llama-2 / Phi-3: Prepend + Replace normaliser, byte fallback, Strip decoder
        tok = Tokenizer(
            models.BPE(
                tmap.vocab, merges, byte_fallback=tmap.byte_fallback is not None,
                unk_token="<unk>", fuse_unk=True,
            )
        )  # fmt: skip
        tok.normalizer = normalizers.Sequence(
            [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
        )
        tok.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
             decoders.Strip(" ", 1, 0)]
        )  # fmt: skip
    tok.add_special_tokens(
        [AddedToken(k, special=True, normalized=False) for k in tmap.special_tokens]
    )
    return tok


@cache
def _tiktoken_cl100k() -> tiktoken.Encoding:
    tmap = _map("openai/cl100k_base")
    special = tmap.special_ids
    ranks = {chars_to_bytes(k): i for k, i in tmap.vocab.items() if i not in special}
    return tiktoken.Encoding(
        name="cl100k_from_map",
        pat_str=tmap.pre_tokenizer_pattern,
        mergeable_ranks=ranks,  # type: ignore[arg-type]
        special_tokens=dict(tmap.special_tokens),
    )


@cache
def _corpus_ids(map_id: str) -> list[tuple[str, list[int]]]:
    hf = _hf(map_id)
    texts = [s for samples in corpus().values() for s in samples]
    return [(s, hf.encode(s, add_special_tokens=False).ids) for s in texts]


def _stream(det: Detokenizer, chunks: list[list[int]], render_special: bool = False) -> list[str]:
    s = det.stream(render_special)
    return [s.feed(c) for c in chunks] + [s.flush()]


def _defined_ids(tmap: TokenizerMap) -> list[int]:
    return sorted(set(tmap.vocab.values()) | tmap.special_ids)


@cache
def _interesting_ids(map_id: str) -> list[int]:
    """Ids that make decoding hard: single bytes >= 0x80 (partial UTF-8), byte-fallback
    ids, special ids, pieces with a leading space."""
    tmap = _map(map_id)
    out = set(tmap.special_ids)
    if tmap.byte_fallback is not None:
        out.update(range(tmap.byte_fallback[0], tmap.byte_fallback[1] + 1))
    if tmap.encoder == "byte_level":
        out.update(tmap.vocab[BYTE_TO_CHAR[b]] for b in range(256) if BYTE_TO_CHAR[b] in tmap.vocab)
    for key in ("Ġ", "▁", "▁▁", "Ġhello", "▁Hello", "ĠĠ"):
        if key in tmap.vocab:
            out.add(tmap.vocab[key])
    return sorted(out)


def _id_lists(map_id: str) -> st.SearchStrategy[list[int]]:
    pick = st.one_of(
        st.sampled_from(_interesting_ids(map_id)), st.sampled_from(_defined_ids(_map(map_id)))
    )
    return st.lists(pick, max_size=24)


def _chunks(ids: list[int], cuts: list[int]) -> list[list[int]]:
    bounds = sorted({0, len(ids), *(c for c in cuts if c <= len(ids))})
    return [ids[a:b] for a, b in itertools.pairwise(bounds)]


# --- the byte-level table ----------------------------------------------------------------


def test_byte_level_table_is_gpt2_bytes_to_unicode() -> None:
    assert len(BYTE_TO_CHAR) == 256 and len(set(BYTE_TO_CHAR)) == 256
    assert BYTE_TO_CHAR[0x20] == "Ġ" and BYTE_TO_CHAR[0x0A] == "Ċ"
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    assert all(BYTE_TO_CHAR[b] == chr(b) for b in printable)
    others = [BYTE_TO_CHAR[b] for b in range(256) if b not in printable]
    assert others == [chr(c) for c in range(0x100, 0x144)]  # 68, in increasing byte order
    assert all(CHAR_TO_BYTE[c] == b for b, c in enumerate(BYTE_TO_CHAR))


def test_byte_level_key_with_a_char_outside_the_table_has_no_bytes() -> None:
    assert chars_to_bytes("Ġhello") == b" hello"
    assert chars_to_bytes("<|im start|>") is None


# --- differential against Hugging Face and tiktoken -------------------------------------


@pytest.mark.parametrize("map_id", DIFFERENTIAL_MAPS)
def test_decode_of_corpus_ids_equals_hf_decode(map_id: str) -> None:
    det, hf = Detokenizer(_map(map_id)), _hf(map_id)
    mismatches = [
        (text, ids) for text, ids in _corpus_ids(map_id) if det.decode(ids) != hf.decode(ids)
    ]
    assert mismatches == []


@pytest.mark.parametrize("map_id", DIFFERENTIAL_MAPS)
def test_stream_of_corpus_ids_equals_bulk_one_id_at_a_time(map_id: str) -> None:
    det = Detokenizer(_map(map_id))
    for _text, ids in _corpus_ids(map_id)[::3]:
        assert "".join(_stream(det, [[i] for i in ids])) == det.decode(ids)


def test_cl100k_decode_equals_tiktoken_decode_on_corpus() -> None:
    enc, det = _tiktoken_cl100k(), Detokenizer(_map("openai/cl100k_base"))
    for samples in corpus().values():
        for text in samples:
            ids = enc.encode(text, disallowed_special=())
            assert det.decode(ids) == enc.decode(ids) == text


@pytest.mark.parametrize("map_id", DIFFERENTIAL_MAPS)
def test_random_ids_decode_like_hf_with_and_without_specials(map_id: str) -> None:
    det, hf = Detokenizer(_map(map_id)), _hf(map_id)

    @settings(max_examples=200, deadline=None)
    @given(ids=_id_lists(map_id))
    def check(ids: list[int]) -> None:
        assert det.decode(ids) == hf.decode(ids, skip_special_tokens=True)
        shown = det.decode(ids, render_special=True)
        assert shown == hf.decode(ids, skip_special_tokens=False)

    check()


def test_random_cl100k_ids_decode_like_tiktoken() -> None:
    enc, det = _tiktoken_cl100k(), Detokenizer(_map("openai/cl100k_base"))

    @settings(max_examples=200, deadline=None)
    @given(ids=_id_lists("openai/cl100k_base"))
    def check(ids: list[int]) -> None:
        plain = [i for i in ids if i not in _map("openai/cl100k_base").special_ids]
        assert det.decode(plain) == enc.decode(plain)  # tiktoken uses "replace" too

    check()


# --- streaming: any chunking, never half a character ----------------------------------


@pytest.mark.parametrize("map_id", DIFFERENTIAL_MAPS)
def test_stream_equals_bulk_for_any_chunking(map_id: str) -> None:
    det = Detokenizer(_map(map_id))

    @settings(max_examples=150, deadline=None)
    @given(ids=_id_lists(map_id), cuts=st.lists(st.integers(0, 24), max_size=6),
           render=st.booleans())  # fmt: skip
    def check(ids: list[int], cuts: list[int], render: bool) -> None:
        bulk = det.decode(ids, render_special=render)
        for chunks in (_chunks(ids, cuts), [[i] for i in ids], [ids], [[], ids, []]):
            out = _stream(det, chunks, render)
            assert "".join(out) == bulk
            # Never half a character: what has been emitted is final, so every prefix
            # of the output is a prefix of the bulk decode.
            emitted = ""
            for piece in out:
                emitted += piece
                assert bulk.startswith(emitted)

    check()


def test_flush_ends_the_stream_and_the_decoder_starts_a_new_one() -> None:
    det = Detokenizer(_map("microsoft/phi-3"))
    hello = det.map.vocab["▁Hello"]
    s = det.stream()
    assert s.feed([hello]) == "Hello"
    assert s.flush() == ""
    assert s.feed([hello]) == "Hello"  # a new stream: its leading space is stripped again


# --- UTF-8 replacement: only really invalid bytes -------------------------------------


def test_invalid_lead_byte_keeps_the_valid_bytes_after_it() -> None:
    """[E2 'A' 'B' 'C'] is '\\ufffdABC' (the reference client drops 'AB', peer-bench §1)."""
    tmap = _map("huggingfacetb/smollm2")
    ids = [tmap.vocab[BYTE_TO_CHAR[b]] for b in (0xE2, 0x41, 0x42, 0x43)]
    det = Detokenizer(tmap)
    assert det.decode(ids) == "\ufffdABC"
    assert "".join(_stream(det, [[i] for i in ids])) == "\ufffdABC"


def test_partial_utf8_is_carried_across_feeds_and_replaced_only_at_flush() -> None:
    tmap = _map("huggingfacetb/smollm2")
    e2, x82, xac = (tmap.vocab[BYTE_TO_CHAR[b]] for b in (0xE2, 0x82, 0xAC))
    s = Detokenizer(tmap).stream()
    assert (s.feed([e2]), s.feed([x82]), s.feed([xac])) == ("", "", "€")
    assert s.feed([e2, x82]) == ""
    assert s.flush() == REPLACEMENT  # one U+FFFD for the maximal invalid subpart


# --- metaspace: HF's Strip and ByteFallback rules ---------------------------------------


def _phi3_ids(*keys: str) -> list[int]:
    return [_map("microsoft/phi-3").vocab[k] for k in keys]


def test_metaspace_strips_exactly_one_leading_space_of_the_output() -> None:
    det = Detokenizer(_map("microsoft/phi-3"))
    assert det.decode(_phi3_ids("▁Hello", "▁world")) == "Hello world"
    assert det.decode(_phi3_ids("▁▁", "▁Hello")) == "  Hello"
    assert det.decode(_phi3_ids("Hello")) == "Hello"


def test_metaspace_strip_applies_to_the_whole_output_not_after_a_rendered_special() -> None:
    det = Detokenizer(_map("microsoft/phi-3"))
    ids = [1, *_phi3_ids("▁Hello")]  # <s> ▁Hello
    assert det.decode(ids) == "Hello"
    assert det.decode(ids, render_special=True) == "<s> Hello"


def test_byte_fallback_run_that_is_invalid_becomes_one_replacement_per_byte() -> None:
    det = Detokenizer(_map("microsoft/phi-3"))
    lo = 3
    assert det.decode([lo + 0xE2, lo + 0x82, lo + 0xAC]) == "€"
    assert det.decode([lo + 0xE2, lo + 0x41, *_phi3_ids("▁B")]) == "\ufffd\ufffd B"
    # a hidden special does not end the run (HF drops it before decoding) ...
    assert det.decode([lo + 0xE2, 32007, lo + 0x82, lo + 0xAC]) == "€"
    # ... a rendered one does
    shown = det.decode([lo + 0xE2, 32007, lo + 0x82, lo + 0xAC], render_special=True)
    assert shown == "\ufffd<|end|>\ufffd\ufffd"


def test_stream_holds_a_byte_run_until_a_text_token_ends_it() -> None:
    det = Detokenizer(_map("microsoft/phi-3"))
    s = det.stream()
    assert s.feed(_phi3_ids("▁a")) == "a"
    assert s.feed([3 + 0xE2, 3 + 0x82, 3 + 0xAC]) == ""
    assert s.feed(_phi3_ids("▁b")) == "€ b"
    assert s.feed([3 + 0x41]) == ""
    assert s.flush() == "A"


def _metaspace_map(scheme: str) -> TokenizerMap:
    vocab = {"<unk>": 0, "▁Hi": 1, "▁▁": 2, "x": 3}
    vocab.update({f"<0x{b:02X}>": 4 + b for b in range(256)})
    doc: dict[str, Any] = {
        "id": "test/metaspace", "version": "2", "vocab_size": len(vocab), "vocab": vocab,
        "encoder": "metaspace", "byte_fallback_start": 4, "byte_fallback_end": 259,
        "special_tokens": {"<unk>": 0}, "metaspace_prepend_scheme": scheme,
    }  # fmt: skip
    return load_map_bytes(json.dumps(doc).encode())


@pytest.mark.parametrize(("scheme", "expected"), [("always", "Hi"), ("first", "Hi"),
                                                  ("never", " Hi")])  # fmt: skip
def test_prepend_scheme_decides_whether_the_leading_space_is_stripped(
    scheme: str, expected: str
) -> None:
    det = Detokenizer(_metaspace_map(scheme))
    assert det.decode([1]) == expected
    assert "".join(_stream(det, [[1]])) == expected
    assert det.decode([0x20 + 4, 3]) == expected.replace("Hi", "x")  # <0x20> is a space too


# --- unknown ids, identity maps, token_bytes --------------------------------------------


def test_unknown_ids_decode_to_replacement_character() -> None:
    det = Detokenizer(_map("openai/cl100k_base"))
    hello = det.map.vocab["hello"]
    for bad in (100261, 100275, 10**9, -1, -100_000):  # holes, past the end, negative
        assert det.decode([hello, bad, hello]) == f"hello{REPLACEMENT}hello"
        assert "".join(_stream(det, [[hello], [bad], [hello]])) == f"hello{REPLACEMENT}hello"


def test_identity_map_decodes_keys_verbatim_and_hides_specials() -> None:
    det = Detokenizer(_map("anthropic/claude-3-text"))
    assert det.decode([0]) == ""
    assert det.decode([0], render_special=True) == "<|placeholder|>"
    assert det.decode([0, 1]) == REPLACEMENT
    assert "".join(_stream(det, [[0], [0]], render_special=True)) == "<|placeholder|>" * 2


def test_legacy_tokens_map_decodes_like_identity() -> None:
    doc = {"id": "test/legacy", "version": "1", "vocab_size": 2, "tokens": {"0": "a", "1": "é"}}
    det = Detokenizer(load_map_bytes(json.dumps(doc).encode()))
    assert det.decode([1, 0, 1]) == "éaé"


def test_token_bytes_are_the_raw_bytes_of_one_token() -> None:
    smol = Detokenizer(_map("huggingfacetb/smollm2"))
    assert smol.token_bytes(smol.map.vocab["Ġhello"]) == b" hello"
    assert smol.token_bytes(smol.map.vocab[BYTE_TO_CHAR[0xE2]]) == b"\xe2"
    assert smol.token_bytes(1) == b"<|im_start|>"  # specials rendered
    phi = Detokenizer(_map("microsoft/phi-3"))
    assert phi.token_bytes(3 + 0x41) == b"A"
    assert phi.token_bytes(phi.map.vocab["▁Hello"]) == b" Hello"  # no strip per token
    cl = Detokenizer(_map("openai/cl100k_base"))
    for bad in (100261, -1, 10**9):
        with pytest.raises(KeyError):
            cl.token_bytes(bad)


def test_tables_are_built_once_per_map_content() -> None:
    a = Detokenizer(_map("huggingfacetb/smollm2"))
    b = Detokenizer(load_map_file(fixture_map_path("huggingfacetb/smollm2")))
    a.decode([1])
    b.decode([1])
    assert a._tables is b._tables is _tables_for(a.map)
