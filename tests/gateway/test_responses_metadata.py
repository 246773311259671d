"""What a Responses upstream reports about a response, kept through the gateway.

Seed, "Service tiers on Responses upstreams": the tier *served* is reported only when the
upstream says so and names a public tier, never the requested one. "Replayed items and turn
terminals": an actual boolean ``end_turn`` is kept, an absent one stays absent. "Response ids,
cache affinity, and turn state": the upstream's ``x-codex-turn-state`` goes back to the client
wrapped with a scope naming that upstream (in-stream as Codex's ``response.metadata`` event,
gateway-research §2; as a response header when not streaming), and the wrapped value the
client echoes reaches that upstream unwrapped and no other. Malformed or oversized values are
dropped.

The upstreams are the real Responses adapter against scripted servers on loopback sockets
(``fakes_responses.py``); the clients are the ``openai`` SDK and raw httpx.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tokenwire.gateway.affinity import MAX_TURN_STATE_CHARS, wrap_turn_state
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.ir import (
    Finish,
    FinishKind,
    IdsSource,
    ResponseMeta,
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

STATE = "ts_" + "Ab9-_" * 150  # about the 780 characters the seed saw live
TURN = "x-codex-turn-state"


# -- the gateway in front of two Responses upstreams ------------------------------------------


class Gateway:
    def __init__(self) -> None:
        self.a = ScriptedServer(stream_path="/v1/responses", models_path="/v1/models")
        self.b = ScriptedServer(stream_path="/v1/responses", models_path="/v1/models")
        self.ups = [ResponsesUpstream.from_config(UpstreamConfig(
            name=name, kind="responses", base_url=srv.url + "/v1",
            models=(ModelRoute(name=model, upstream_model="gpt-test"),)))
            for name, model, srv in (("oa", "alpha", self.a), ("ob", "beta", self.b))]
        router = Router([ServedModel(name=up.model_id, upstream=up, ids_source=IdsSource.NONE,
                                     upstream_name=up.name) for up in self.ups])
        self.served: Served = start_server(GatewayState(settings=ServerSettings(),
                                                        router=router))
        self.sdk = openai.OpenAI(base_url=self.served.url + "/v1", api_key="sk-none",
                                 max_retries=0)
        self.http = httpx.Client(base_url=self.served.url, timeout=30)

    def close(self) -> None:
        self.sdk.close()
        self.http.close()
        loop = self.served.server.servers[0].get_loop()
        for up in self.ups:
            asyncio.run_coroutine_threadsafe(up.aclose(), loop).result(10)
        self.served.stop()
        self.a.stop()
        self.b.stop()


@pytest.fixture(scope="module")
def gw() -> Iterator[Gateway]:
    g = Gateway()
    yield g
    g.close()


def text_script(headers: dict[str, str] | None = None, **completed: Any) -> Script:
    return Script(chunks=ResponsesStream().message(["Hel", "lo"]).completed(**completed)
                  .chunks(), headers=headers or {})


def sse_events(body: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]


def post(gw: Gateway, *, stream: bool, model: str = "alpha",
         headers: dict[str, str] | None = None, **extra: Any) -> httpx.Response:
    resp = gw.http.post("/v1/responses", headers=headers or {},
                        json={"model": model, "input": "Hi", "stream": stream, **extra})
    assert resp.status_code == 200, resp.text
    return resp


# -- service_tier ------------------------------------------------------------------------------


@pytest.mark.parametrize("tier", ["auto", "default", "flex", "priority", "scale"])
def test_service_tier_served_by_the_upstream_is_reported(gw: Gateway, tier: str) -> None:
    gw.a.push(text_script(service_tier=tier))
    with gw.sdk.responses.stream(model="alpha", input="Hi") as s:
        final = s.get_final_response()
    assert final.service_tier == tier and final.output_text == "Hello"
    gw.a.push(text_script(service_tier=tier))
    assert gw.sdk.responses.create(model="alpha", input="Hi").service_tier == tier


def test_requested_service_tier_is_never_reported_as_served(gw: Gateway) -> None:
    gw.a.push(text_script())  # the upstream says nothing about the tier
    body = post(gw, stream=False, service_tier="priority").json()
    assert "service_tier" not in body
    gw.a.push(text_script())
    final = sse_events(post(gw, stream=True, service_tier="priority").text)[-1]
    assert final["type"] == "response.completed" and "service_tier" not in final["response"]


def test_served_tier_that_differs_from_the_requested_one_is_kept(gw: Gateway) -> None:
    gw.a.push(text_script(service_tier="default"))
    before = len(gw.a.requests)
    assert post(gw, stream=False, service_tier="priority").json()["service_tier"] == "default"
    assert len(gw.a.requests) == before + 1  # no retry chasing the requested tier


@pytest.mark.parametrize("value", ["turbo", "PRIORITY", "", 3, None, ["priority"]])
def test_unrecognised_service_tier_from_the_upstream_is_not_reported(gw: Gateway,
                                                                     value: Any) -> None:
    gw.a.push(text_script(service_tier=value))
    assert "service_tier" not in post(gw, stream=False).json()


# -- end_turn ----------------------------------------------------------------------------------


@pytest.mark.parametrize("end_turn", [True, False])
def test_responses_upstream_actual_end_turn_is_kept(gw: Gateway, end_turn: bool) -> None:
    gw.a.push(text_script(end_turn=end_turn))
    assert post(gw, stream=False).json()["end_turn"] is end_turn
    gw.a.push(text_script(end_turn=end_turn))
    final = sse_events(post(gw, stream=True).text)[-1]
    assert final["type"] == "response.completed" and final["response"]["end_turn"] is end_turn


@pytest.mark.parametrize("value", [None, "false", 0])
def test_responses_upstream_absent_or_non_boolean_end_turn_stays_absent(gw: Gateway,
                                                                        value: Any) -> None:
    gw.a.push(text_script() if value is None else text_script(end_turn=value))
    assert "end_turn" not in post(gw, stream=False).json()
    gw.a.push(text_script() if value is None else text_script(end_turn=value))
    assert "end_turn" not in sse_events(post(gw, stream=True).text)[-1]["response"]


def test_end_turn_false_is_kept_beside_caller_tools(gw: Gateway) -> None:
    gw.a.push(Script(chunks=ResponsesStream().function_call("call_1", "f", ['{"a":1}'])
                     .completed(end_turn=False).chunks()))
    with gw.sdk.responses.stream(model="alpha", input="Hi") as s:
        final = s.get_final_response()
    assert final.output[0].call_id == "call_1"
    assert final.to_dict()["end_turn"] is False


# -- x-codex-turn-state ------------------------------------------------------------------------


def test_turn_state_is_returned_in_stream_as_response_metadata_wrapped_for_its_upstream(
        gw: Gateway) -> None:
    gw.a.push(text_script(headers={TURN: STATE}))
    events = list(gw.sdk.responses.create(model="alpha", input="Hi", stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    [meta] = [e for e in events if e.type == "response.metadata"]
    wrapped = meta.to_dict()["headers"][TURN]
    assert wrapped == wrap_turn_state("oa", STATE) and wrapped != STATE
    assert events[-1].type == "response.completed"
    # The strict lifecycle validator accepts the extra event too.
    gw.a.push(text_script(headers={TURN: STATE}))
    with gw.sdk.responses.stream(model="alpha", input="Hi") as s:
        assert s.get_final_response().output_text == "Hello"


def test_turn_state_is_a_response_header_when_not_streaming(gw: Gateway) -> None:
    gw.a.push(text_script(headers={TURN: STATE}))
    raw = gw.sdk.responses.with_raw_response.create(model="alpha", input="Hi")
    assert raw.headers[TURN] == wrap_turn_state("oa", STATE)
    assert raw.parse().output_text == "Hello"
    assert STATE not in raw.text  # the body carries no turn state


def test_no_turn_state_from_the_upstream_means_none_to_the_client(gw: Gateway) -> None:
    gw.a.push(text_script())
    assert TURN not in post(gw, stream=False).headers
    gw.a.push(text_script())
    events = sse_events(post(gw, stream=True).text)
    assert "response.metadata" not in [e["type"] for e in events]


@pytest.mark.parametrize("value", ["x" * (MAX_TURN_STATE_CHARS + 1), "a,b", "a b"])
def test_oversized_or_malformed_upstream_turn_state_is_dropped(gw: Gateway,
                                                               value: str) -> None:
    gw.a.push(text_script(headers={TURN: value}))
    assert TURN not in post(gw, stream=False).headers
    gw.a.push(text_script(headers={TURN: value}))
    body = post(gw, stream=True).text
    assert "response.metadata" not in body and value not in body


def test_echoed_turn_state_reaches_the_issuing_upstream_unwrapped(gw: Gateway) -> None:
    gw.a.push(text_script(headers={TURN: STATE}))
    wrapped = post(gw, stream=False).headers[TURN]
    gw.a.push(text_script())
    post(gw, stream=True, headers={TURN: wrapped})
    assert gw.a.requests[-1].headers[TURN] == STATE


def test_echoed_turn_state_never_reaches_a_different_upstream(gw: Gateway) -> None:
    gw.a.push(text_script(headers={TURN: STATE}))
    wrapped = post(gw, stream=False).headers[TURN]
    gw.b.push(text_script())
    post(gw, stream=False, model="beta", headers={TURN: wrapped})
    assert TURN not in gw.b.requests[-1].headers
    gw.a.push(text_script())  # an unwrapped (raw upstream) value is not forwarded either
    post(gw, stream=False, headers={TURN: STATE})
    assert TURN not in gw.a.requests[-1].headers


# -- other APIs ignore the facts ------------------------------------------------------------


def test_chat_api_over_a_responses_upstream_ignores_turn_state(gw: Gateway) -> None:
    gw.a.push(text_script(headers={TURN: STATE}, service_tier="flex", end_turn=True))
    resp = gw.http.post("/v1/chat/completions", json={
        "model": "alpha", "messages": [{"role": "user", "content": "Hi"}], "stream": True})
    assert resp.status_code == 200 and STATE not in resp.text
    text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                   for line in resp.text.splitlines()
                   if line.startswith("data: {") and json.loads(line[6:])["choices"])
    assert text == "Hello"


def test_failure_after_turn_state_keeps_its_http_status_on_other_apis(gw: Gateway) -> None:
    # A ResponseMeta before any output opens no response head: the failure is still an HTTP
    # error with its real status, not a 200 with an error inside.
    gw.a.push(Script(chunks=ResponsesStream().failed("context_length_exceeded", "too long")
                     .chunks(), headers={TURN: STATE}))
    resp = gw.http.post("/v1/chat/completions", json={
        "model": "alpha", "messages": [{"role": "user", "content": "Hi"}], "stream": True})
    assert resp.status_code == 400 and STATE not in resp.text


# -- the sans-IO parser --------------------------------------------------------------------


def completed_event(**snapshot: Any) -> SSEEvent:
    data = {"type": "response.completed",
            "response": {"id": "r", "status": "completed", "output": [], **snapshot}}
    return SSEEvent(event="response.completed", data=json.dumps(data))


def test_parser_reports_tier_and_end_turn_just_before_the_finish() -> None:
    parser = ResponsesStreamParser("oa")
    events = parser.on_sse(completed_event(service_tier="scale", end_turn=False))
    assert events == [ResponseMeta(service_tier="scale", end_turn=False),
                      Finish(reason=FinishKind.EOS)]


def test_parser_reports_nothing_when_the_snapshot_says_nothing() -> None:
    assert ResponsesStreamParser("oa").on_sse(completed_event()) == [
        Finish(reason=FinishKind.EOS)]


def test_parser_wraps_the_head_turn_state_with_its_own_name() -> None:
    assert ResponsesStreamParser("oa").on_head(httpx.Headers({TURN: STATE})) == [
        ResponseMeta(turn_state=wrap_turn_state("oa", STATE))]
    assert ResponsesStreamParser("oa").on_head(httpx.Headers({})) == []


def test_the_requested_service_tier_reaches_a_responses_upstream_in_a_rebuilt_body() -> None:
    """Seed, "Service tiers on Responses upstreams": the tier is retained on the wire even when
    the body is rebuilt (a renamed model or a stripped field), and absent stays absent."""
    from tokenwire.gateway.apis.responses_request import parse_responses_request
    from tokenwire.gateway.upstreams.responses_upstream import build_responses_body

    for tier in ("priority", None):
        body = {"model": "m", "input": "hi", "stream": True,
                **({"service_tier": tier} if tier else {})}
        call = parse_responses_request(body, headers={})
        sent = build_responses_body(call.request, model="upstream-m", upstream_name="up")
        assert sent.get("service_tier") == tier
