"""The ``<tool_call>`` scanner and the auto-mode restart point (sans-IO, no model)."""

from __future__ import annotations

import json

import pytest

from tokenwire.gateway.ir import TokenDelta, ToolCallDelta, ToolSpec
from tokenwire.gateway.upstreams.embedded_tools import ToolPlan, ToolTurn
from tokenwire.gateway.upstreams.tool_output import CallScanner, ParsedCall

TOOLS = (ToolSpec(name="get_weather", parameters={"type": "object"}),
         ToolSpec(name="apply_patch", kind="custom"))
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def scan(text: str, *, step: int | None = None) -> list[str | ParsedCall]:
    scanner = CallScanner(TOOLS)
    out: list[str | ParsedCall] = []
    pieces = [text] if step is None else [text[i:i + step] for i in range(0, len(text), step)]
    for piece in pieces:
        out += scanner.feed(piece)
    return _join(out + scanner.flush())


def _join(items: list[str | ParsedCall]) -> list[str | ParsedCall]:
    out: list[str | ParsedCall] = []
    for item in items:
        if isinstance(item, str) and out and isinstance(out[-1], str):
            out[-1] += item
        else:
            out.append(item)
    return out


@pytest.mark.parametrize("step", [None, 1, 3])
def test_a_well_formed_call_is_parsed_however_the_text_arrives(step) -> None:
    assert scan("Sure. " + CALL + "\n", step=step) == [
        "Sure. ", ParsedCall("get_weather", json.dumps({"city": "Paris"}))]


@pytest.mark.parametrize("text", [
    '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',  # not a declared tool
    '<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>',  # not an object
    '<tool_call>{"name": "get_weather"}</tool_call>',  # no arguments
    '<tool_call>{"name": "get_weather", "arguments": {}, "x": 1}</tool_call>',
    '<tool_call>{"name": "get_weather", "argu',  # cut off by max_tokens
    "<tool_call>not json</tool_call>",
])
def test_anything_malformed_comes_back_as_its_text(text) -> None:
    assert scan(text) == [text]


def test_custom_tools_take_a_string() -> None:
    text = '<tool_call>{"name": "apply_patch", "arguments": "*** Begin"}</tool_call>'
    assert scan(text) == [ParsedCall("apply_patch", "*** Begin", "custom")]


def test_only_a_possible_tag_prefix_is_held_back() -> None:
    scanner = CallScanner(TOOLS)
    assert scanner.feed("a < b and <tool") == ["a < b and "]
    assert scanner.feed("box>") == ["<toolbox>"]


def test_whitespace_between_and_after_calls_is_dropped() -> None:
    assert scan(CALL + "\n" + CALL + "\n\n") == [ParsedCall(
        "get_weather", '{"city": "Paris"}')] * 2


def test_a_started_call_restarts_from_the_last_whole_token_before_the_tag() -> None:
    turn = ToolTurn(ToolPlan(callable_tools=TOOLS, tail_grammar="root ::= x"))
    shown = []
    for tok, piece in enumerate(["Hello", " there.", "\n<", "tool", "_call", ">{\""]):
        shown += turn.feed(tok, piece)
        if turn.restart is not None:
            break
    assert turn.restart is not None and turn.constrained
    # Tokens 0 and 1 are kept; "\n" (shown) and the tag are sent again as prompt text.
    assert (turn.restart.kept, turn.restart.text) == (2, "\n<tool_call>")
    assert "".join(e.text for e in shown if isinstance(e, TokenDelta)) == "Hello there.\n"
    # The regenerated call, after the tag, is parsed as usual.
    events = turn.feed(10, '\n{"name": "get_weather", "arguments": {}}\n</tool_call>')
    assert [type(e) for e in events] == [ToolCallDelta]
    assert turn.calls == 1 and events[0].arguments == "{}"


def test_a_repeated_identical_call_ends_the_answer() -> None:
    turn = ToolTurn(ToolPlan(callable_tools=TOOLS, grammar="root ::= x"))
    events = turn.feed(0, CALL + "\n" + CALL)
    assert [type(e) for e in events] == [ToolCallDelta] and turn.repeated
