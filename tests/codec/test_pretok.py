"""Pre-tokenizer programs v1/v2 (codec-spec.md §3.5) and legacy patterns (§3.4 step 2)."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest
import regex
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import CODEC_FIXTURES, corpus, fixture_map_path
from tokenwire.codec.maps import bundled_map_path
from tokenwire.codec.pinned_regex import category_ranges, pin
from tokenwire.codec.pretok import METASPACE, compile_pattern, compile_program
from tokenwire.codec.pretok_lower import BYTE_LEVEL_OPS
from tokenwire.codec.pretok_ops import compile_op
from tokenwire.codec.unicode_classes import WHITE_SPACE, WS_CLASS
from tokenwire.errors import PatternTimeout, UnsupportedProgram

CASES = json.loads(
    (CODEC_FIXTURES / "pretok-program" / "pretok-program-cases.json").read_text("utf-8")
)["cases"]

SMOLLM2 = {
    "version": 2,
    "stages": [
        {"stage": "digits_isolate", "mode": "individual"},
        {"stage": "alternation", "ops": BYTE_LEVEL_OPS},
    ],
}

#: The tricky alphabet the brief asks for: every whitespace kind (and the near misses),
#: digits of every N category, letters of every L category, marks, CJK, emoji, contractions.
ALPHABET = [
    " ", "  ", "\t", "\n", "\r\n", "\r", "\x0b", "\x0c", "\x85", "\xa0", "\u1680", "\u2000",
    "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\x1c", "\x1d", "\x1e",
    "\x1f", "\u180e", "\u200b", "\ufeff",
    "0", "1", "9", "²", "½", "٣", "Ⅻ", "①", "123", "4567",
    "a", "Z", "é", "ß", "ǅ", "ʰ", "ſ", "İ", "Ω", "\u212a", "e\u0301", "\u0301", "\u0903",
    "日", "本", "ひ", "カ", "・", "ー", "龥", "龦", "😀", "👍🏽", "\u200d", "\ufe0f",
    "'", "’", "'s", "'S", "'ll", "'LL", "'ſ", "'re", ".", ",", "!", "?", "(", ")", "-", "_",
    "`", "~", "$", "+", "<", ">", "/", "\\", "«", "»", "—", "…", "¡", "¿", "、", "。", "#",
    "@", "©", "€", "∑", "^", "в", "ò", "Hello", "World", "HTTP", "myVar",
]  # fmt: skip
tricky_text = st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=30).map("".join)


def _unique_programs() -> list[tuple[str, dict[str, Any]]]:
    seen: dict[str, tuple[str, dict[str, Any]]] = {}
    for case in CASES:
        seen.setdefault(json.dumps(case["program"], sort_keys=True), (case["name"],
                                                                       case["program"]))
    for map_id in ("openai/cl100k_base", "openai/r50k_base", "huggingfacetb/smollm2",
                   "tiiuae/falcon"):
        doc = json.loads(fixture_map_path(map_id).read_text("utf-8"))
        seen[map_id] = (map_id, doc["pre_tokenizer_program"])
    seen["smollm2-v2"] = ("smollm2-v2", SMOLLM2)
    return list(seen.values())


PROGRAMS = _unique_programs()
SINGLE_REGEX_PROGRAMS = [
    (name, prog) for name, prog in PROGRAMS if compile_program(prog).single_regex is not None
]


@cache
def _corpus() -> list[str]:
    return [s for samples in corpus().values() for s in samples]


# -- conformance fixture ---------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_program_pieces_match_conformance_fixture(case: dict[str, Any]) -> None:
    assert compile_program(case["program"]).split(case["input"]) == case["expected_pieces"]


def test_fixture_has_all_51_cases() -> None:
    assert len(CASES) == 51


# -- execution semantics ---------------------------------------------------------------


def test_v1_unmatched_position_emits_exactly_one_scalar() -> None:
    pt = compile_program({"version": 1, "ops": [{"op": "letters"}]})
    assert pt.split("ab12 c😀😀") == ["ab", "1", "2", " ", "c", "😀", "😀"]


def test_v2_alternation_unmatched_span_is_one_piece() -> None:
    pt = compile_program({"version": 2, "stages": [{"stage": "alternation",
                                                    "ops": [{"op": "letters"}]}]})
    assert pt.split("ab12 c😀😀") == ["ab", "12 ", "c", "😀😀"]


def test_v2_stages_apply_to_every_piece_in_order() -> None:
    pt = compile_program({"version": 2, "stages": [
        {"stage": "cjk_isolate"}, {"stage": "digits_isolate", "mode": "grouped", "max_run": 2},
    ]})
    assert pt.split("x日本12345y") == ["x", "日本", "12", "34", "5", "y"]


def test_v2_without_stages_is_the_whole_text() -> None:
    pt = compile_program({"version": 2, "stages": []})
    assert pt.split("a b") == ["a b"]
    assert regex.findall(pt.single_regex, "a b") == ["a b"]


def test_literals_match_the_longest_listed_literal() -> None:
    pt = compile_program({"version": 1, "ops": [{"op": "literals", "patterns": ["a", "ab"]}]})
    assert pt.split("abab") == ["ab", "ab"]


def test_literals_ci_folds_case_but_literals_does_not() -> None:
    ci = compile_program({"version": 1, "ops": [{"op": "literals_ci", "patterns": ["'ll"]}]})
    cs = compile_program({"version": 1, "ops": [{"op": "literals", "patterns": ["'ll"]}]})
    assert ci.split("'LL") == ["'LL"]
    assert cs.split("'LL") == ["'", "L", "L"]


def test_trailing_ws_keeps_all_but_last_space_before_a_word() -> None:
    ops = [{"op": "trailing_ws"}, {"op": "ws_run"}, {"op": "letters"}]
    pt = compile_program({"version": 1, "ops": ops})
    assert pt.split("a   b  ") == ["a", "  ", " ", "b", "  "]


def test_newline_block_ends_at_the_last_newline_of_the_run() -> None:
    pt = compile_program({"version": 1, "ops": [{"op": "newline_block"}, {"op": "ws_run"}]})
    assert pt.split(" \n \n  x") == [" \n \n", "  ", "x"]


def test_letters_l_p_s_lead_may_be_a_mark_even_without_letters_after() -> None:
    # [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ : a lone combining mark is a body, not a lead.
    op = {"op": "letters", "lead_other": True, "lead_other_class": "l_p_s", "body": "L_M"}
    assert compile_program({"version": 1, "ops": [op]}).split("\u0301!") == ["\u0301", "!"]


def test_metaspace_split_prefixes_words_and_drops_whitespace() -> None:
    op = {"op": "metaspace_split", "prefix_first": False}
    pt = compile_program({"version": 1, "ops": [op]})
    assert pt.split("Hi  there\u3000you\n") == [f"{METASPACE}Hi", f"{METASPACE}there",
                                                f"{METASPACE}you"]
    assert pt.single_regex is None


def test_metaspace_split_prefix_first_leaves_first_word_bare() -> None:
    pt = compile_program({"version": 1, "ops": [{"op": "metaspace_split", "prefix_first": True}]})
    assert pt.split("a b") == ["a", f"{METASPACE}b"]
    assert pt.split(" a b") == [f"{METASPACE}a", f"{METASPACE}b"]


def test_empty_text_has_no_pieces() -> None:
    for _, prog in PROGRAMS:
        assert compile_program(prog).split("") == []


# -- Unicode classes (§3.5 caveats, §10 item 7) ----------------------------------------


def test_white_space_table_is_unicode_white_space() -> None:
    every = "".join(map(chr, range(0x110000)))
    expected = [m.start() for m in regex.finditer(r"\p{White_Space}", every)]
    assert list(WHITE_SPACE) == expected
    assert [m.start() for m in regex.finditer(WS_CLASS, every)] == expected


@pytest.mark.parametrize("cp", [0x85, 0xA0, 0x1680, 0x2000, 0x200A, 0x2028, 0x2029, 0x202F,
                                0x205F, 0x3000])
def test_unicode_white_space_code_points_are_whitespace(cp: int) -> None:
    pt = compile_program({"version": 1, "ops": BYTE_LEVEL_OPS})
    # \s+(?!\S) gives back the last space before a word; a word never absorbs it.
    assert pt.split(f"a{chr(cp)}{chr(cp)}b") == ["a", chr(cp), chr(cp), "b"]
    assert pt.split(f"a{chr(cp) * 2}") == ["a", chr(cp) * 2]


@pytest.mark.parametrize("cp", [0x1C, 0x1D, 0x1E, 0x1F, 0x180E, 0x200B, 0xFEFF])
def test_isspace_only_code_points_are_not_whitespace(cp: int) -> None:
    # str.isspace() says yes for U+001C..U+001F; White_Space says no (§3.5 caveats).
    pt = compile_program({"version": 1, "ops": BYTE_LEVEL_OPS})
    assert pt.split(f"a{chr(cp) * 2}b") == ["a", chr(cp) * 2, "b"]


def test_digits_isolate_uses_all_number_categories() -> None:
    pt = compile_program({"version": 2, "stages": [{"stage": "digits_isolate",
                                                    "mode": "individual"}]})
    assert pt.split("a1²½٣Ⅻb") == ["a", "1", "²", "½", "٣", "Ⅻ", "b"]


def test_digit_triples_are_ascii_only() -> None:
    pt = compile_program({"version": 2, "stages": [{"stage": "digit_triples_isolate"}]})
    assert pt.split("٣٣٣1234") == ["٣٣٣", "123", "4"]


# -- refusal: never guess --------------------------------------------------------------


@pytest.mark.parametrize(
    ("program", "named"),
    [
        ({"version": 3, "ops": []}, "version 3"),
        ({"ops": []}, "version None"),
        ({"version": 1, "ops": [{"op": "emoji_run"}]}, "emoji_run"),
        ({"version": 2, "stages": [{"stage": "alternation", "ops": [{"op": "x_op"}]}]}, "x_op"),
        ({"version": 2, "stages": [{"stage": "nfc_normalize"}]}, "nfc_normalize"),
        ({"version": 1, "ops": [{"op": "letters", "body": "L_M_N"}]}, "L_M_N"),
        ({"version": 1, "ops": [{"op": "letters", "lead_tab": True}]}, "lead_tab"),
        ({"version": 1, "ops": [{"op": "letters_cased", "kind": "lower"}]}, "lower"),
        ({"version": 1, "ops": [{"op": "punct_run", "charset": "ascii"}]}, "ascii"),
        ({"version": 2, "stages": [{"stage": "digits_isolate", "mode": "pairs"}]}, "pairs"),
        ({"version": 1, "ops": [{"op": "metaspace_split"}, {"op": "ws_run"}]},
         "metaspace_split"),
        ({"version": 2, "stages": [{"stage": "alternation",
                                    "ops": [{"op": "metaspace_split"}]}]}, "metaspace_split"),
        ({"version": 1, "ops": [], "extra": 1}, "extra"),
    ],
)
def test_unknown_version_op_stage_or_parameter_is_refused_by_name(
    program: dict[str, Any], named: str
) -> None:
    with pytest.raises(UnsupportedProgram, match=regex.escape(named)):
        compile_program(program)


@pytest.mark.parametrize("program", [
    {"version": 1, "ops": [{"op": "numbers", "max_run": 2**32}]},
    {"version": 2, "stages": [{"stage": "digits_isolate", "mode": "grouped", "max_run": 2**40}]},
])
def test_a_max_run_past_the_regex_modules_limit_is_refused(program: dict[str, Any]) -> None:
    # A map's number, not ours: it was the regex module's own error, not a typed refusal.
    with pytest.raises(UnsupportedProgram, match="repeat count too big"):
        compile_program(program)


def test_op_regexes_compile_in_tiktoken_dialect() -> None:
    # Every op spelling avoids \s and non-portable escapes so tiktoken (fancy-regex) takes it.
    ops = [op for _, prog in PROGRAMS for op in prog.get("ops", [])
           if op["op"] != "metaspace_split"]
    for op in ops:
        frag = compile_op(op).fragment
        assert frag is not None and r"\s" not in frag and r"\S" not in frag


# -- single_regex: findall(single_regex) == split --------------------------------------


def test_single_regex_exists_for_v1_and_smollm2_only_when_honest() -> None:
    assert compile_program(SMOLLM2).single_regex is not None
    falcon = next(c["program"] for c in CASES if c["name"] == "falcon_worked_example")
    assert compile_program(falcon).single_regex is None
    for _, prog in PROGRAMS:
        pt = compile_program(prog)
        if prog["version"] == 1 and prog["ops"][0]["op"] != "metaspace_split":
            assert pt.single_regex is not None


def test_smollm2_single_regex_keeps_whitespace_before_a_digit_whole() -> None:
    # codec-spec.md §3.5 caveats: HF gives ["a", "  ", "1"]; the v1 approximation does not.
    single = compile_program(SMOLLM2).single_regex
    assert single is not None
    assert regex.findall(single, "a  1") == ["a", "  ", "1"]


@pytest.mark.parametrize(("name", "program"), SINGLE_REGEX_PROGRAMS,
                         ids=[n for n, _ in SINGLE_REGEX_PROGRAMS])
def test_single_regex_findall_equals_split_on_corpus(name: str, program: dict[str, Any]) -> None:
    pt = compile_program(program)
    assert pt.single_regex is not None
    compiled = regex.compile(pt.single_regex)
    bad = [s for s in _corpus() if compiled.findall(s) != pt.split(s)]
    assert bad == []


@settings(max_examples=200, deadline=None)
@given(text=tricky_text)
def test_single_regex_findall_equals_split_on_tricky_text(text: str) -> None:
    for _, program in SINGLE_REGEX_PROGRAMS:
        pt = compile_program(program)
        assert regex.findall(pt.single_regex, text) == pt.split(text)


@pytest.mark.parametrize("name", ["openai/cl100k_base", "smollm2-v2"])
def test_single_regex_gives_the_same_pieces_in_tiktoken(name: str) -> None:
    # A vocabulary of the 256 bytes plus every piece we produce: tiktoken then returns one
    # token per piece exactly when its own regex split (fancy-regex) agrees with ours.
    program = dict(PROGRAMS)[name]
    pt = compile_program(program)
    samples = _corpus()[::3]
    splits = [pt.split(s) for s in samples]
    ranks = {bytes([b]): b for b in range(256)}
    for pieces in splits:
        for piece in pieces:
            ranks.setdefault(piece.encode(), len(ranks))
    enc = tiktoken.Encoding(f"pretok-test-{name}", pat_str=pt.single_regex,
                            mergeable_ranks=ranks, special_tokens={})
    for text, pieces in zip(samples, splits, strict=True):
        tokens = enc.encode_ordinary(text)
        assert [enc.decode_single_token_bytes(t) for t in tokens] == [p.encode() for p in pieces]


# -- split (the single regex where one exists) against by_stages (the program as written) --

#: Code points where the regex module's Unicode 17 tables and the pinned 16.0.0 ones (or
#: Rust's is_numeric) disagree: a text holding one takes PinnedRegex's exact compilation.
DISPUTED = ["\u0558", "\U00011de0", "\U0001246f", "\u2e60", "\u20c1", "\U000190b6"]
#: Around each look-ahead and cut of the programs: digit runs of every kind, contractions,
#: whitespace runs before words and digits, newlines, CJK, emoji, marks, disputed points.
ADVERSARIAL = [
    "a  1", "x're 12345", "don't  9 lives'", "a \t\n 7b", "1 2  3   4", "٣٣٣1234²½",
    "it'll\r\n\r\n  x", "   ", "\n\n\n", "'s's's", "'", "123'", "a'1re", "中文123abc",
    "😀😀 1😀", "e\u0301\u0301 2", " \u00a0\u3000x", "HTTP2Server", "$1,000.50", "١٢٣ abc",
    *[f"a{cp}1 {cp}{cp}b" for cp in DISPUTED],
]  # fmt: skip
_BUNDLED_SMOLLM2 = json.loads(bundled_map_path("huggingfacetb/smollm2").read_text("utf-8"))
SPLIT_PROGRAMS = [*PROGRAMS, ("bundled/smollm2", _BUNDLED_SMOLLM2["pre_tokenizer_program"])]
SPLIT_IDS = [name for name, _ in SPLIT_PROGRAMS]
adversarial_text = st.lists(st.sampled_from(ALPHABET + DISPUTED), min_size=1,
                            max_size=30).map("".join)


def test_bundled_smollm2_program_is_the_digits_and_alternation_shape() -> None:
    # The gateway's SmolLM2 map: the one-regex path must cover it (else no speed-up).
    assert _BUNDLED_SMOLLM2["pre_tokenizer_program"] == SMOLLM2
    assert compile_program(SMOLLM2).single_regex is not None


@pytest.mark.parametrize(("name", "program"), SPLIT_PROGRAMS, ids=SPLIT_IDS)
def test_split_equals_by_stages_on_corpus_cases_and_adversarial(name: str,
                                                                program: dict) -> None:
    pt = compile_program(program)
    texts = [*_corpus(), *(c["input"] for c in CASES), *ADVERSARIAL]
    assert [t for t in texts if pt.split(t) != pt.by_stages(t)] == []


@settings(max_examples=300, deadline=None)
@given(text=adversarial_text)
def test_split_equals_by_stages_on_hypothesis_text(text: str) -> None:
    for _, program in SPLIT_PROGRAMS:
        pt = compile_program(program)
        assert pt.split(text) == pt.by_stages(text)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=40))
def test_split_equals_by_stages_on_any_text(text: str) -> None:
    for _, program in SINGLE_REGEX_PROGRAMS:
        pt = compile_program(program)
        assert pt.split(text) == pt.by_stages(text)


def test_split_of_a_v2_program_without_single_regex_runs_its_stages() -> None:
    falcon = next(c["program"] for c in CASES if c["name"] == "falcon_worked_example")
    pt = compile_program(falcon)
    assert pt.single_regex is None
    assert pt.split("x 1234 ab") == pt.by_stages("x 1234 ab")


def test_unicode_16_numbers_are_within_rust_is_numeric() -> None:
    # The premise of the digits+alternation regex (pretok.py, point 3): inside a segment
    # the digits stage left, no op's \p{N} can meet a character of either table.
    def cps(ranges):
        return {cp for lo, hi in ranges for cp in range(lo, hi + 1)}

    assert cps(category_ranges("N")) <= cps(category_ranges("N", "rust"))


def test_pattern_split_equals_its_match_by_match_definition() -> None:
    for pattern in (r"\p{L}+|x*", r"\p{L}+| ?\p{N}+|\s+(?!\S)|\s+", r"a|$"):
        pt = compile_pattern(pattern)
        for text in [*ADVERSARIAL, "ab 12 cd", "xx yy"]:
            assert pt.split(text) == pt.by_stages(text)


# -- legacy pre_tokenizer_pattern ------------------------------------------------------


def test_pattern_yields_all_nonempty_matches_and_drops_the_rest() -> None:
    pt = compile_pattern(r"\p{L}+|x*")
    assert pt.split("ab 12 cd") == ["ab", "cd"]
    assert pt.single_regex is None  # findall would also return "" for the empty matches


def test_pattern_with_capture_groups_has_no_single_regex() -> None:
    pt = compile_pattern(r"(\p{L})+")
    assert pt.split("ab cd") == ["ab", "cd"]
    assert pt.single_regex is None


@pytest.mark.parametrize("pattern", [r"(\p{L}", r"[\x{110000}]", r"\U00110000", r"[a-\x{10FFFF}]"])
def test_pattern_that_does_not_compile_is_refused(pattern: str) -> None:
    # Code points past U+10FFFF cannot be spelled either. The spelling is made late now
    # (issue 15), so the module's compile of the source refuses them at load (a top-level
    # one used to escape as the spelling's ValueError).
    with pytest.raises(UnsupportedProgram):
        compile_pattern(pattern)


# The shape of catastrophic backtracking: a repeat of a repeat or of an alternation.
@pytest.mark.parametrize("pattern", [r"(a|aa)+b", r"(a+)+b", r"(?:\p{L}+\s?)*$", r"(?:xy|x)*z",
                                     r"(?=(?:a+)+)a"])
def test_a_pattern_that_repeats_a_repeat_or_an_alternation_is_refused(pattern: str) -> None:
    with pytest.raises(UnsupportedProgram, match="repeats a repeat or an alternation"):
        compile_pattern(pattern)


# Real tokenizers' patterns (GPT-2, cl100k / Llama-3, o200k, Qwen2) repeat single classes.
@pytest.mark.parametrize("pattern", [
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
])
def test_real_tokenizer_patterns_are_not_refused(pattern: str) -> None:
    assert compile_pattern(pattern).split("Hello, world 123!\n") != []


def test_a_pattern_that_backtracks_past_its_budget_is_a_typed_error() -> None:
    # Not refused by shape (adjacent repeats), yet n^8 steps on n spaces: never finishes.
    pt = compile_pattern(r"\s*\s*\s*\s*\s*\s*\s*\s*x|\S+")
    with pytest.raises(PatternTimeout, match="20,001 characters"):
        pt.split(" " * 20_000 + "y")


@pytest.mark.parametrize("map_id", ["openai/cl100k_base", "openai/r50k_base"])
def test_shipped_pattern_and_program_agree_on_corpus(map_id: str) -> None:
    # §3.5 equivalence requirement: a v1 program's pieces equal its pattern regex's pieces.
    doc = json.loads(fixture_map_path(map_id).read_text("utf-8"))
    by_pattern = compile_pattern(doc["pre_tokenizer_pattern"])
    by_program = compile_program(doc["pre_tokenizer_program"])
    assert by_pattern.single_regex == pin(doc["pre_tokenizer_pattern"])
    bad = [s for s in _corpus() if by_pattern.split(s) != by_program.split(s)]
    assert bad == []


# A pattern that can match zero-width somewhere (not only on "") has no single_regex:
# findall would give "" pieces there that split drops.
@pytest.mark.parametrize(("pattern", "honest"), [
    (r"a|\b", False), (r"\b|y", False), (r"(?=a)", False), (r"(?!a)", False),
    (r"(?:)", False), (r"x*", False), (r"$", False), (r"\p{L}+|(?=\p{N})", False),
    (r"\s+(?!\S)|\s+", True), (r" ?\p{L}+| ?\p{N}+|\s+", True), (r"a(?=b)", True),
])
def test_a_pattern_that_can_match_empty_anywhere_has_no_single_regex(pattern, honest) -> None:
    pt = compile_pattern(pattern)
    assert (pt.single_regex is not None) is honest
    if honest:
        text = "ab a1 b\n  c"
        assert regex.findall(pt.single_regex, text) == pt.split(text)
