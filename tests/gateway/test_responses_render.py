"""The Responses renderer without a server: golden event sequences, one test per rule
(gateway-research §5.1-§5.6, the seed's "Streaming" and "Provider failures" sections)."""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenwire.gateway.apis.responses_render import (
    ResponsesRenderer,
    failure_code,
    failure_error_body,
    new_response_id,
    unwrap_encrypted,
    wrap_encrypted,
)
from tokenwire.gateway.ir import (
    Event,
    Failure,
    FailureClass,
    Finish,
    FinishKind,
    ReasoningDelta,
    TokenDelta,
    ToolCallDelta,
    Usage,
    UsageSource,
)

TERMINALS = {"response.completed", "response.incomplete", "response.failed"}
_EVENT = re.compile(rb"event: ([^\n]+)\ndata: ([^\n]+)\n\n")


def parse(raw: bytes) -> list[dict[str, Any]]:
    """Split SSE bytes into data objects, checking each event name equals its type."""
    events, pos = [], 0
    for m in _EVENT.finditer(raw):
        assert m.start() == pos, f"junk between events: {raw[pos:m.start()]!r}"
        data = json.loads(m.group(2))
        assert data["type"] == m.group(1).decode()
        events.append(data)
        pos = m.end()
    assert pos == len(raw)
    return events


def render(events: list[Event], **kw: Any) -> list[dict[str, Any]]:
    r = renderer(**kw)
    out = r.created_events()
    for ev in events:
        out += r.on_event(ev)
    return parse(b"".join(out))


def renderer(**kw: Any) -> ResponsesRenderer:
    args: dict[str, Any] = {"response_id": "resp_" + "a" * 32, "model": "m",
                            "created_at": 1, "stream": True}
    return ResponsesRenderer(**{**args, **kw})


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"].removeprefix("response.") for e in events]


def fc(index: int, id: str | None = None, name: str | None = None, args: str = "",
       kind: str = "function") -> ToolCallDelta:
    return ToolCallDelta(index=index, id=id, name=name, arguments=args, kind=kind)


USAGE = Usage(prompt_tokens=5, completion_tokens=3)
EOS = Finish(reason=FinishKind.EOS)
TEXT = [TokenDelta(text="Hel"), TokenDelta(text="lo"), USAGE, EOS]


def test_every_event_is_named_after_its_type_and_no_done_sentinel() -> None:
    r = renderer()
    raw = b"".join(r.created_events() + [b for ev in TEXT for b in r.on_event(ev)])
    assert b"[DONE]" not in raw
    parse(raw)  # checks event name == type, nothing else on the wire


def test_sequence_numbers_start_at_zero_and_rise_by_one_heartbeats_included() -> None:
    r = renderer()
    out = r.created_events() + r.heartbeat() + r.on_event(TokenDelta(text="a"))
    out += r.heartbeat() + r.on_event(EOS)
    seqs = [e["sequence_number"] for e in parse(b"".join(out))]
    assert seqs == list(range(len(seqs)))


def test_created_and_in_progress_open_the_stream_before_any_upstream_event() -> None:
    r = renderer()
    events = parse(b"".join(r.created_events()))
    assert types(events) == ["created", "in_progress"]
    assert all(e["response"]["id"] == r.response_id for e in events)
    assert events[0]["response"]["status"] == "in_progress"
    assert r.created_events() == []  # once only


def test_heartbeat_is_a_genuine_in_progress_data_event_with_the_same_identity() -> None:
    r = renderer()
    r.created_events()
    [beat] = parse(b"".join(r.heartbeat()))
    assert beat["type"] == "response.in_progress"
    assert beat["response"]["id"] == r.response_id and beat["response"]["output"] == []
    r.on_event(EOS)
    assert r.heartbeat() == []  # heartbeats stop on completion


def test_text_answer_has_the_full_item_lifecycle() -> None:
    events = render(TEXT)
    assert types(events) == [
        "created", "in_progress", "output_item.added", "content_part.added",
        "output_text.delta", "output_text.delta", "output_text.done", "content_part.done",
        "output_item.done", "completed"]
    added, part = events[2], events[3]
    assert added["item"] == {"type": "message", "id": added["item"]["id"],
                             "status": "in_progress", "role": "assistant", "content": []}
    assert part["part"]["text"] == "" and part["content_index"] == 0
    assert events[4]["logprobs"] == [] and events[4]["delta"] == "Hel"
    assert events[6]["text"] == "Hello" and events[7]["part"]["text"] == "Hello"
    done = events[8]["item"]
    assert done["status"] == "completed" and done["content"][0]["text"] == "Hello"
    assert events[9]["response"]["output"] == [done]


def test_item_ids_and_output_indices_are_tokenwire_s_own() -> None:
    events = render([ReasoningDelta(text="t"), TokenDelta(text="a"),
                     fc(0, "up-1", "f", "{}"), EOS])
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [e["output_index"] for e in added] == [0, 1, 2]
    ids = [e["item"]["id"] for e in added]
    assert [i.split("_")[0] for i in ids] == ["rs", "msg", "fc"]
    assert all(re.fullmatch(r"[a-z]+_[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == 3


def test_response_id_is_resp_and_32_hex() -> None:
    assert re.fullmatch(r"resp_[0-9a-f]{32}", new_response_id())


def test_function_call_keeps_the_upstream_call_id_exactly() -> None:
    events = render([fc(0, "call_Upstream-ID.1", "get_weather", '{"ci'),
                     fc(0, args='ty":"Paris"}'), EOS])
    assert types(events)[2:] == ["output_item.added", "function_call_arguments.delta",
                                 "function_call_arguments.delta",
                                 "function_call_arguments.done", "output_item.done",
                                 "completed"]
    added, done = events[2]["item"], events[-2]["item"]
    assert added["call_id"] == done["call_id"] == "call_Upstream-ID.1"
    assert added["id"].startswith("fc_") and added["arguments"] == ""
    assert events[5]["arguments"] == done["arguments"] == '{"city":"Paris"}'
    assert done["status"] == "completed" and done["name"] == "get_weather"


def test_function_call_without_an_upstream_id_gets_call_and_hex() -> None:
    events = render([fc(0, None, "f", "{}"), EOS])
    assert re.fullmatch(r"call_[0-9a-f]{32}", events[2]["item"]["call_id"])


def test_a_call_is_announced_only_once_its_name_is_known() -> None:
    events = render([fc(0, "c1", None, '{"a"'), fc(0, None, "f", ":1}"), EOS])
    assert events[2]["item"]["name"] == "f"
    assert events[-2]["item"]["arguments"] == '{"a":1}'


def test_custom_tool_call_streams_its_input() -> None:
    patch = "*** Begin Patch\n*** End Patch"
    events = render([fc(0, "call_p", "apply_patch", patch[:9], "custom"),
                     fc(0, args=patch[9:], kind="custom"), EOS])
    assert types(events)[2:] == ["output_item.added", "custom_tool_call_input.delta",
                                 "custom_tool_call_input.delta", "custom_tool_call_input.done",
                                 "output_item.done", "completed"]
    item = events[-2]["item"]
    assert item["type"] == "custom_tool_call" and item["id"].startswith("ctc_")
    assert item["input"] == events[5]["input"] == patch and item["call_id"] == "call_p"


def test_reasoning_becomes_a_summary_part_before_the_answer() -> None:
    events = render([ReasoningDelta(text="Let me "), ReasoningDelta(text="think."),
                     TokenDelta(text="42"), EOS])
    assert types(events)[2:9] == [
        "output_item.added", "reasoning_summary_part.added", "reasoning_summary_text.delta",
        "reasoning_summary_text.delta", "reasoning_summary_text.done",
        "reasoning_summary_part.done", "output_item.done"]
    assert events[2]["item"] == {"type": "reasoning", "id": events[2]["item"]["id"],
                                 "summary": []}
    assert events[6]["text"] == "Let me think."
    assert events[8]["item"]["summary"] == [{"type": "summary_text", "text": "Let me think."}]
    assert "encrypted_content" not in events[8]["item"]  # nothing invented
    assert types(events)[9:] == ["output_item.added", "content_part.added",
                                 "output_text.delta", "output_text.done",
                                 "content_part.done", "output_item.done", "completed"]


def test_reasoning_summary_none_hides_summary_events() -> None:
    events = render([ReasoningDelta(text="secret"), TokenDelta(text="hi"), EOS],
                    reasoning_summary="none")
    assert not any("reasoning" in e["type"] for e in events)
    assert all(i["type"] == "message" for i in events[-1]["response"]["output"])


def responses_blob(content: str) -> str:
    return msgspec.json.encode({"type": "reasoning", "summary": [],
                                "encrypted_content": content}).decode()


def test_encrypted_reasoning_from_a_responses_upstream_is_wrapped_with_its_name() -> None:
    events = render([ReasoningDelta(text="sum"),
                     ReasoningDelta(text="", encrypted=(("oa", responses_blob("gAAA")),)),
                     TokenDelta(text="x"), EOS])
    item = next(e["item"] for e in events if e["type"] == "response.output_item.done")
    assert unwrap_encrypted(item["encrypted_content"]) == ("oa", "gAAA")
    assert item["summary"][0]["text"] == "sum"


def test_encrypted_reasoning_survives_summary_none() -> None:
    events = render([ReasoningDelta(text="sum", encrypted=(("oa", responses_blob("E")),)),
                     EOS], reasoning_summary="none")
    [item] = events[-1]["response"]["output"]
    assert item["summary"] == []
    assert unwrap_encrypted(item["encrypted_content"]) == ("oa", "E")


def test_signed_thinking_from_other_upstreams_is_not_turned_into_encrypted_content() -> None:
    thinking = json.dumps({"type": "thinking", "thinking": "t", "signature": "sig"})
    events = render([ReasoningDelta(text="t", encrypted=(("claude", thinking),)), EOS])
    assert all("encrypted_content" not in i for i in events[-1]["response"]["output"])
    events = render([ReasoningDelta(text="", encrypted=(("claude", thinking),)), EOS])
    assert events[-1]["response"]["output"] == []  # no reasoning item out of nothing


def test_two_upstream_reasoning_items_stay_two_items() -> None:
    events = render([ReasoningDelta(text="", encrypted=(("oa", responses_blob("A")),)),
                     ReasoningDelta(text="", encrypted=(("oa", responses_blob("B")),)), EOS])
    states = [unwrap_encrypted(i["encrypted_content"]) for i in events[-1]["response"]["output"]]
    assert states == [("oa", "A"), ("oa", "B")]


@pytest.mark.parametrize("name", ["oa", "a.b:c", "ünï"])
def test_wrapped_encrypted_state_names_exactly_one_upstream(name: str) -> None:
    assert unwrap_encrypted(wrap_encrypted(name, "x.y")) == (name, "x.y")
    assert unwrap_encrypted("gAAAA-someone-elses") is None


def test_parallel_calls_are_separate_items_even_when_fragments_interleave() -> None:
    events = render([fc(0, "call_a", "f", '{"x"'), fc(1, "call_b", "g", '{"y"'),
                     fc(0, args=":1}"), fc(1, args=":2}"), Finish(reason=FinishKind.TOOL_CALLS)])
    final = events[-1]["response"]["output"]
    assert [(i["call_id"], i["name"], i["arguments"]) for i in final] == [
        ("call_a", "f", '{"x":1}'), ("call_b", "g", '{"y":2}')]
    deltas = [(e["output_index"], e["delta"]) for e in events
              if e["type"] == "response.function_call_arguments.delta"]
    assert deltas == [(0, '{"x"'), (1, '{"y"'), (0, ":1}"), (1, ":2}")]
    dones = [e["output_index"] for e in events if e["type"] == "response.output_item.done"]
    assert dones == [0, 1]


def test_text_and_tool_calls_in_one_response_are_both_kept() -> None:
    events = render([TokenDelta(text="Checking."), fc(0, "c1", "f", "{}"),
                     TokenDelta(text=" Done."), Finish(reason=FinishKind.TOOL_CALLS)])
    final = events[-1]["response"]["output"]
    assert [i["type"] for i in final] == ["message", "function_call", "message"]
    assert final[0]["content"][0]["text"] == "Checking."
    assert final[2]["content"][0]["text"] == " Done."
    assert final[1]["status"] == "completed"


def test_completed_usage_has_integer_counts_and_details() -> None:
    usage = render([TokenDelta(text="Hi"),
                    Usage(prompt_tokens=5, completion_tokens=3, cached_tokens=2,
                          reasoning_tokens=1, source=UsageSource.ENGINE), EOS]
                   )[-1]["response"]["usage"]
    assert usage == {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 2},
                     "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 1},
                     "total_tokens": 8, "tokenwire_source": "engine"}


def test_details_an_upstream_did_not_report_are_null_never_zero() -> None:
    usage = render(TEXT)[-1]["response"]["usage"]
    assert usage == {"input_tokens": 5, "input_tokens_details": None,
                     "output_tokens": 3, "output_tokens_details": None,
                     "total_tokens": 8, "tokenwire_source": "upstream"}


def test_length_ends_incomplete_with_max_output_tokens() -> None:
    events = render([TokenDelta(text="cut"), Finish(reason=FinishKind.LENGTH)])
    last = events[-1]
    assert last["type"] == "response.incomplete"
    assert last["response"]["status"] == "incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["output"][0]["status"] == "incomplete"


@pytest.mark.parametrize("kind", [FinishKind.CONTENT_FILTER, FinishKind.POLICY_VIOLATION])
def test_filtered_answers_end_incomplete_with_content_filter(kind: FinishKind) -> None:
    last = render([TokenDelta(text="a"), Finish(reason=kind)])[-1]
    assert last["response"]["incomplete_details"] == {"reason": "content_filter"}


def test_an_unfinished_tool_call_is_never_presented_as_a_completed_call() -> None:
    events = render([TokenDelta(text="a"), fc(0, "c1", "shell", '{"cmd": "rm -'),
                     Finish(reason=FinishKind.LENGTH)])
    assert not any(e["type"] in ("response.function_call_arguments.done",)
                   or (e["type"] == "response.output_item.done"
                       and e["item"]["type"] == "function_call") for e in events)
    assert events[-1]["type"] == "response.incomplete"
    call = events[-1]["response"]["output"][-1]
    assert call["type"] == "function_call" and call["status"] == "incomplete"


def test_a_failure_mid_call_does_not_dispatch_the_call() -> None:
    events = render([fc(0, "c1", "f", "{"), Failure(failure_class=FailureClass.UPSTREAM,
                                                    message="boom", status=502)])
    assert [t for t in types(events) if t.endswith("done")] == []
    assert events[-1]["response"]["output"][0]["status"] == "incomplete"


_QUOTA = "Provider credits or quota are exhausted"


@pytest.mark.parametrize(("cls", "upstream_code", "code", "message"), [
    (FailureClass.CONTEXT_LENGTH, None, "context_length_exceeded", "m"),
    (FailureClass.INVALID_REQUEST, None, "invalid_prompt", "m"),
    (FailureClass.AUTHENTICATION, None, "invalid_prompt", "m"),
    # Seed: quota is final, with a fixed message (the upstream's prose is never shown).
    (FailureClass.QUOTA, None, "invalid_prompt", _QUOTA),
    (FailureClass.QUOTA, "usage_limit_reached", "invalid_prompt", "Provider usage limit reached"),
    (FailureClass.RATE_LIMITED, "insufficient_quota", "insufficient_quota", _QUOTA),
    (FailureClass.RATE_LIMITED, "rate_limit_exceeded", "rate_limit_exceeded", "m"),
    # An unnamed 429 without a short Retry-After is a final usage limit (seed).
    (FailureClass.RATE_LIMITED, None, "invalid_prompt", _QUOTA),
    # Seed: content_filter stays retryable; the policy refusals that repeat are final.
    (FailureClass.CONTENT_FILTER, None, "content_filter", "m"),
    (FailureClass.CONTENT_FILTER, "cyber_policy", "cyber_policy",
     "The provider refused this request under its cybersecurity policy."),
    (FailureClass.CONTENT_FILTER, "misalignment_policy_violation", "invalid_prompt",
     "The provider refused this request under its usage policy."),
    (FailureClass.CAPACITY, None, "server_is_overloaded", "m"),
    (FailureClass.UPSTREAM, None, "server_error", "m"),
    (FailureClass.CONNECTION, None, "server_error", "m"),
    (FailureClass.TIMEOUT, "idle_timeout", "idle_timeout", "m"),  # the gateway's own code
    (FailureClass.TIMEOUT, "read_timeout", "server_error", "m"),
    (FailureClass.INTERNAL, None, "server_error", "m"),
])
def test_failure_codes_follow_codex_s_classification(cls: FailureClass, upstream_code: str | None,
                                                     code: str, message: str) -> None:
    failure = Failure(failure_class=cls, message="m", status=400, code=upstream_code)
    events = render([failure])
    assert types(events) == ["created", "in_progress", "failed"]
    assert events[-1]["response"]["status"] == "failed"
    assert events[-1]["response"]["error"] == {"code": code, "message": message}
    assert failure_code(failure) == code


def test_rate_limit_failure_tells_codex_when_to_try_again() -> None:
    failure = Failure(failure_class=FailureClass.RATE_LIMITED, message="slow down",
                      status=429, retry_after=3)
    msg = render([failure])[-1]["response"]["error"]["message"]
    assert "try again in 3s" in msg


def test_no_top_level_error_key_so_the_sdk_reads_response_failed() -> None:
    # openai-python raises on any event with a truthy top-level "error" (§5.1).
    events = render([Failure(failure_class=FailureClass.UPSTREAM, message="x", status=502)])
    assert all("error" not in e for e in events)


def test_exactly_one_terminal_and_nothing_after_it() -> None:
    r = renderer()
    out = r.created_events() + r.on_event(EOS)
    assert r.on_event(TokenDelta(text="late")) == [] and r.on_event(EOS) == []
    assert r.on_error(RuntimeError()) == [] and r.heartbeat() == []
    assert [e["type"] for e in parse(b"".join(out))].count("response.completed") == 1


def test_an_error_after_the_head_is_response_failed_with_server_error() -> None:
    r = renderer()
    out = r.created_events() + r.on_event(TokenDelta(text="a")) + r.on_error(KeyError("x"))
    events = parse(b"".join(out))
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "server_error"
    assert events[-2]["item"]["status"] == "incomplete"  # the open message is closed


def test_end_turn_is_true_without_tool_calls_and_false_with_them() -> None:
    assert render(TEXT)[-1]["response"]["end_turn"] is True
    calls = render([fc(0, "c", "f", "{}"), Finish(reason=FinishKind.TOOL_CALLS)])
    assert calls[-1]["response"]["end_turn"] is False


def test_end_turn_is_omitted_when_the_upstream_s_own_value_is_not_known() -> None:
    assert "end_turn" not in render(TEXT, derive_end_turn=False)[-1]["response"]


def test_request_fields_are_echoed_in_the_response_object() -> None:
    resp = render(TEXT, echo={"instructions": "be brief", "max_output_tokens": 9})[-1]
    assert resp["response"]["instructions"] == "be brief"
    assert resp["response"]["max_output_tokens"] == 9


def test_non_streaming_answer_is_one_response_object() -> None:
    r = renderer(stream=False)
    assert r.created_events() == [] and r.heartbeat() == []
    chunks = [c for ev in [ReasoningDelta(text="r"), *TEXT] for c in r.on_event(ev)]
    [body] = chunks
    obj = json.loads(body)
    assert obj["object"] == "response" and obj["status"] == "completed"
    assert [i["type"] for i in obj["output"]] == ["reasoning", "message"]
    assert obj["output"][1]["content"][0]["text"] == "Hello"
    assert obj["usage"]["total_tokens"] == 8


def test_non_streaming_failure_is_an_http_error_with_openai_shape() -> None:
    status, body = failure_error_body(Failure(
        failure_class=FailureClass.CONTEXT_LENGTH, message="too long", status=400))
    assert status == 400
    assert json.loads(body) == {"error": {"message": "too long",
                                          "type": "invalid_request_error",
                                          "param": None,
                                          "code": "context_length_exceeded"}}
    status, _ = failure_error_body(Failure(failure_class=FailureClass.UPSTREAM,
                                           message="x", status=200))
    assert status == 500  # a non-error status from an upstream never reaches the client


# -- the property -----------------------------------------------------------------------------

_deltas = st.one_of(
    st.builds(TokenDelta, text=st.text(max_size=4)),
    st.builds(ReasoningDelta, text=st.text(max_size=4)),
    st.builds(ToolCallDelta, index=st.integers(0, 2),
              id=st.one_of(st.none(), st.sampled_from(["c0", "c1"])),
              name=st.one_of(st.none(), st.just("f")), arguments=st.text(max_size=3),
              kind=st.sampled_from(["function", "custom"])),
    st.builds(Usage, prompt_tokens=st.integers(0, 9), completion_tokens=st.integers(0, 9)),
)
_terminals = st.one_of(st.builds(Finish, reason=st.sampled_from(list(FinishKind))),
                       st.builds(Failure, failure_class=st.sampled_from(list(FailureClass)),
                                 message=st.just("m")))


@settings(max_examples=200, deadline=None)
@given(st.lists(_deltas, max_size=12), st.one_of(st.none(), _terminals),
       st.sampled_from(["auto", "none"]), st.integers(0, 3))
def test_any_event_sequence_numbers_from_zero_and_ends_with_one_terminal(
        deltas: list[Event], terminal: Event | None, summary: str, beats: int) -> None:
    r = renderer(reasoning_summary=summary)
    out = r.created_events()
    for i, ev in enumerate(deltas):
        out += r.on_event(ev)
        if i < beats:
            out += r.heartbeat()
    out += r.on_event(terminal) if terminal is not None else r.on_error(RuntimeError())
    events = parse(b"".join(out))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] in TERMINALS for e in events].count(True) == 1
    assert events[-1]["type"] in TERMINALS
    # every item event refers to an announced item; every announced index is unique
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    assert added == list(range(len(added)))
    for e in events:
        if "output_index" in e:
            assert e["output_index"] in added


def test_collaboration_calls_carry_the_plaintext_marker_on_every_snapshot() -> None:
    """Seed, "Collaboration tool arguments": collaboration.* calls are emitted with
    ``encrypted_function_args: []`` on the added item, the done item and the final snapshot;
    other tools are unchanged."""
    import json

    from tokenwire.gateway.apis.responses_hygiene import collaboration_call_fields
    from tokenwire.gateway.apis.responses_render import ResponsesRenderer
    from tokenwire.gateway.ir import Finish, FinishKind, ToolCallDelta

    tools = frozenset({"spawn_agent"})
    r = ResponsesRenderer(response_id="resp_" + "0" * 32, model="m", created_at=0, stream=True,
                          call_fields=lambda name: collaboration_call_fields(name, tools))
    out = r.on_event(ToolCallDelta(index=0, id="call_a", name="spawn_agent", arguments="{}"))
    out += r.on_event(ToolCallDelta(index=1, id="call_b", name="other", arguments="{}"))
    out += r.on_event(Finish(reason=FinishKind.TOOL_CALLS))
    events = [json.loads(chunk.split(b"data: ", 1)[1]) for chunk in out]
    items = [e["item"] for e in events if e["type"] in ("response.output_item.added",
                                                        "response.output_item.done")]
    marked = [i for i in items if i["name"] == "spawn_agent"]
    assert len(marked) == 2 and all(i["encrypted_function_args"] == [] for i in marked)
    assert all("encrypted_function_args" not in i for i in items if i["name"] == "other")
    final = events[-1]["response"]["output"]
    assert [o.get("encrypted_function_args") for o in final] == [[], None]
