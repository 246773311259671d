"""Pre-tokenizer programs v1 and v2 (codec-spec.md §3.5) and legacy single patterns (§3.4).

::

    pt = compile_program({"version": 2, "stages": [...]})
    pt.split("a  1")        # ["a", "  ", "1"]: pieces that concatenate back to the text
    pt.single_regex         # one regex whose findall() gives the same pieces, or None
    pt.by_stages("a  1")    # the same pieces, by running the program as written

Execution (§3.5):

* v1: at each position try the ops in order; the first non-empty match is a piece; where
  no op matches, exactly one Unicode scalar is a piece.
* v2: pieces = [text]; each stage replaces every piece by its own output. The
  ``alternation`` stage runs the v1 scan inside one piece, except that a span no op matches
  is ONE piece (gap semantics, HF ``Split(..., Isolated)``). The other stages isolate runs
  of one character class, which is also ``Split(<class regex>, Isolated)``.

``single_regex`` exists so a caller can hand the whole text to tiktoken (one native regex)
instead of running stages in Python. It is provided for every v1 program (except
``metaspace_split``, whose pieces are not substrings), for a v2 program that is a single
``alternation``, and for ``[digits_isolate individual, alternation]`` (SmolLM2), whose
alternation is rewritten to see a digit as the end of its piece
(:mod:`tokenwire.codec.pretok_ops`). Other v2 programs get ``None``.

Where the single regex exists, :meth:`PreTokenizer.split` runs it (one ``findall``; the
staged program costs a Python loop per stage and piece, 2-3x more on the short texts of the
gateway's retokenizer) and :meth:`PreTokenizer.by_stages` runs the program as written (the
definition). They are equal by construction: for v1 and a lone ``alternation`` the staged
run IS one ordered alternation scanned left to right (a gap is the ``[\\s\\S]`` branch, or the
run of positions where no op matches); for ``[digits_isolate individual, alternation]``:

1. the regex's first branch, ``\\p{N}`` pinned to Rust's ``is_numeric``, matches exactly
   where the digits stage cuts, and a one-character digit piece stays whole in any
   alternation (a piece is never empty);
2. no other branch consumes a ``\\p{N}`` or looks past one (each op's digit-segment
   spelling), and a look-ahead ``(?!\\S)`` at a digit behaves as at the end of the segment,
   which is where the staged alternation sees it;
3. the ops' own ``\\p{N}`` (``[^\\s\\p{L}\\p{N}]``) never meet a digit inside a segment in
   either run, because Unicode 16.0.0's ``\\p{N}`` is a subset of ``is_numeric`` (a test
   checks the tables).

``tests/codec/test_pretok.py`` compares the two on the corpus, the conformance cases,
adversarial strings and hypothesis text for every program that has a single regex.

Known divergence from HF (not expressible with str pieces): in a ``Sequence`` where a stage
follows ``ByteLevel(use_regex=true)`` (Falcon's ``Digits``), HF runs that stage on GPT-2
byte-characters, so it also splits at UTF-8 bytes 0xB2/B3/B9/BC/BD/BE (``² ³ ¹ ¼ ½ ¾``)
inside multi-byte characters (Cyrillic ``в``: ``Ð`` + ``²``) and does not isolate non-ASCII
digits. §3.5 defines ``digits_isolate`` on text; we follow the spec.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from re import _parser  # the stdlib parser, for a pattern's least width (regex exposes none)
from typing import Any

import regex

from tokenwire.codec.pinned_regex import Numeric, PinnedRegex
from tokenwire.codec.pretok_ops import CompiledOp, compile_op
from tokenwire.codec.unicode_classes import ASCII_PUNCT_CLASS, CJK_CLASS, WHITE_SPACE, WS_CLASS
from tokenwire.errors import PatternTimeout, UnsupportedProgram

__all__ = [
    "MATCH_BUDGET_BASE_S",
    "MATCH_BUDGET_PER_CHAR_S",
    "METASPACE",
    "STAGE_PARAMS",
    "PreTokenizer",
    "compile_pattern",
    "compile_program",
]

#: The time a map's own ``pre_tokenizer_pattern`` (which its publisher wrote) may take on
#: one text: this base plus this much per character. The patterns real tokenizers use run
#: at ~0.1-0.5 us a character in the ``regex`` module, so this is 20x and more; a pattern
#: that backtracks catastrophically (``(a|aa)+b``: exponential, ``\s*\s*\s*\s*x``: a
#: power of the text's length) would hang the encode for ever. The module's ``timeout=``
#: costs ~3x a call, so a program's regexes (fixed shapes of our own, pretok_ops) are not
#: timed.
MATCH_BUDGET_BASE_S = 1.0
MATCH_BUDGET_PER_CHAR_S = 10e-6

METASPACE = "\u2581"  # "▁", SentencePiece's word-boundary mark

#: Parameters each v2 stage accepts (§3.5 "Stages"). Anything else is refused.
STAGE_PARAMS: dict[str, frozenset[str]] = {
    "digits_isolate": frozenset({"mode", "max_run"}),
    "digit_triples_isolate": frozenset(),
    "punctuation_contiguous": frozenset(),
    "cjk_isolate": frozenset(),
    "alternation": frozenset({"ops"}),
}

_ANY = r"[\s\S]"  # one code point, whatever each engine's \s is
_WS_CHARS = frozenset(map(chr, WHITE_SPACE))
_WS_RUN = regex.compile(WS_CLASS + "+")  # explicit code points: no table to pin

Splitter = Callable[[str], list[str]]


class PreTokenizer:
    """A compiled pre-tokenizer: ``split(text)`` and, when one exists, ``single_regex``."""

    __slots__ = ("_single", "_split", "_stages", "source")

    def __init__(self, split: Splitter, single_regex: str | PinnedRegex | None, source: Any,
                 *, stages: Splitter | None = None) -> None:
        self._split = split
        # The program run as written, when ``split`` is a faster equal (the single regex).
        self._stages = split if stages is None else stages
        # A PinnedRegex of the single regex's source: spelled when first read (most loads
        # never read it before ready; the tiktoken build does, on the builder thread).
        self._single = single_regex
        #: The program dict or pattern string this was compiled from.
        self.source = source

    @property
    def single_regex(self) -> str | None:
        """One regex whose findall() equals ``split()``, or None. Its classes are pinned
        to Unicode 16.0.0 and spelled alike for every engine (tokenwire.codec.pinned_regex)."""
        single = self._single
        return single.pattern if isinstance(single, PinnedRegex) else single

    def split(self, text: str) -> list[str]:
        """The pieces of ``text``, in order (they concatenate back to ``text``, except for
        a ``metaspace_split`` program, whose pieces carry ``▁`` and drop whitespace)."""
        if not text:
            return []
        return self._split(text)

    def by_stages(self, text: str) -> list[str]:
        """:meth:`split` computed by running the program's ops and stages as written (what
        ``split`` is checked against; the same pieces, more Python per call)."""
        if not text:
            return []
        return self._stages(text)

    def __repr__(self) -> str:
        return f"PreTokenizer({self.source!r})"


# -- shared scanning -------------------------------------------------------------------


def _isolate(pattern: PinnedRegex, piece: str, *, gaps_as_scalars: bool) -> list[str]:
    """HF ``Split(pattern, Isolated)``: matches and the gaps between them, in order."""
    out: list[str] = []
    last = 0
    for m in pattern.finditer(piece):
        start, end = m.span()
        if start > last:
            if gaps_as_scalars:
                out.extend(piece[last:start])
            else:
                out.append(piece[last:start])
        out.append(piece[start:end])
        last = end
    if last < len(piece):
        if gaps_as_scalars:
            out.extend(piece[last:])
        else:
            out.append(piece[last:])
    return out


class _OpList:
    """An ordered op list compiled to one ordered alternation (§3.5 execution order)."""

    def __init__(self, raw_ops: Any) -> None:
        if not isinstance(raw_ops, list):
            raise UnsupportedProgram("`ops` must be a list of op objects")
        self.ops: list[CompiledOp] = [compile_op(op) for op in raw_ops]
        frags = [op.fragment for op in self.ops if op.fragment is not None]
        # An empty alternation must never match; `(?!)` says so in both engines.
        self.alternation = "|".join(frags) if frags else "(?!)"
        self.pattern = PinnedRegex(self.alternation)
        covers = frozenset().union(*(op.covers for op in self.ops))
        letters = "L" in covers or {"title", "upper"} <= covers
        # Exhaustive: every code point starts a match of some op, so the fallback (v1) or
        # gap (v2) branch can never fire and the bare alternation is the whole regex.
        self.exhaustive = letters and {"N", "WS", "OTHER"} <= covers

    def v1_regex(self) -> str:
        return self.alternation if self.exhaustive else f"{self.alternation}|{_ANY}"

    def gap_regex(self) -> str:
        """Source spelling (``\\p{..}`` classes); :func:`pin` gives the portable one."""
        if self.exhaustive:
            return self.alternation
        # A gap is the maximal run of positions where no op matches.
        return f"{self.alternation}|(?:(?!{self.alternation}){_ANY})+"

    def digit_segment_regex(self) -> str | None:
        """The alternation as it behaves inside digit-free segments, or None (§3.5, SmolLM2)."""
        if not all(op.digit_safe for op in self.ops):
            return None
        frags = [op.digit_fragment for op in self.ops if op.digit_fragment is not None]
        alternation = "|".join([r"\p{N}", *frags])
        if self.exhaustive:
            return alternation
        inner = "|".join(frags) if frags else "(?!)"
        return rf"{alternation}|(?:(?!\p{{N}}|{inner}){_ANY})+"


# -- v1 --------------------------------------------------------------------------------


def _metaspace_splitter(op: Mapping[str, Any]) -> Splitter:
    """Split on White_Space runs, prefix ``▁`` to each word (§3.5 ``metaspace_split``).

    ``prefix_first: true`` leaves the FIRST word unprefixed, as the conformance fixture
    says (the opposite of what the name suggests; §9.1 item 17). A leading whitespace run
    already counts as "not first", as in the C and Python reference clients.
    """
    unknown = set(op) - {"op", "prefix_first"}
    if unknown:
        raise UnsupportedProgram(f"op 'metaspace_split': unknown parameter(s) {sorted(unknown)}")
    prefix_first = op.get("prefix_first")
    if prefix_first is not None and not isinstance(prefix_first, bool):
        raise UnsupportedProgram("op 'metaspace_split': `prefix_first` must be a boolean")

    def split(text: str) -> list[str]:
        out: list[str] = []
        first = text[0] not in _WS_CHARS
        for word in _WS_RUN.split(text):
            if word:
                out.append(word if (prefix_first and first) else METASPACE + word)
                first = False
        return out

    return split


def _compile_v1(program: Mapping[str, Any]) -> PreTokenizer:
    _check_keys(program, {"version", "ops"}, "v1 program")
    ops = program.get("ops")
    if isinstance(ops, list) and any(
        isinstance(op, Mapping) and op.get("op") == "metaspace_split" for op in ops
    ):
        if len(ops) != 1:
            raise UnsupportedProgram("op 'metaspace_split' must be the only op of a v1 program")
        return PreTokenizer(_metaspace_splitter(ops[0]), None, program)
    oplist = _OpList(ops)
    pattern = oplist.pattern
    if oplist.exhaustive:  # the alternation is the v1 regex
        return PreTokenizer(pattern.findall, pattern, program)
    # Where no op matches, the `[\s\S]` branch takes one scalar: the v1 fallback.
    single = PinnedRegex(oplist.v1_regex())
    return PreTokenizer(single.findall, single, program,
                        stages=lambda t: _isolate(pattern, t, gaps_as_scalars=True))


# -- v2 --------------------------------------------------------------------------------


def _isolating_stage(pattern: str, numeric: str = "regex") -> Splitter:
    compiled = PinnedRegex(pattern, numeric)
    return lambda piece: _isolate(compiled, piece, gaps_as_scalars=False)


def _digits_stage(stage: Mapping[str, Any]) -> Splitter:
    mode = stage.get("mode")
    max_run = stage.get("max_run")
    if mode not in ("individual", "grouped"):
        raise UnsupportedProgram(f"stage 'digits_isolate': unknown `mode` {mode!r}")
    if max_run is not None and (
        not isinstance(max_run, int) or isinstance(max_run, bool) or max_run < 0
    ):
        raise UnsupportedProgram("stage 'digits_isolate': `max_run` must be an integer >= 1")
    # HF Digits is Rust's char::is_numeric (numeric="rust"), not a regex class; with
    # max_run it is DeepSeek's Split(\p{N}{1,K}, Isolated), a regex: runs chunked left to right.
    if mode == "individual":
        return _isolating_stage(r"\p{N}", "rust")
    if max_run:
        return _isolating_stage(rf"\p{{N}}{{1,{max_run}}}")
    return _isolating_stage(r"\p{N}+", "rust")


def _stage_splitter(stage: Any) -> tuple[str, Splitter, _OpList | None]:
    if not isinstance(stage, Mapping) or not isinstance(stage.get("stage"), str):
        raise UnsupportedProgram(f"a stage must be an object with a string `stage`, got {stage!r}")
    kind = stage["stage"]
    if kind not in STAGE_PARAMS:
        raise UnsupportedProgram(f"unknown pre-tokenizer stage {kind!r}")
    _check_keys(stage, STAGE_PARAMS[kind] | {"stage"}, f"stage {kind!r}")
    match kind:
        case "digits_isolate":
            return kind, _digits_stage(stage), None
        case "digit_triples_isolate":
            # Split("[0-9][0-9][0-9]", Isolated): ASCII digits only, leftovers stay in gaps.
            return kind, _isolating_stage("[0-9]{3}"), None
        case "punctuation_contiguous":
            # HF Punctuation(Contiguous): runs of is_ascii_punctuation || \p{P}; the rest
            # (letters, spaces, symbols) forms the gap pieces between them.
            return kind, _isolating_stage(rf"(?:{ASCII_PUNCT_CLASS}|\p{{P}})+"), None
        case "cjk_isolate":
            return kind, _isolating_stage(CJK_CLASS + "+"), None
    oplist = _OpList(stage.get("ops"))
    compiled = PinnedRegex(oplist.gap_regex())
    if oplist.exhaustive:
        return kind, compiled.findall, oplist
    return kind, lambda piece: _isolate(oplist.pattern, piece, gaps_as_scalars=False), oplist


def _v2_single_regex(kinds: Sequence[tuple[str, Mapping[str, Any]]],
                     oplists: Sequence[_OpList | None]) -> tuple[str, Numeric] | None:
    """The source spelling of the program's single regex and the ``\\p{N}`` it means, or
    None when the program is not of a shape proven equal (module docstring)."""
    if not kinds:
        return _ANY + "+", "regex"  # no stage: the whole text is one piece
    if len(kinds) == 1 and oplists[0] is not None:
        return oplists[0].gap_regex(), "regex"
    if (
        len(kinds) == 2
        and kinds[0][0] == "digits_isolate"
        and kinds[0][1].get("mode") == "individual"
        and oplists[1] is not None
    ):
        segment = oplists[1].digit_segment_regex()
        # Every \p{N} there is "the digits stage cut here": Rust's is_numeric (HF Digits).
        return None if segment is None else (segment, "rust")
    return None


def _compile_v2(program: Mapping[str, Any]) -> PreTokenizer:
    _check_keys(program, {"version", "stages"}, "v2 program")
    stages = program.get("stages")
    if not isinstance(stages, list):
        raise UnsupportedProgram("a v2 program needs a `stages` list")
    compiled = [_stage_splitter(stage) for stage in stages]
    splitters = [splitter for _, splitter, _ in compiled]

    def split(text: str) -> list[str]:
        pieces = [text]
        for splitter in splitters:
            pieces = [out for piece in pieces for out in splitter(piece)]
        return pieces

    kinds = [(kind, stage) for (kind, _, _), stage in zip(compiled, stages, strict=True)]
    single = _v2_single_regex(kinds, [oplist for _, _, oplist in compiled])
    if single is None:
        return PreTokenizer(split, None, program)
    one = PinnedRegex(*single)  # the module's own tables unless the text has a disputed cp
    return PreTokenizer(one.findall, one, program, stages=split)


# -- entry points ----------------------------------------------------------------------


def _check_keys(obj: Mapping[str, Any], allowed: set[str] | frozenset[str], what: str) -> None:
    unknown = set(obj) - set(allowed)
    if unknown:
        raise UnsupportedProgram(f"{what}: unknown key(s) {sorted(unknown)}")


def compile_program(program: Mapping[str, Any]) -> PreTokenizer:
    """Compile a ``pre_tokenizer_program`` (v1 ``ops`` or v2 ``stages``, §3.5).

    Raises :class:`UnsupportedProgram` naming any unknown version, op, stage or parameter.
    """
    if not isinstance(program, Mapping):
        raise UnsupportedProgram(f"a pre_tokenizer_program must be an object, got {program!r}")
    version = program.get("version")
    try:
        if version == 1 and not isinstance(version, bool):
            return _compile_v1(program)
        if version == 2 and not isinstance(version, bool):
            return _compile_v2(program)
    except regex.error as exc:  # a parameter past the module's limits (max_run 2^32)
        raise UnsupportedProgram(f"pre_tokenizer_program does not compile: {exc}") from exc
    raise UnsupportedProgram(f"unsupported pre_tokenizer_program version {version!r}")


#: ``\p{L}`` / ``\PL``: one character wide, unknown to the stdlib parser.
_PROPERTY = regex.compile(r"\\[pP](?:\{[^}]*\}|[A-Za-z])")


def _parsed(pattern: str) -> Any:
    """The stdlib parser's tree of ``pattern`` (``\\p{..}`` stood in by one character,
    which has its width), or None for regex-only syntax it cannot read."""
    try:
        return _parser.parse(_PROPERTY.sub("x", pattern))
    except Exception:
        return None


def _can_match_empty(pattern: str) -> bool:
    """Whether some match may be zero-width anywhere in a text (``a|\\b``, ``(?=a)``), not
    only on the empty string: findall would return ``""`` there. A pattern the stdlib's
    parser cannot read counts as able to, which only costs the ``single_regex``."""
    tree = _parsed(pattern)
    return tree is None or tree.getwidth()[0] == 0


_REPEATS = frozenset({_parser.MAX_REPEAT, _parser.MIN_REPEAT, _parser.POSSESSIVE_REPEAT})


def _nested_repeat(items: Any, repeated: bool) -> bool:
    """Whether a repeat (of more than one) holds another repeat or an alternation: the
    shape of catastrophic backtracking (``(a+)+``, ``(a|aa)+``). No tokenizer's pattern
    has it: they are alternations of classes each repeated once (``?``, ``+``, ``{1,3}``)."""
    for op, av in items:
        if op in _REPEATS:
            if av[1] > 1 and (repeated or _nested_repeat(av[2], True)):
                return True
            if _nested_repeat(av[2], repeated):
                return True
        elif op is _parser.BRANCH:
            if repeated or any(_nested_repeat(sub, repeated) for sub in av[1]):
                return True
        elif op is _parser.SUBPATTERN:
            if _nested_repeat(av[3], repeated):
                return True
        elif op in (_parser.ASSERT, _parser.ASSERT_NOT):
            if _nested_repeat(av[1], repeated):
                return True
        elif op is _parser.ATOMIC_GROUP and _nested_repeat(av, repeated):
            return True
    return False


def compile_pattern(pattern: str) -> PreTokenizer:
    """A legacy ``pre_tokenizer_pattern``: every non-empty match, in order (§3.4 step 2).

    A pattern that repeats a repeat or an alternation is refused (:class:`UnsupportedProgram`),
    and each match call runs within a time budget (:class:`~tokenwire.errors.PatternTimeout`):
    the pattern is the map publisher's, and the client runs it on the first encode.
    Text no match covers is dropped, as tiktoken does. ``single_regex`` is the pattern
    itself when that is honest: no capturing groups (findall would return groups) and no
    possible empty match anywhere (findall would return ``""``).
    """
    tree = _parsed(pattern)
    if tree is not None and _nested_repeat(tree, False):
        raise UnsupportedProgram(f"pre_tokenizer_pattern {pattern[:80]!r} repeats a repeat or "
                                 "an alternation, which can backtrack catastrophically")
    try:
        compiled = PinnedRegex(pattern)
        regex.compile(compiled.pattern)  # the pinned spelling must compile too
    except regex.error as exc:
        raise UnsupportedProgram(f"pre_tokenizer_pattern does not compile: {exc}") from exc

    # Each split within its budget: the map's publisher wrote the pattern (one the refusal
    # above does not catch, e.g. \s*\s*\s*x, is polynomial).
    def split(text: str) -> list[str]:
        with _budget(pattern, text) as budget:
            return [m.group() for m in compiled.compiled_for(text).finditer(text, timeout=budget)
                    if m.end() > m.start()]

    def split_groupless(text: str) -> list[str]:
        # Without groups findall gives finditer's whole matches, in C.
        with _budget(pattern, text) as budget:
            return [piece for piece in compiled.compiled_for(text).findall(text, timeout=budget)
                    if piece]

    honest = compiled.groups == 0 and not _can_match_empty(pattern)
    if compiled.groups == 0:
        return PreTokenizer(split_groupless, compiled.pattern if honest else None, pattern,
                            stages=split)
    return PreTokenizer(split, compiled.pattern if honest else None, pattern)


@contextmanager
def _budget(pattern: str, text: str) -> Iterator[float]:
    """The seconds ``pattern`` may take on ``text`` (:data:`MATCH_BUDGET_BASE_S`); its
    ``regex`` timeout inside is a :class:`~tokenwire.errors.PatternTimeout`."""
    budget = MATCH_BUDGET_BASE_S + len(text) * MATCH_BUDGET_PER_CHAR_S
    try:
        yield budget
    except TimeoutError:
        raise PatternTimeout(f"the pattern {pattern[:80]!r} took more than {budget:.1f} s on "
                             f"a text of {len(text):,} characters (it backtracks "
                             "catastrophically)") from None
