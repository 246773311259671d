"""ToolWatcher: the cross-language event contract (codec-spec §3.6) and its state table."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import CODEC_FIXTURES
from tokenwire.codec.maps import load_map_bytes
from tokenwire.codec.tool_watcher import (
    _TRANSITIONS,
    KNOWN_MARKERS,
    EventKind,
    Input,
    State,
    ToolWatcher,
    WatcherEvent,
)
from tokenwire.errors import LocalProtocolError, MapValidationError

FIXTURE = json.loads(
    (CODEC_FIXTURES / "tool-watcher" / "tool-watcher-events.json").read_text("utf-8")
)
START, END = FIXTURE["start_id"], FIXTURE["end_id"]


def _as_json(events: list[WatcherEvent]) -> list[dict[str, Any]]:
    out = []
    for ev in events:
        item: dict[str, Any] = {"kind": ev.kind.value, "ids": list(ev.ids)}
        if ev.kind is EventKind.TRUNCATED:
            item["finish_reason"] = ev.finish_reason
        out.append(item)
    return out


def _run(feeds: list[list[int]], cap: int | None, end: dict[str, Any] | None) -> list[WatcherEvent]:
    watcher = ToolWatcher(START, END, region_cap=cap)
    events = [ev for ids in feeds for ev in watcher.feed(ids)]
    if end is not None:
        events += watcher.end(end["finish_reason"])
    return events


def test_fixture_has_the_fifteen_cases() -> None:
    assert len(FIXTURE["cases"]) == 15


@pytest.mark.parametrize("case", FIXTURE["cases"], ids=lambda c: c["name"])
def test_events_match_the_conformance_fixture_exactly(case: dict[str, Any]) -> None:
    events = _run(case["feeds"], case["region_cap"], case["end"])
    assert _as_json(events) == case["events"]


def test_events_are_frozen_values() -> None:
    (ev,) = ToolWatcher(START, END).feed([1, 2])
    assert ev == WatcherEvent(EventKind.PASSTHROUGH, (1, 2))
    with pytest.raises(AttributeError):
        ev.ids = ()  # type: ignore[misc]
    assert ev.kind == "passthrough"  # StrEnum: compares equal to the wire word


# --- the transition table ---------------------------------------------------------


def _watcher_in(state: State) -> ToolWatcher:
    w = ToolWatcher(START, END, region_cap=1)
    if state is State.INSIDE:
        w.feed([START])
    elif state is State.OVERFLOWED:
        w.feed([START, 1, 2])
    elif state is State.ENDED:
        w.end()
    elif state is State.ERROR:
        w.end()
        with pytest.raises(LocalProtocolError):
            w.feed([1])
    assert w.state is state
    return w


@pytest.mark.parametrize("state", list(State), ids=lambda s: s.name)
@pytest.mark.parametrize("inp", list(Input), ids=lambda i: i.name)
def test_every_state_input_pair_follows_the_table(state: State, inp: Input) -> None:
    w = _watcher_in(state)
    key = (state, inp)
    if key in _TRANSITIONS:
        w._step(inp)
        assert w.state is _TRANSITIONS[key][0]
    else:
        with pytest.raises(LocalProtocolError) as info:
            w._step(inp)
        assert inp.name in str(info.value) and state.name in str(info.value)
        assert w.state is State.ERROR


def test_id_over_cap_is_only_produced_inside_a_full_region() -> None:
    w = ToolWatcher(START, END, region_cap=1)
    assert w._classify(5) is Input.ID
    w.feed([START, 5])
    assert w._classify(6) is Input.ID_OVER_CAP
    assert w._classify(END) is Input.END


def test_feed_after_end_is_illegal_and_error_is_permanent() -> None:
    w = ToolWatcher(START, END)
    w.feed([1])
    assert w.end("stop") == []
    for attempt in ([2], [], [START]):
        with pytest.raises(LocalProtocolError):
            w.feed(attempt)
    assert w.state is State.ERROR
    with pytest.raises(LocalProtocolError):
        w.end()
    with pytest.raises(LocalProtocolError):
        w.feed([1])


def test_end_twice_is_illegal() -> None:
    w = ToolWatcher(START, END)
    w.end()
    with pytest.raises(LocalProtocolError, match="EOS not allowed in state ENDED"):
        w.end()


def test_markers_must_differ_and_cap_must_not_be_negative() -> None:
    with pytest.raises(LocalProtocolError):
        ToolWatcher(7, 7)
    with pytest.raises(LocalProtocolError):
        ToolWatcher(1, 2, region_cap=-1)


def test_nested_start_inside_an_overflowed_region_is_still_observable() -> None:
    events = ToolWatcher(START, END, region_cap=1).feed([START, 1, 2, START, 3, END, 4])
    assert _as_json(events) == [
        {"kind": "overflow", "ids": [1]},
        {"kind": "nested_start", "ids": [START]},
        {"kind": "passthrough", "ids": [4]},
    ]


def test_zero_cap_overflows_on_the_first_body_id() -> None:
    events = ToolWatcher(START, END, region_cap=0).feed([START, END, START, 1, END])
    assert _as_json(events) == [{"kind": "region", "ids": []}, {"kind": "overflow", "ids": []}]


# --- chunking does not matter -------------------------------------------------------


def _merge_passthrough(events: list[WatcherEvent]) -> list[WatcherEvent]:
    """A feed reports its passthrough ids as one event, so a split feed may split one
    passthrough event; every other event is atomic (fixture case region_split_across_feeds)."""
    out: list[WatcherEvent] = []
    for ev in events:
        if out and ev.kind is EventKind.PASSTHROUGH and out[-1].kind is EventKind.PASSTHROUGH:
            out[-1] = WatcherEvent(EventKind.PASSTHROUGH, out[-1].ids + ev.ids)
        else:
            out.append(ev)
    return out


_ids = st.lists(st.sampled_from([START, END, 0, 1, 2, 3, 4]), max_size=40)


@settings(max_examples=200, deadline=None)
@given(
    ids=_ids,
    cuts=st.lists(st.integers(0, 40), max_size=8),
    cap=st.none() | st.integers(0, 4),
    finish=st.none() | st.sampled_from(["stop", "length"]),
)
def test_any_split_of_a_feed_gives_the_same_events(
    ids: list[int], cuts: list[int], cap: int | None, finish: str | None
) -> None:
    whole = _run([ids], cap, {"finish_reason": finish})
    bounds = sorted({0, len(ids), *(c for c in cuts if c <= len(ids))})
    chunks = [ids[a:b] for a, b in itertools.pairwise(bounds)]
    split = _run(chunks, cap, {"finish_reason": finish})
    assert _merge_passthrough(split) == _merge_passthrough(whole)
    one_by_one = _run([[i] for i in ids], cap, {"finish_reason": finish})
    assert _merge_passthrough(one_by_one) == _merge_passthrough(whole)


@settings(max_examples=200, deadline=None)
@given(ids=_ids)
def test_every_id_is_accounted_for_exactly_once(ids: list[int]) -> None:
    """Without a cap, passthrough + markers + region bodies + truncated body = the input."""
    events = _run([ids], None, {"finish_reason": None})
    seen = sum(len(ev.ids) for ev in events if ev.kind is not EventKind.NESTED_START)
    nested = sum(1 for ev in events if ev.kind is EventKind.NESTED_START)
    regions = sum(1 for ev in events if ev.kind is EventKind.REGION)
    opened = regions + sum(1 for ev in events if ev.kind is EventKind.TRUNCATED)
    assert seen + nested + opened + regions == len(ids)


# --- markers from maps ----------------------------------------------------------------


def _map(**extra: Any) -> Any:
    doc = {
        "id": "test/tools",
        "version": "2",
        "vocab_size": 4,
        "vocab": {"a": 0, "<tool_call>": 1, "</tool_call>": 2, "<think>": 3, "</think>": 4},
        "special_tokens": {"<tool_call>": 1, "</tool_call>": 2, "<think>": 3, "</think>": 4},
        **extra,
    }
    return load_map_bytes(json.dumps(doc).encode())


def test_from_map_uses_the_tool_calling_block() -> None:
    block = {"convention": "deepseek_r1", "markers": {"start": "<think>", "end": "</think>"}}
    w = ToolWatcher.from_map(_map(tool_calling=block), region_cap=9)
    assert (w.start_id, w.end_id) == (3, 4)
    assert _as_json(w.feed([0, 3, 0, 4])) == [
        {"kind": "passthrough", "ids": [0]},
        {"kind": "region", "ids": [0]},
    ]


def test_from_map_without_block_uses_the_known_marker_table() -> None:
    w = ToolWatcher.from_map(_map())
    assert (w.start_id, w.end_id) == (1, 2)  # qwen25 comes before deepseek_r1
    w = ToolWatcher.from_map(_map(), convention="deepseek_r1")
    assert (w.start_id, w.end_id) == (3, 4)


def test_from_map_without_any_marker_pair_is_an_error() -> None:
    doc = {"id": "test/plain", "version": "2", "vocab_size": 1, "vocab": {"a": 0}}
    with pytest.raises(MapValidationError):
        ToolWatcher.from_map(load_map_bytes(json.dumps(doc).encode()))
    with pytest.raises(MapValidationError):
        ToolWatcher.from_map(_map(), convention="nope")


def test_known_markers_follow_the_spec_prose_table() -> None:
    assert KNOWN_MARKERS["llama3"] == ("<|python_tag|>", "<|eom_id|>")
    assert KNOWN_MARKERS["phi4"] == ("<|tool|>", "<|/tool|>")
    assert KNOWN_MARKERS["mistral_nemo"] == ("[TOOL_CALLS]", "[/TOOL_CALLS]")
    assert KNOWN_MARKERS["deepseek_v3"] == ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")
