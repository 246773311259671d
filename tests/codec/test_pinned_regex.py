"""Pinned Unicode classes and the engine-neutral single regex (issue 18 items 2 and 3).

* The pinned tables equal, code point by code point, the classes of the two engines that
  define our oracles: Rust ``regex-syntax`` (tiktoken's fancy-regex) and Oniguruma (HF
  ``tokenizers``). Both are at Unicode 16.0.0 today; if either moves, this test says so.
* Every backend's pieces are the pinned ones, whatever the ``regex`` module's own tables
  say (it is at Unicode 17.0 and counts U+0558 and U+190B6 as letters).
* The exported single regex (the bundled SmolLM2 map's ``pre_tokenizer_pattern``, and every
  program's ``single_regex``) gives the program's pieces under Python ``regex``, Oniguruma,
  fancy-regex and Node's JavaScript engine.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from functools import cache

import pytest
import regex
import tiktoken
from tokenizers import Regex, normalizers, pre_tokenizers

from tests.conftest import corpus, fixture_map_path
from tests.hf_oracle import hf_encode
from tokenwire.codec import pinned_regex
from tokenwire.codec.maps import bundled_map_path, load_map_file
from tokenwire.codec.pinned_regex import PinnedRegex, category_ranges, disputed_code_points, pin
from tokenwire.codec.pretok import compile_program
from tokenwire.codec.pretok_lower import KNOWN_SPLIT_PATTERNS
from tokenwire.codec.tokenizer import Tokenizer
from tokenwire.codec.unicode_tables import UNICODE_VERSION

CLASSES = ["L", "Lu", "Ll", "Lt", "Lm", "Lo", "M", "N", "Nd", "P", "S"]
BYTE_RANKS = {bytes([b]): b for b in range(256)}


@cache
def _all_scalars() -> str:
    return "".join(map(chr, range(0xD800))) + "".join(map(chr, range(0xE000, 0x110000)))


def _set(ranges: tuple[tuple[int, int], ...]) -> set[int]:
    return {cp for lo, hi in ranges for cp in range(lo, hi + 1)}


def _fancy_members(pattern: str) -> set[int]:
    # tiktoken drops text no match covers, so the output bytes are the matched characters.
    enc = tiktoken.Encoding("probe", pat_str=pattern, mergeable_ranks=BYTE_RANKS,
                            special_tokens={})  # fmt: skip
    return set(map(ord, bytes(enc.encode_ordinary(_all_scalars())).decode("utf-8")))


def _onig_members(pattern: str) -> set[int]:
    rest = normalizers.Replace(Regex(pattern), "").normalize_str(_all_scalars())
    return set(map(ord, _all_scalars())) - set(map(ord, rest))


def test_tables_are_unicode_16_like_both_reference_engines() -> None:
    assert UNICODE_VERSION == "16.0.0"
    for name in CLASSES:
        ours = _set(category_ranges(name))
        assert _fancy_members(rf"\p{{{name}}}") == ours, f"fancy-regex \\p{{{name}}}"
        assert _onig_members(rf"\p{{{name}}}") == ours, f"Oniguruma \\p{{{name}}}"


@pytest.mark.parametrize("name", ["L", "N", "P"])
def test_pinned_class_means_the_same_set_in_every_engine(name: str) -> None:
    ours = _set(category_ranges(name))
    pinned = pin(rf"\p{{{name}}}")
    assert r"\p" not in pinned
    assert _fancy_members(pinned) == ours
    assert _onig_members(pinned) == ours
    assert set(map(ord, regex.findall(pinned, _all_scalars()))) == ours


def test_regex_module_letters_that_the_engines_do_not_have_are_found() -> None:
    # The example of the issue: regex 2026 is at Unicode 17, where U+0558 is a letter.
    if not regex.match(r"\p{L}", "\u0558"):
        pytest.skip("this regex module has Unicode 16 tables")
    assert 0x0558 in disputed_code_points("L") and 0x190B6 in disputed_code_points("L")


@pytest.mark.parametrize("backend", ["tiktoken", "python"])
def test_r50k_recently_assigned_letters_split_like_tiktoken(backend: str) -> None:
    tmap = load_map_file(fixture_map_path("openai/r50k_base"))
    tok = Tokenizer.from_map(tmap, backend)
    truth = _r50k_truth()
    for text in ["\U000190b6濺", "a\u0558b", " \u0558x", "\U00011de0 12"]:
        assert tok.encode(text) == truth.encode_ordinary(text), text


@cache
def _r50k_truth() -> tiktoken.Encoding:
    from tiktoken_ext.openai_public import r50k_pat_str

    from tokenwire.codec.byte_level import chars_to_bytes

    tmap = load_map_file(fixture_map_path("openai/r50k_base"))
    ranks = {chars_to_bytes(k): v for k, v in tmap.vocab.items() if k not in tmap.special_tokens}
    return tiktoken.Encoding("r50k", pat_str=r50k_pat_str, mergeable_ranks=ranks,  # type: ignore[arg-type]
                             special_tokens={})  # fmt: skip


# --- before the whole sweep is known (a fresh process's first load, issue 15) ---------------

GPT2_LIKE = r"\p{L}+|\p{N}+|\s+|[^\s\p{L}\p{N}]+"


@pytest.fixture
def unswept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process in which no whole-space sweep has run or been deferred yet."""
    monkeypatch.setattr(pinned_regex, "_searches", {})
    monkeypatch.setattr(pinned_regex, "_deferred", {})


def _run_all(pending: list) -> None:
    """Run deferred builds in order, those they queue included (a FIFO builder)."""
    while pending:
        pending.pop(0)()


def _disputes_are_real() -> None:
    if not regex.match(r"\p{L}", "\u0558"):
        pytest.skip("this regex module has Unicode 16 tables: nothing is disputed")


#: More distinct code points than are checked one by one before the sweep (emoji: undisputed).
MANY_ASTRAL = "".join(map(chr, range(0x1F000, 0x1F000 + pinned_regex.MAX_CHECKED + 1)))


@pytest.mark.usefixtures("unswept")
def test_before_the_sweep_disputed_texts_take_the_pinned_compilation() -> None:
    _disputes_are_real()
    pr = PinnedRegex(GPT2_LIKE)
    pending: list = []
    pinned_regex.defer_dispute_sweep(pending.append)
    assert len(pending) == 1
    # U+0558 (Armenian, a letter from Unicode 17 on) is found by the sweep of its prefix,
    # U+190B6 (Tangut) by the one-by-one check of the code points above the last prefix.
    for text in ["a\u0558b", "中文 \u0558", "\U000190b6濺", "x \U0001f600\U000190b6"]:
        assert pr.compiled_for(text).pattern == pr.pattern, text
        assert pr.findall(text) == regex.findall(pr.pattern, text)
    # Too many code points to check, with the sweep pending: pinned, not swept here.
    assert pr.compiled_for(MANY_ASTRAL).pattern == pr.pattern
    assert pinned_regex._searches == {}
    # Undisputed text: the module's own tables, at once.
    for text in ["ünïcödé 中文 ١٢٣", "x \U0001f600 ü"]:
        assert pr.compiled_for(text).pattern == GPT2_LIKE, text


def test_one_by_one_checks_agree_with_the_sweep() -> None:
    names = frozenset({"L", "N", "WS"})
    disputed = set().union(*(disputed_code_points(n) for n in names))
    ends = sorted(disputed)[:50] + sorted(disputed)[-50:]
    probes = [*ends, 0x1F600, 0x10000, 0x20000, 0x10FFFF, 0x41, 0x3000]
    for cp in probes:
        assert pinned_regex._is_disputed(cp, names, "regex") == (cp in disputed), hex(cp)


@pytest.mark.usefixtures("unswept")
def test_once_the_deferred_sweep_has_run_undisputed_astral_text_is_fast() -> None:
    _disputes_are_real()
    pr = PinnedRegex(GPT2_LIKE)
    pending: list = []
    pinned_regex.defer_dispute_sweep(pending.append)
    pinned_regex.defer_dispute_sweep(pending.append)  # already queued: not twice
    assert len(pending) == 1
    assert pr.compiled_for(MANY_ASTRAL).pattern == pr.pattern
    later: list[bool] = []  # a build the same load queues next (the detokenizer's tables)
    pending.append(lambda: later.append(bool(pinned_regex._searches)))
    _run_all(pending)
    assert later == [False]  # it ran before the sweep, which then ran
    assert pr.compiled_for(MANY_ASTRAL).pattern == GPT2_LIKE
    assert pr.compiled_for("\U000190b6濺").pattern == pr.pattern
    pinned_regex.defer_dispute_sweep(pending.append)  # known: nothing to queue
    assert pending == []


@pytest.mark.usefixtures("unswept")
def test_without_a_deferred_sweep_astral_text_sweeps_on_the_caller() -> None:
    pr = PinnedRegex(GPT2_LIKE)
    pr.compiled_for(MANY_ASTRAL)
    assert (frozenset({"L", "N", "WS"}), "regex") in pinned_regex._searches


@pytest.mark.usefixtures("unswept")
def test_a_deferred_load_encodes_disputed_text_exactly_before_and_after_the_sweep() -> None:
    tmap = load_map_file(fixture_map_path("openai/r50k_base"))
    pending: list = []
    tok = Tokenizer.from_map(tmap, defer=pending.append)
    truth = _r50k_truth()
    texts = ["\U000190b6濺", "a\u0558b", " \u0558x", "\U00011de0 12", "x \U0001f600 ü",
             MANY_ASTRAL + " \U000190b6"]
    for text in texts:  # the Python engine and no sweep yet
        assert tok.encode(text) == truth.encode_ordinary(text), text
    assert pinned_regex._searches == {}
    _run_all(pending)
    assert pinned_regex._searches  # the sweep was one of the deferred builds
    for text in texts:
        assert tok.encode(text) == truth.encode_ordinary(text), text


# --- the exported single regex under four engines -------------------------------------------

ADVERSARIAL = [
    "\n\n\x85", "\n\n\xa0", " \x85🇪", "a\x85b", "\xa0\xa0x", " \u3000 1", "x \u2028\u2029 y",
    "'s 'S 'ſ 'LL 'K", "\U000190b6濺", "a\u0558b", "𝐀𝐁𝐂 1𝟙", "😀😀 😀", "\t\t\n\r\n 2",
    "e\u0301 \u0301", "١٢٣ ٤", "  4", "a  1", "x\x1c\x1dy", "\u200b\u2060\ufeffz",
]


def _program_cases() -> list[tuple[str, dict]]:
    smollm2 = load_map_file(bundled_map_path("huggingfacetb/smollm2"))
    cases = [("smollm2-bundled", smollm2.pre_tokenizer_program)]
    for name, stage in KNOWN_SPLIT_PATTERNS.values():
        if stage.get("stage") == "alternation":
            cases.append((name, {"version": 1, "ops": stage["ops"]}))
    return cases


PROGRAM_CASES = _program_cases()


def _samples() -> list[str]:
    texts = [s for v in corpus().values() for s in v]
    return ADVERSARIAL + texts[::4]


def test_bundled_smollm2_pattern_is_the_programs_pinned_single_regex() -> None:
    tmap = load_map_file(bundled_map_path("huggingfacetb/smollm2"))
    single = compile_program(tmap.pre_tokenizer_program).single_regex
    assert tmap.pre_tokenizer_pattern == single
    assert r"\p{" not in single and r"\x85" not in single and r"\xa0" not in single


@pytest.mark.parametrize(("name", "program"), PROGRAM_CASES, ids=[n for n, _ in PROGRAM_CASES])
def test_single_regex_pieces_under_python_regex_and_oniguruma(name: str, program: dict) -> None:
    pt = compile_program(program)
    single = pt.single_regex
    assert single is not None
    split = pre_tokenizers.Split(Regex(single), behavior="isolated")
    compiled = regex.compile(single)
    for text in _samples():
        pieces = pt.split(text)
        assert compiled.findall(text) == pieces, (name, text[:60])
        assert [p for p, _ in split.pre_tokenize_str(text)] == pieces, (name, text[:60])


@pytest.mark.parametrize(("name", "program"), PROGRAM_CASES, ids=[n for n, _ in PROGRAM_CASES])
def test_single_regex_pieces_under_fancy_regex(name: str, program: dict) -> None:
    # A vocabulary of the 256 bytes plus every expected piece: tiktoken returns one token per
    # piece exactly when fancy-regex splits the text as the program does.
    pt = compile_program(program)
    samples = _samples()
    splits = [pt.split(s) for s in samples]
    ranks = dict(BYTE_RANKS)
    for pieces in splits:
        for piece in pieces:
            ranks.setdefault(piece.encode(), len(ranks))
    enc = tiktoken.Encoding(f"neutral-{name}", pat_str=pt.single_regex, mergeable_ranks=ranks,
                            special_tokens={})  # fmt: skip
    for text, pieces in zip(samples, splits, strict=True):
        got = [enc.decode_single_token_bytes(t) for t in enc.encode_ordinary(text)]
        assert got == [p.encode() for p in pieces], (name, text[:60])


_NODE_SPLIT = """
const {pattern, texts} = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const re = new RegExp(pattern, 'gu');
process.stdout.write(JSON.stringify(texts.map(t => t.match(re) || [])));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
@pytest.mark.parametrize(("name", "program"), PROGRAM_CASES, ids=[n for n, _ in PROGRAM_CASES])
def test_single_regex_pieces_under_javascript(name: str, program: dict) -> None:
    pt = compile_program(program)
    samples = _samples()
    payload = json.dumps({"pattern": pt.single_regex, "texts": samples})
    out = subprocess.run(["node", "-e", _NODE_SPLIT], input=payload, capture_output=True,
                         text=True, timeout=120, check=True)  # fmt: skip
    for text, got in zip(samples, json.loads(out.stdout), strict=True):
        assert got == pt.split(text), (name, text[:60])


def test_bundled_smollm2_pattern_gives_llama_cpp_ids_through_hf(smollm2_hf_pattern) -> None:  # type: ignore[no-untyped-def]
    # HF fed the exported pattern (Split(Regex) + ByteLevel bytes) == our program's ids.
    tmap, hf = smollm2_hf_pattern
    tok = Tokenizer.from_map(tmap)
    for text in ADVERSARIAL:
        if any(b in text.encode() for b in b"\x04\x06\x13\x14\x16\x1d\xf1\xf2"):
            continue
        assert tok.encode(text) == hf_encode(hf, text), text


@pytest.fixture(scope="module")
def smollm2_hf_pattern():  # type: ignore[no-untyped-def]
    from tests.hf_oracle import hf_tokenizer

    tmap = load_map_file(bundled_map_path("huggingfacetb/smollm2"))
    return tmap, hf_tokenizer(tmap)


# --- spelled when first needed (a fresh process's first load, issue 15) ----------------------

#: Patterns for the names-only walk: the programs' regexes, and classes the rewriter pins, or
#: copies as written (nested, POSIX, ranges to a set, unknown names, unterminated...).
NAME_PATTERNS = [
    GPT2_LIKE, r"\p{N}", r"\P{L}+", r"\p{^L}", r"\P{^N}", r"\pL\pN", r"[^\S\p{L}]",
    r"[\p{L}[a-z]]", r"[[:alpha:]]", r"[\w\p{N}]", r"[\p{L}-z]", r"[a-\p{L}]", r"[z-a]",
    r"\p{Greek}", r"[\p{Greek}\s]",
    r"[]a\p{P}]", r"[^]\p{S}]", r"[\p{Lu}\x{41}-\x{5a}\u00e9\U0001F600]", "[\\p{M}", r"\p{L",
    r"abc\\", "\\", r"\d\D\s\S", r"[\d\s]+(?!\S)", r"(?i:'s|'t)|[^\r\n\p{L}\p{N}]?\p{L}+",
]


def _program_regexes() -> list[str]:
    from tokenwire.codec.pretok import _OpList

    out = []
    for _, program in PROGRAM_CASES:
        for stage in program.get("stages", [program]):
            if "ops" in stage:
                ops = _OpList(stage["ops"])
                out += [ops.alternation, ops.v1_regex(), ops.gap_regex()]
                out += [r for r in [ops.digit_segment_regex()] if r is not None]
    return out


@pytest.mark.parametrize("numeric", ["regex", "rust"])
def test_names_without_spelling_are_the_names_the_spelling_pins(numeric: str) -> None:
    for source in NAME_PATTERNS + _program_regexes():
        assert pinned_regex._pinned_names(source) == pinned_regex._pin(source, numeric)[1], source


def test_a_pinned_regex_spells_its_pattern_when_first_read() -> None:
    compiled = PinnedRegex(r"\p{N}|[^\s\p{L}]+", "rust")
    assert compiled._pattern is None  # not spelled by building it
    assert compiled.findall("a 12 ü!") == regex.findall(r"\p{N}|[^\s\p{L}]+", "a 12 ü!")
    assert compiled._pattern is None  # nor by an undisputed text
    assert compiled.pattern == pin(r"\p{N}|[^\s\p{L}]+", "rust")


@pytest.mark.parametrize(("name", "program"), PROGRAM_CASES, ids=[n for n, _ in PROGRAM_CASES])
def test_single_regex_read_late_is_the_pinned_single_regex(name: str, program: dict) -> None:
    pt = compile_program(program)
    single = pt._single
    assert isinstance(single, PinnedRegex) and single._pattern is None
    assert pt.single_regex == pin(single.source, single._numeric)
    assert pt.single_regex == compile_program(program).single_regex  # a second build agrees


def test_a_map_shipping_another_pattern_next_to_its_program_uses_the_programs() -> None:
    """The bundled SmolLM2 map ships the program's pinned single regex as its
    ``pre_tokenizer_pattern``; the tokenizer never trusts that copy (it spells the program's
    own, lazily), so a map whose copy differs, or has none, encodes the same."""
    from tokenwire.codec.maps import load_map_bytes
    from tokenwire.codec.tokenizer import _pre_tokenizer

    tmap = load_map_file(bundled_map_path("huggingfacetb/smollm2"))
    doc = json.loads(tmap.raw)
    texts = ["Hello 12 world", "a\u0558b \U000190b6濺 1x", "  4 ünï"]
    want = [Tokenizer.from_map(tmap, "python").encode(t) for t in texts]
    for pattern in (r"\S+", None):
        if pattern is None:
            del doc["pre_tokenizer_pattern"]
        else:
            doc["pre_tokenizer_pattern"] = pattern
        other = load_map_bytes(json.dumps(doc).encode())
        assert _pre_tokenizer(other).single_regex == tmap.pre_tokenizer_pattern
        for backend in ("python", "tiktoken"):
            assert [Tokenizer.from_map(other, backend).encode(t) for t in texts] == want


def test_merged_tables_equal_the_generic_merge() -> None:
    from itertools import chain

    from tokenwire.codec.unicode_tables import RANGES, RUST_NUMERIC

    for name, cats in pinned_regex.CATEGORY_GROUPS.items():
        flat = chain.from_iterable(zip(RANGES[c][::2], RANGES[c][1::2], strict=True) for c in cats)
        assert category_ranges(name) == pinned_regex._merge(flat), name
    rust = RUST_NUMERIC["N"]
    rust_pairs = zip(rust[::2], rust[1::2], strict=True)
    assert category_ranges("N", "rust") == pinned_regex._merge(rust_pairs)
    # Overlapping or misordered tables are not paired blindly: they take the generic merge.
    assert pinned_regex._merge_flat([(0, 10), (2, 3)]) == ((0, 10),)
    assert pinned_regex._merge_flat([(0, 3, 8, 9), (4, 5)]) == ((0, 5), (8, 9))
    assert pinned_regex._merge_flat([(5, 9), (0, 6)]) == ((0, 9),)


@pytest.mark.parametrize("numeric", ["regex", "rust"])
def test_a_prefix_of_the_code_space_is_read_from_the_unmerged_tables(numeric: str) -> None:
    bounds = (*pinned_regex.PREFIX_BOUNDS, 1, 0x41, 0x5B, 0xAA, 0xD800, 0xE000, 0x10000, 0x10FFFF)
    for name in [*pinned_regex.CATEGORY_GROUPS, "WS"]:
        for bound in bounds:
            ranges = tuple((lo, min(hi, bound - 1)) for lo, hi in category_ranges(name, numeric)
                           if lo < bound)  # fmt: skip
            assert pinned_regex._text_below(name, numeric, bound) == (
                pinned_regex._ranges_text(ranges)), (name, bound)
