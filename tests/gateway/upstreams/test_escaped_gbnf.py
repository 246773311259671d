"""A custom tool's grammar format, written as GBNF of its input JSON-escaped: checked
against two oracles, llama.cpp's own grammar sampler (:mod:`.gbnf_oracle`: does the GBNF
accept the JSON string?) and the grammar's own meaning (Python's ``re.fullmatch`` for a
regex, the ``lark`` package's Earley parser for a Lark grammar)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import lark
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tokenwire.gateway.ir import GenerationRequest, PromptText, ToolSpec
from tokenwire.gateway.upstreams.embedded_tools import (
    GrammarCache,
    ToolRequestError,
    plan_tools,
)
from tokenwire.gateway.upstreams.escaped_gbnf import (
    MAX_DEFINITION_CHARS,
    CheckedGrammar,
    check_format,
    format_rules,
    json_escape,
)
from tokenwire.gateway.upstreams.grammar_ir import (
    Alt,
    Chars,
    GrammarTooLarge,
    Node,
    Ref,
    Repeat,
    Seq,
    Text,
    UnsupportedGrammar,
)
from tokenwire.gateway.upstreams.json_schema_grammar import call_grammar
from tokenwire.gateway.upstreams.lark_syntax import is_terminal

from .gbnf_oracle import GbnfOracle

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "codex" / "apply_patch_tool.json"
#: Codex 0.171.0's apply_patch tool, as its request sends it (tests/fixtures/README.md).
APPLY_PATCH = json.loads(FIXTURE.read_text())
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def oracle() -> GbnfOracle:
    return GbnfOracle()


def lark_format(definition: str) -> dict:
    return {"type": "grammar", "syntax": "lark", "definition": definition}


def regex_format(pattern: str) -> dict:
    return {"type": "grammar", "syntax": "regex", "definition": pattern}


def input_grammar(fmt: dict) -> str:
    """GBNF whose root is the input as one JSON string (quotes included)."""
    root, rules = format_rules(check_format(fmt), "t0")
    return "\n".join([f'root ::= "\\"" {root} "\\""', *(f"{n} ::= {b}" for n, b in rules)])


def quoted(text: str) -> str:
    return '"' + json_escape(text) + '"'


# -- JSON escaping ------------------------------------------------------------------------


@given(st.text(st.characters(exclude_categories=["Cs"])))
def test_each_character_has_one_spelling_json_dumps_own(text) -> None:
    assert json.loads(quoted(text)) == text
    assert json_escape(text) == json.dumps(text, ensure_ascii=False)[1:-1].replace(
        "\x7f", "\\u007f")  # DEL escaped, as the schemas' strings have it


def test_other_spellings_of_a_character_are_refused(oracle) -> None:
    grammar = input_grammar(regex_format(r"[\s\S]*"))  # any text at all
    assert oracle.accepts(grammar, quoted('a/b "q" \\ \t\n\x01\x7f é'))
    for other in (r'"a\/b"', r'"\u0041"', '"\t"', '"\x01"', r'"\u000a"', r'"\U0041"',
                  '"a"b"', r'"\x"'):
        assert not oracle.accepts(grammar, other), other


# -- regexes against Python's re ------------------------------------------------------------

_ATOMS = ["a", "b", '"', r"\\", r"\n", r"\t", ".", "[^a]", '[a-c"]', r"\d", r"\s", r"\W",
          r'[^\\"]', "é", r"\x01", r"\x7f", "/", r"\.", "[\\x00-\\x1f]"]
_QUANTIFIERS = ["", "", "?", "*", "+", "{2}", "{1,2}", "{0,3}?"]
_ALPHABET = 'ab"\\\n\t é\x01\x7f/0.\r'


def _regexes() -> st.SearchStrategy[str]:
    atom = st.sampled_from(_ATOMS)
    return st.recursive(atom, lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=3).map("".join),
        st.tuples(inner, inner).map(lambda p: f"{p[0]}|{p[1]}"),
        st.tuples(inner, st.sampled_from(_QUANTIFIERS)).map(lambda p: f"({p[0]}){p[1]}"),
    ), max_leaves=6)


@SETTINGS
@given(st.data())
def test_a_regex_format_accepts_exactly_what_re_fullmatch_matches(oracle, data) -> None:
    pattern = data.draw(_regexes())
    try:
        grammar = input_grammar(regex_format(pattern))
    except UnsupportedGrammar as exc:  # (x*)*: refused, not looped on
        assume("empty" not in str(exc))
        raise
    text = data.draw(st.one_of(st.from_regex(pattern, fullmatch=True),
                               st.text(_ALPHABET, max_size=6)))
    assume(oracle.representable(quoted(text)))
    assert oracle.accepts(grammar, quoted(text)) == bool(re.fullmatch(pattern, text)), (
        pattern, text, grammar)


def test_a_case_insensitive_regex_folds_as_re_does(oracle) -> None:
    grammar = input_grammar(lark_format('start: /[^k]x/i "Ab"i'))
    for text, ok in (("aXab", True), ("AxAB", True), ("kxab", False), ("Kxab", False),
                     ("\u212axab", False), ("éXaB", True)):  # U+212A KELVIN SIGN folds to k
        assert oracle.accepts(grammar, quoted(text)) == ok, text


# -- Lark grammars against lark ----------------------------------------------------------

CALCULATOR = r"""
start: expr
?expr: expr "+" term | expr "-" term | term
?term: NUMBER | "(" expr ")" | NAME -> var
NAME: /[a-z_]+/i
%import common.NUMBER
%import common.WS
%ignore WS
"""
SELECT = r"""
start: "SELECT"i _SP cols _SP "from"i _SP NAME [";"]
cols: NAME ("," " "? NAME) ~ 0..3
_SP: " "+
NAME: /[A-Za-z_][A-Za-z0-9_]*/
"""
QUOTING = r"""
start: item+
item: ESCAPED_STRING "\n" | "q\"\\" | /[^a-z\n]{1,3}/ "\t" | "x".."z" ~ 2
%import common.ESCAPED_STRING
"""


def _sentence(rules, node: Node, draw, depth: int = 0) -> str:
    """A random sentence of ``node`` (deep down, the options that use no rule)."""
    match node:
        case Text(text):
            return text
        case Chars(ranges):
            lo, hi = draw(st.sampled_from(ranges))
            return chr(draw(st.integers(lo, min(hi, lo + 300))))
        case Ref(name):
            return _sentence(rules, rules[name], draw, depth + 1)
        case Seq(items):
            return "".join(_sentence(rules, i, draw, depth) for i in items)
        case Alt(items):
            options = [o for o in items if depth < 12 or not _uses_rules(o)] or list(items)
            return _sentence(rules, draw(st.sampled_from(options)), draw, depth)
        case Repeat(item, low, high):
            most = low if depth >= 12 else (high if high is not None else low + 2)
            count = draw(st.integers(low, max(low, min(most, low + 3))))
            return "".join(_sentence(rules, item, draw, depth) for _ in range(count))
    raise AssertionError(node)


def _uses_rules(node: Node) -> bool:
    match node:
        case Ref(name):
            return not is_terminal(name)
        case Seq(items) | Alt(items):
            return any(_uses_rules(i) for i in items)
        case Repeat(item, _, _):
            return _uses_rules(item)
    return False


#: Lark refuses a terminal that matches the empty string (every parser and lexer), and
#: Codex's grammar has ``/(.*)/``: the oracle reads it as ``/(.+)/?``, the same strings.
ORACLE_APPLY_PATCH = APPLY_PATCH["format"]["definition"].replace("/(.*)/", "/(.+)/?")


@SETTINGS
@pytest.mark.parametrize("name", ["apply_patch", "calculator", "select", "quoting"])
@given(data=st.data())
def test_random_sentences_parse_in_lark_and_match_the_gbnf(oracle, name, data) -> None:
    definition = {"apply_patch": APPLY_PATCH["format"]["definition"], "calculator": CALCULATOR,
                  "select": SELECT, "quoting": QUOTING}[name]
    checked = check_format(lark_format(definition))
    assert isinstance(checked, CheckedGrammar)
    sentence = _sentence(checked.rules, checked.rules["start"], data.draw)
    assume(len(sentence) < 200 and oracle.representable(quoted(sentence)))
    oracle_text = ORACLE_APPLY_PATCH if name == "apply_patch" else definition
    parser = lark.Lark(oracle_text, parser="earley", lexer="dynamic_complete")
    parser.parse(sentence)  # what is generated is a sentence of the grammar
    assert oracle.accepts(input_grammar(lark_format(definition)), quoted(sentence))


def test_what_lark_refuses_the_gbnf_refuses(oracle) -> None:
    patch = input_grammar(APPLY_PATCH["format"])
    good = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch"
    assert oracle.accepts(patch, quoted(good))
    for bad in (good.replace("+hi\n", ""), good.replace("*** End Patch", ""),
                good.replace("Add", "add"), "*** Begin Patch\n*** End Patch\n"):
        with pytest.raises(lark.exceptions.LarkError):
            lark.Lark(ORACLE_APPLY_PATCH).parse(bad)
        assert not oracle.accepts(patch, quoted(bad)), bad
    calc = input_grammar(lark_format(CALCULATOR))
    assert oracle.accepts(calc, quoted(" 1 + (x -2.5e3)"))
    assert not oracle.accepts(calc, quoted("1 + + 2"))


# -- the call grammar, the plan and its 400s ---------------------------------------------


def _request(*tools: ToolSpec, choice=None) -> GenerationRequest:
    return GenerationRequest(model="m", prompt=PromptText(text="hi"), tools=tools,
                             tool_choice=choice)


def _custom(fmt: dict | None, name: str = "apply_patch") -> ToolSpec:
    return ToolSpec(name=name, kind="custom", format=fmt)


def test_a_call_to_apply_patch_carries_a_patch(oracle) -> None:
    grammar = call_grammar([_custom(APPLY_PATCH["format"]), _custom(None, "free")])
    patch = '*** Begin Patch\n*** Update File: "a".py\n@@ def f():\n-\tx\n+ y\\n\n*** End Patch\n'
    call = {"name": "apply_patch", "arguments": patch}
    assert oracle.accepts(grammar, f"<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n"
                                   "</tool_call>")
    free = {"name": "free", "arguments": "anything"}  # a text format stays free
    assert oracle.accepts(grammar, f"<tool_call>\n{json.dumps(free)}\n</tool_call>")
    wrong = {"name": "apply_patch", "arguments": "anything"}
    assert not oracle.accepts(grammar, f"<tool_call>\n{json.dumps(wrong)}\n</tool_call>")


def test_the_grammar_is_built_once_and_keyed_by_its_format(oracle) -> None:
    built = []
    cache = GrammarCache(lambda text: built.append(text) or oracle.parses(text))
    for _ in range(3):
        plan = plan_tools(_request(_custom(APPLY_PATCH["format"]), choice="required"), cache)
    assert len(built) == 1 and "Begin Patch" in (plan.grammar or "")
    other = lark_format('start: "x"')
    plan = plan_tools(_request(_custom(other), choice="required"), cache)
    assert len(built) == 2 and "Begin Patch" not in (plan.grammar or "")
    text = {"type": "text"}  # free text: the JSON string grammar of before
    plan = plan_tools(_request(_custom(text), choice="required"), cache)
    assert "freeform-string" in (plan.grammar or "")


@pytest.mark.parametrize(("fmt", "named"), [
    ({"type": "json"}, "format type 'json'"),
    ({"type": "grammar", "syntax": "ebnf", "definition": "x"}, "grammar syntax 'ebnf'"),
    ({"type": "grammar", "syntax": "lark"}, "'definition'"),
    (lark_format('start: x{"a"}\nx{p}: p'), "template"),
    (lark_format('start: "a"\n%declare B'), "%declare"),
    (lark_format('start: "a"\n%import python.NAME'), "%import python.NAME"),
    (lark_format('start: "a"\n%import common.NOPE'), "common.NOPE"),
    (lark_format('start: A\nA: /(?=a)a/'), "'(?='"),
    (lark_format(r'start: A' + "\n" + r'A: /(a)\1/'), r"'\1'"),
    (lark_format(r'start: A' + "\n" + r'A: /a\b/'), r"'\b'"),
    (lark_format('start: A\nA: /a++/'), "possessive"),
    (lark_format('start: A\nA: /^a/'), "anchor"),
    (lark_format('start: /a/x'), "flag 'x'"),
    (lark_format('start: b'), "b"),
    (lark_format('start: "a"\n%ignore WS'), "WS in %ignore"),  # (was a KeyError: a 503)
    (lark_format('start: A\nA: b\nb: "x"'), "rule b"),
    (lark_format('start: A\nA: "x" A?'), "terminal A"),
    (lark_format('start: a\na: b "x" | "y"\nb: a'), "left recursion"),
    (lark_format('start: ("a"?)*'), "'*' or '+'"),
    (lark_format('start: "a" start'), "no finite sentence"),
    (lark_format('rule: "a"'), "without 'start'"),
    (lark_format('start: "a" ~ 0..2000'), "leaves 2000 open"),
    (lark_format('start: ("a" ~ 1000) ~ 1000'), "1000001 copies"),
    (regex_format("a{0,5000}"), "leaves 5000 open"),
    (lark_format("start: " + "(" * 200 + '"a"' + ")" * 200), "nesting"),
    (regex_format("(" * 200 + "a" + ")" * 200), "nesting"),
    (lark_format('start: "a"\n' + "x" * MAX_DEFINITION_CHARS), "characters"),
    (lark_format("start: " + " ".join(f"/[\\x00-\\U{0x10FFFF - i:08X}]/i"
                                       for i in range(400))), "case-insensitive"),
    (lark_format("start: " + " ".join(f"/[\\w\\u{0x2000 + i:04X}]/" for i in range(200))),
     "GBNF"),  # 200 distinct classes of ~10 KB each
])
def test_a_format_outside_the_subset_is_refused_naming_it(fmt, named) -> None:
    with pytest.raises(UnsupportedGrammar) as err:
        check_format(fmt)
    assert named in str(err.value)
    with pytest.raises(ToolRequestError) as err:
        plan_tools(_request(_custom(None, "free"), _custom(fmt)), GrammarCache(bool))
    assert err.value.param == "tools[1].format" and named in str(err.value)


def test_grammar_and_schema_repeats_share_one_budget() -> None:
    schema = ToolSpec(name="f", parameters={"type": "object", "properties": {"s": {
        "type": "string", "minLength": 60_000, "maxLength": 60_000}}})
    grammar = _custom(lark_format('start: ("a" ~ 1000) ~ 50'))
    with pytest.raises(ToolRequestError) as err:
        plan_tools(_request(schema, grammar), GrammarCache(bool))
    assert err.value.param == "tools"
    assert isinstance(check_format(grammar.format), CheckedGrammar)  # alone it is fine


def test_left_recursion_on_the_rule_itself_is_rewritten(oracle) -> None:
    checked = check_format(lark_format(CALCULATOR))
    assert isinstance(checked, CheckedGrammar)
    expr = checked.rules["expr"]
    assert isinstance(expr, Seq) and isinstance(expr.items[1], Repeat)
    assert isinstance(expr.items[1].item, Alt)


def test_too_large_is_a_kind_of_unsupported() -> None:
    assert issubclass(GrammarTooLarge, UnsupportedGrammar)


def test_checking_a_chain_of_rules_grows_linearly_with_its_length() -> None:
    """The nullable / productive analyses swept every rule until nothing changed: one sweep
    per link of ``r0: r1``, ``r1: r2``..., so a 60 KB chain of 4,000 rules was ~6 s of Python
    (on the event loop, then). Counted in lines run, not timed."""
    from tests.interpreter_work import lines_run
    from tokenwire.gateway.upstreams import escaped_gbnf

    def chain(n: int) -> str:
        return ("start: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(n))
                + f'r{n}: "x"\n')

    def work(n: int) -> int:
        escaped_gbnf._checked.cache_clear()
        return lines_run(escaped_gbnf.check_format,
                         {"type": "grammar", "syntax": "lark", "definition": chain(n)})

    assert work(800) < 2.5 * work(400)  # linear: ~2x; the sweeps made it ~4x
