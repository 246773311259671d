"""Assistant message boundaries and phases from a Responses upstream, kept through the gateway.

Seed, "Replayed items and turn terminals": "Assistant message boundaries and supplied
commentary, final_answer, or partial_answer phases are retained." The upstream's ``message``
items each start with an IR ``MessageStart`` (its phase when known); the Responses renderer
makes each one its own ``message`` item with that ``phase`` on every snapshot; every other
API ignores the event, and a failure before any output still gets its real HTTP status.

The upstream is the real Responses adapter against a scripted server on a loopback socket
(``fakes_responses.py``); the clients are the ``openai`` SDK (``responses.stream()``, the
strict lifecycle validator) and raw httpx.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tokenwire.codec.frames import StreamFormat
from tokenwire.gateway.apis.chat import ChatRenderer
from tokenwire.gateway.apis.codec_stream import CodecStreamRenderer
from tokenwire.gateway.apis.completions import CompletionsRenderer
from tokenwire.gateway.apis.messages import MessagesRenderer
from tokenwire.gateway.apis.responses_render import ResponsesRenderer
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.ir import (
    Event,
    Failure,
    FailureClass,
    Finish,
    FinishKind,
    IdsSource,
    MessageStart,
    ReasoningDelta,
    TokenDelta,
    Usage,
)
from tokenwire.gateway.routing.router import Router, ServedModel
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.upstreams.base import ModelRoute, UpstreamConfig
from tokenwire.gateway.upstreams.responses_upstream import (
    ResponsesStreamParser,
    ResponsesUpstream,
)
from tokenwire.gateway.upstreams.sse import SSEEvent

from .conftest import Served, start_server
from .upstreams.fakes_responses import ResponsesStream, Script, ScriptedServer


class Gateway:
    def __init__(self) -> None:
        self.srv = ScriptedServer(stream_path="/v1/responses", models_path="/v1/models")
        self.up = ResponsesUpstream.from_config(UpstreamConfig(
            name="oa", kind="responses", base_url=self.srv.url + "/v1",
            models=(ModelRoute(name="smart", upstream_model="gpt-test"),)))
        router = Router([ServedModel(name="smart", upstream=self.up,
                                     ids_source=IdsSource.NONE, upstream_name="oa")])
        self.served: Served = start_server(GatewayState(settings=ServerSettings(),
                                                        router=router))
        self.sdk = openai.OpenAI(base_url=self.served.url + "/v1", api_key="sk-none",
                                 max_retries=0)
        self.http = httpx.Client(base_url=self.served.url, timeout=30)

    def close(self) -> None:
        self.sdk.close()
        self.http.close()
        loop = self.served.server.servers[0].get_loop()
        asyncio.run_coroutine_threadsafe(self.up.aclose(), loop).result(10)
        self.served.stop()
        self.srv.stop()

    def raw_events(self, **body: Any) -> list[dict[str, Any]]:
        resp = self.http.post("/v1/responses", json={"model": "smart", "input": "Hi",
                                                     "stream": True, **body})
        assert resp.status_code == 200
        return [json.loads(line[6:]) for line in resp.text.splitlines()
                if line.startswith("data: ")]


@pytest.fixture(scope="module")
def gw() -> Iterator[Gateway]:
    g = Gateway()
    yield g
    g.close()


def two_messages() -> Script:
    s = (ResponsesStream().message(["Let me ", "check."], phase="commentary")
         .message(["It is ", "42."], phase="final_answer").completed())
    return Script(chunks=s.chunks())


def messages_of(output: list[dict[str, Any]]) -> list[tuple[str | None, str]]:
    return [(it.get("phase"), "".join(p["text"] for p in it["content"]))
            for it in output if it["type"] == "message"]


EXPECTED = [("commentary", "Let me check."), ("final_answer", "It is 42.")]


# -- through the gateway ---------------------------------------------------------------------


def test_message_boundaries_and_phases_pass_the_sdk_stream_validator(gw: Gateway) -> None:
    gw.srv.push(two_messages())
    with gw.sdk.responses.stream(model="smart", input="Hi") as s:
        seen = [ev.type for ev in s]
        final = s.get_final_response()
    assert seen.count("response.output_item.added") == 2
    assert [(m.phase, m.content[0].text) for m in final.output] == EXPECTED
    assert final.output_text == "Let me check.It is 42."


def test_each_message_item_carries_its_phase_on_added_done_and_final(gw: Gateway) -> None:
    gw.srv.push(two_messages())
    events = gw.raw_events()
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [it.get("phase") for it in added] == ["commentary", "final_answer"]
    assert messages_of(done) == EXPECTED
    assert messages_of(events[-1]["response"]["output"]) == EXPECTED
    assert events[-1]["type"] == "response.completed"
    # The first message is complete before the second one opens.
    types = [(e["type"], e.get("output_index")) for e in events]
    assert types.index(("response.output_item.done", 0)) < types.index(
        ("response.output_item.added", 1))
    deltas = {e["output_index"]: "" for e in events if e["type"].endswith("text.delta")}
    for e in events:
        if e["type"] == "response.output_text.delta":
            deltas[e["output_index"]] += e["delta"]
    assert deltas == {0: "Let me check.", 1: "It is 42."}


def test_non_streaming_response_keeps_both_messages_and_phases(gw: Gateway) -> None:
    gw.srv.push(two_messages())
    resp = gw.http.post("/v1/responses", json={"model": "smart", "input": "Hi"})
    assert resp.status_code == 200 and messages_of(resp.json()["output"]) == EXPECTED


def test_upstream_without_phases_gives_one_message_as_before(gw: Gateway) -> None:
    gw.srv.push(Script(chunks=ResponsesStream().message(["Hel", "lo"]).completed().chunks()))
    events = gw.raw_events()
    output = events[-1]["response"]["output"]
    assert messages_of(output) == [(None, "Hello")] and "phase" not in output[0]
    assert sum(e["type"] == "response.output_item.added" for e in events) == 1


def test_partial_answer_is_kept_and_an_unknown_phase_is_absent(gw: Gateway) -> None:
    s = (ResponsesStream().message(["a"], phase="partial_answer")
         .message(["b"], phase="shouting").completed())
    gw.srv.push(Script(chunks=s.chunks()))
    assert messages_of(gw.raw_events()[-1]["response"]["output"]) == [
        ("partial_answer", "a"), (None, "b")]


def test_chat_api_joins_the_messages_text_and_ignores_boundaries(gw: Gateway) -> None:
    gw.srv.push(two_messages())
    resp = gw.http.post("/v1/chat/completions", json={
        "model": "smart", "messages": [{"role": "user", "content": "Hi"}]})
    assert resp.status_code == 200
    assert resp.json()["choices"][0]["message"]["content"] == "Let me check.It is 42."


def test_failure_after_a_message_start_keeps_its_http_status(gw: Gateway) -> None:
    # A MessageStart before any text opens no response head: still a real HTTP error.
    s = ResponsesStream()
    s.emit("response.output_item.added", output_index=0, item={
        "type": "message", "id": "msg_0", "role": "assistant", "content": [],
        "phase": "commentary"})
    gw.srv.push(Script(chunks=s.failed("context_length_exceeded", "too long").chunks()))
    resp = gw.http.post("/v1/chat/completions", json={
        "model": "smart", "messages": [{"role": "user", "content": "Hi"}], "stream": True})
    assert resp.status_code == 400


# -- the sans-IO parts -----------------------------------------------------------------------


def parse(stream: ResponsesStream) -> list[Event]:
    parser = ResponsesStreamParser("oa")
    return [ev for e in stream.events
            for ev in parser.on_sse(SSEEvent(event=e["type"], data=json.dumps(e)))]


def test_parser_starts_each_message_item_with_its_known_phase() -> None:
    s = (ResponsesStream().message(["x"], phase="commentary").message(["y"], phase="nope")
         .completed(1, 2))
    assert parse(s) == [MessageStart(phase="commentary"), TokenDelta(text="x"),
                        MessageStart(), TokenDelta(text="y"),
                        Usage(prompt_tokens=1, completion_tokens=2, cached_tokens=0,
                              reasoning_tokens=0), Finish(reason=FinishKind.EOS)]


def test_parser_fails_when_a_message_phase_changes() -> None:
    s = ResponsesStream().message(["x"], phase="commentary")
    s.events[-1]["item"]["phase"] = "final_answer"  # output_item.done contradicts added
    events = parse(s)
    assert events[:2] == [MessageStart(phase="commentary"), TokenDelta(text="x")]
    assert isinstance(events[-1], Failure) and events[-1].failure_class is FailureClass.UPSTREAM


def test_parser_announces_a_message_seen_only_in_the_final_snapshot() -> None:
    s = ResponsesStream().completed()
    s.events[-1]["response"]["output"] = [{"type": "message", "id": "m", "role": "assistant",
                                           "phase": "final_answer", "content": [
                                               {"type": "output_text", "text": "late"}]}]
    assert parse(s)[:2] == [MessageStart(phase="final_answer"), TokenDelta(text="late")]


def render(events: list[Event], stream: bool = True) -> ResponsesRenderer:
    r = ResponsesRenderer(response_id="resp_x", model="m", created_at=1, stream=stream)
    for ev in events:
        r.on_event(ev)
    return r


def test_renderer_message_start_closes_the_open_message_and_labels_the_next() -> None:
    r = render([MessageStart(phase="commentary"), TokenDelta(text="a"),
                ReasoningDelta(text="hmm"), MessageStart(phase="final_answer"),
                TokenDelta(text="b"), MessageStart(), TokenDelta(text="c"),
                MessageStart(phase="commentary"), Finish(reason=FinishKind.EOS)])
    assert r.final_response is not None
    output = r.final_response["output"]
    assert [it["type"] for it in output] == ["message", "reasoning", "message", "message"]
    assert messages_of(output) == [("commentary", "a"), ("final_answer", "b"), (None, "c")]
    assert all(it["status"] == "completed" for it in output if it["type"] == "message")


def test_renderer_without_message_start_keeps_one_message() -> None:
    r = render([TokenDelta(text="a"), TokenDelta(text="b"), Finish(reason=FinishKind.EOS)],
               stream=False)
    assert r.final_response is not None
    assert messages_of(r.final_response["output"]) == [(None, "ab")]


@pytest.mark.parametrize("make", [
    lambda: ChatRenderer(completion_id="c", model="m", created=1, stream=True),
    lambda: CompletionsRenderer(completion_id="c", model="m", created=1, stream=True),
    lambda: CodecStreamRenderer(StreamFormat.MSGPACK),
    lambda: MessagesRenderer(message_id="msg_1", model="m", stream=True),
], ids=["chat", "completions", "codec", "messages"])
def test_other_apis_ignore_message_start(make: Any) -> None:
    body = [TokenDelta(ids=(1, 2), text="a"), TokenDelta(ids=(3,), text="b"),
            Finish(reason=FinishKind.EOS)]
    with_starts = [MessageStart(phase="commentary"), body[0], MessageStart(), *body[1:]]
    plain, marked = make(), make()
    assert b"".join(c for ev in body for c in plain.on_event(ev)) == b"".join(
        c for ev in with_starts for c in marked.on_event(ev))
    if not isinstance(plain, MessagesRenderer):  # which opens its stream on any first event
        assert make().on_event(MessageStart(phase="final_answer")) == []
