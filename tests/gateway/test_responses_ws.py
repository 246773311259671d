"""The Responses API over WebSocket (``gateway/http/responses_ws.py``), as a client sees it.

Served exactly as ``tokenwire serve`` serves it (``serve_gateway``: hardening, the guarded
h11 protocol, uvicorn's wsproto WebSockets, graceful shutdown) over an in-process upstream
whose every generation waits on the test where the test says so, and driven with the
``websockets`` client library. Time-bound rules (idle timeout, the 60-minute cap) run the
bare app on a ``looptime`` loop through an in-memory ASGI WebSocket instead, so no test
waits for a real clock.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import looptime
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tokenwire.gateway.http.app import create_app
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.http.ws_session import (
    CONNECTION_LIMIT_CODE,
    CONNECTION_LIMIT_MESSAGE,
    SessionClock,
    SocketTable,
)
from tokenwire.gateway.http.ws_session import parse_message as _parse
from tokenwire.gateway.ir import (
    Event,
    Finish,
    FinishKind,
    GenerationRequest,
    IdsSource,
    TokenDelta,
    ToolCallDelta,
    Usage,
)
from tokenwire.gateway.routing.router import Router, ServedModel
from tokenwire.gateway.settings import ServerSettings

from .test_hardening import serve_stack, stop_stacks

KEY = "tw-ws-key-0123456789abcdef"
#: A safety net against a server that never answers, never the thing measured.
WAIT_S = 20.0


# -- an upstream the test paces ------------------------------------------------------------


@dataclass(eq=False)
class PacedUpstream:
    """Each request plays ``script(request)``; before the events listed in ``hold_before``
    it waits for :meth:`release` (a ``threading.Event``: the server runs in another
    thread). Records requests and cancellations."""

    script: Callable[[GenerationRequest], list[Event]]
    model_id: str = "scripted"
    hold_before: set[int] = field(default_factory=set)
    requests: list[GenerationRequest] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    _gate: threading.Event = field(default_factory=threading.Event)
    reached: threading.Event = field(default_factory=threading.Event)
    #: For a test on the upstream's own loop (looptime): the hold waits on this instead.
    loop_gate: asyncio.Event | None = None

    def submit(self, request: GenerationRequest) -> _Play:
        self.requests.append(request)
        return _Play(self, request, self.script(request))

    def release(self) -> None:
        self._gate.set()


class _Play:
    def __init__(self, up: PacedUpstream, request: GenerationRequest, events: list[Event]):
        self._up, self._req, self._events, self._i = up, request, events, 0

    async def next_event(self) -> Event:
        if self._i in self._up.hold_before and self._up.loop_gate is not None:
            await self._up.loop_gate.wait()
        elif self._i in self._up.hold_before:
            self._up.reached.set()
            deadline = time.monotonic() + WAIT_S
            while not self._up._gate.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
        event = self._events[self._i]
        self._i += 1
        return event

    def cancel(self) -> None:
        self._up.cancelled.append(self._req.request_id)


def text_reply(*pieces: str) -> Callable[[GenerationRequest], list[Event]]:
    def script(request: GenerationRequest) -> list[Event]:
        return [*(TokenDelta(text=p) for p in pieces), Usage(prompt_tokens=3, completion_tokens=2),
                Finish(reason=FinishKind.EOS)]
    return script


def _router(upstream: PacedUpstream) -> Router:
    return Router([ServedModel(name="scripted", upstream=upstream, ids_source=IdsSource.NONE,
                               upstream_name="scripted")], default="scripted")


@dataclass
class Stack:
    url: str
    upstream: PacedUpstream
    state: GatewayState
    server: Any


@pytest.fixture
def serve() -> Iterator[Callable[..., Stack]]:
    """``serve(script, **settings) -> Stack``: ``serve_gateway`` on a free loopback port."""
    running: list[tuple[Any, threading.Thread]] = []
    patch = pytest.MonkeyPatch()

    def start(script=None, **kw: Any) -> Stack:
        upstream = PacedUpstream(script or text_reply("Hi ", "there."))
        settings = ServerSettings(**{"api_keys": (KEY,), "auth": "keys", **kw})
        served = serve_stack(patch, running, settings, router=_router(upstream))
        return Stack(f"ws://127.0.0.1:{served.port}", upstream, served.state, served.server)

    yield start
    stop_stacks(patch, running)


def open_ws(stack: Stack, **headers: str) -> ClientConnection:
    return connect(stack.url + "/v1/responses", proxy=None, open_timeout=WAIT_S, legacy=True,
                   additional_headers={"Authorization": f"Bearer {KEY}", **headers})


def create(**fields: Any) -> str:
    return json.dumps({"type": "response.create", "model": "scripted", "input": "Hi",
                       "store": False, **fields})


def until_terminal(ws: ClientConnection) -> list[dict]:
    """Every message up to and including the response's terminal (or an ``error``)."""
    out: list[dict] = []
    while True:
        msg = json.loads(ws.recv(timeout=WAIT_S))
        out.append(msg)
        if msg["type"] in ("response.completed", "response.failed", "response.incomplete",
                           "error"):
            return out


def closed_code(ws: ClientConnection) -> tuple[int, str]:
    """The close frame the server sent, once it closed (draining what came before)."""
    try:
        while True:
            ws.recv(timeout=WAIT_S)
    except ConnectionClosed as exc:
        assert exc.rcvd is not None, "the server cut the socket without a close frame"
        return exc.rcvd.code, exc.rcvd.reason


# -- one response, in order ----------------------------------------------------------------


def test_a_response_create_streams_the_responses_events_in_order(serve) -> None:
    stack = serve()
    with open_ws(stack) as ws:
        assert ws.response.headers["x-codex-websocket-max-message-bytes"] == str(
            stack.state.settings.max_body_bytes)
        ws.send(create())
        events = until_terminal(ws)
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") \
        == "Hi there."
    done = events[-1]["response"]
    assert done["output"][0]["content"][0]["text"] == "Hi there."
    assert done["usage"]["input_tokens"] == 3 and done["usage"]["output_tokens"] == 2
    assert {e["response"]["id"] for e in events if "response" in e} == {done["id"]}
    assert len(stack.upstream.requests) == 1


def test_the_same_events_as_the_sse_route_for_the_same_request(serve) -> None:
    import httpx

    stack = serve()
    with open_ws(stack) as ws:
        ws.send(create())
        over_ws = until_terminal(ws)
    http_url = stack.url.replace("ws://", "http://")
    with httpx.stream("POST", http_url + "/v1/responses", timeout=WAIT_S,
                      headers={"authorization": f"Bearer {KEY}"},
                      json={"model": "scripted", "input": "Hi", "store": False,
                            "stream": True}) as resp:
        lines = [ln for ln in resp.iter_lines() if ln.startswith("data:")]
    over_sse = [json.loads(ln[5:]) for ln in lines]
    assert [e["type"] for e in over_ws] == [e["type"] for e in over_sse]


def test_several_turns_on_one_socket_each_with_its_own_response(serve) -> None:
    stack = serve()
    with open_ws(stack) as ws:
        ids = []
        for _ in range(3):
            ws.send(create())
            events = until_terminal(ws)
            assert events[0]["sequence_number"] == 0  # each response counts from 0
            ids.append(events[-1]["response"]["id"])
    assert len(set(ids)) == 3 and len(stack.upstream.requests) == 3
    assert stack.state.admission.counts() == (0, 0)  # every ticket came back


# -- previous_response_id on the socket ----------------------------------------------------


def _tool_call(request: GenerationRequest) -> list[Event]:
    roles = [m.role for m in request.prompt.messages]  # type: ignore[union-attr]
    if "tool" in roles:
        return text_reply("It printed hello.")(request)
    return [ToolCallDelta(index=0, id="call_ws1", name="exec_command",
                          arguments='{"cmd": "echo hello"}'),
            Finish(reason=FinishKind.TOOL_CALLS)]


def test_previous_response_id_with_only_the_new_items_works_with_store_false(serve) -> None:
    stack = serve(_tool_call)
    with open_ws(stack) as ws:
        ws.send(create(input=[{"type": "message", "role": "user",
                               "content": [{"type": "input_text", "text": "run it"}]}]))
        first = until_terminal(ws)[-1]["response"]
        [call] = [i for i in first["output"] if i["type"] == "function_call"]
        assert call["call_id"] == "call_ws1"
        ws.send(create(previous_response_id=first["id"], input=[
            {"type": "function_call_output", "call_id": "call_ws1", "output": "hello\n"}]))
        second = until_terminal(ws)[-1]["response"]
    assert second["status"] == "completed"
    assert second["previous_response_id"] == first["id"]
    # The upstream saw the whole conversation: the user turn, its call, the call's output.
    msgs = stack.upstream.requests[1].prompt.messages  # type: ignore[union-attr]
    assert [m.role for m in msgs] == ["user", "assistant", "tool"]
    assert msgs[1].tool_calls[0].id == "call_ws1"
    # store: false: nothing went to the shared store, so HTTP cannot continue from it.
    assert len(stack.state.response_store) == 0


def test_a_previous_response_id_the_socket_does_not_know_is_openais_400(serve) -> None:
    stack = serve()
    with open_ws(stack) as ws:
        ws.send(create(previous_response_id="resp_unknown"))
        [error] = until_terminal(ws)
        ws.send(create())  # the socket stays usable
        assert until_terminal(ws)[-1]["type"] == "response.completed"
    assert error == {"type": "error", "status": 400, "error": {
        "message": "Previous response with id 'resp_unknown' not found.",
        "type": "invalid_request_error", "param": "previous_response_id",
        "code": "previous_response_not_found"}}


def test_every_sockets_memory_shares_one_budget_and_a_closed_socket_gives_its_bytes_back(
        serve) -> None:
    """Each socket remembered up to 32 MiB on its own: with 64 sockets an address, 1,024 in
    all, one key could make the gateway hold 2 GiB per address and 32 GiB in all. Here the
    budget holds exactly one response: a second socket's is not remembered (its
    continuation is a 400, Codex resends the whole input) until the first socket closes."""
    stack = serve()
    budget = stack.state.ws_memory
    with open_ws(stack) as one:
        one.send(create())
        first = until_terminal(one)[-1]["response"]["id"]
        budget.total = budget.used  # room for this response only
        with open_ws(stack) as two:
            two.send(create())
            second = until_terminal(two)[-1]["response"]["id"]
            two.send(create(previous_response_id=second))
            [error] = until_terminal(two)
            assert error["error"]["code"] == "previous_response_not_found"
            one.send(create(previous_response_id=first))  # the first is still remembered
            assert until_terminal(one)[-1]["type"] == "response.completed"
    deadline = time.monotonic() + WAIT_S  # the server's side of a close runs after ours
    while budget.used and time.monotonic() < deadline:
        time.sleep(0.01)
    assert budget.used == 0  # both closed: every byte given back
    with open_ws(stack) as three:
        three.send(create())
        third = until_terminal(three)[-1]["response"]["id"]
        three.send(create(previous_response_id=third))
        assert until_terminal(three)[-1]["type"] == "response.completed"


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/responses", {"input": "hi"}),
    ("/v1/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
])
def test_a_failure_before_output_carries_its_request_id(serve, path: str, body: dict) -> None:
    """A success carried ``X-Request-Id``; the error answer of a failed generation did not,
    on every API, so the id a log line names could not be matched to the client's error."""
    from tokenwire.gateway.ir import Failure, FailureClass

    failure = Failure(failure_class=FailureClass.UPSTREAM, status=502, message="upstream down")
    stack = serve(lambda request: [failure])
    url = stack.url.replace("ws://", "http://")
    with httpx.Client(base_url=url, timeout=WAIT_S,
                      headers={"authorization": f"Bearer {KEY}"}) as http:
        for stream in (False, True):
            got = http.post(path, json={"model": "scripted", "stream": stream, **body})
            # A Responses stream opens with response.created, so it fails in-stream (200).
            assert got.status_code == (200 if stream and path == "/v1/responses" else 502)
            rid = got.headers.get("x-request-id", "")
            assert rid and rid == stack.upstream.requests[-1].request_id


@pytest.mark.parametrize(("path", "body", "prefix"), [
    ("/v1/chat/completions", {"messages": "not a list"}, "chatcmpl-"),
    ("/v1/completions", {"prompt": 5}, "cmpl-"),
    ("/v1/responses", {"input": 5}, "resp_"),
    ("/v1/messages", {"max_tokens": 8, "messages": "no"}, "msg_"),
    ("/v1/completions/codec", None, "cmpl-"),
])
def test_a_request_refused_as_invalid_carries_its_request_id_and_its_log_line_too(
        serve, caplog, path: str, body: dict | None, prefix: str) -> None:
    """Reproduced: a 400 from the request's own checks had no ``X-Request-Id``, and its
    ``request_rejected`` log line no ``request_id``: nothing a client's report of the
    error could be matched with."""
    stack = serve()
    url = stack.url.replace("ws://", "http://")
    with httpx.Client(base_url=url, timeout=WAIT_S,
                      headers={"authorization": f"Bearer {KEY}"}) as http, \
            caplog.at_level(logging.INFO, logger="tokenwire.requests"):
        got = (http.post(path, json={"model": "scripted", **body}) if body is not None else
               http.post(path, content=b"\x80", headers={"content-type": "application/x-msgpack"}))
    assert got.status_code == 400, got.text
    rid = got.headers.get("x-request-id", "")
    assert rid.startswith(prefix)
    [line] = [r.event for r in caplog.records if r.getMessage() == "request_rejected"]
    assert line["request_id"] == rid and line["status"] == 400


def test_another_socket_cannot_continue_a_store_false_response(serve) -> None:
    stack = serve()
    with open_ws(stack) as one:
        one.send(create())
        rid = until_terminal(one)[-1]["response"]["id"]
    with open_ws(stack) as two:
        two.send(create(previous_response_id=rid))
        [error] = until_terminal(two)
    assert error["error"]["code"] == "previous_response_not_found"


# -- warm-up ---------------------------------------------------------------------------------


def test_generate_false_is_an_empty_complete_lifecycle_and_runs_no_model(serve) -> None:
    stack = serve()
    with open_ws(stack) as ws:
        ws.send(create(generate=False))
        warm = until_terminal(ws)
        assert [e["type"] for e in warm] == ["response.created", "response.in_progress",
                                             "response.completed"]
        assert warm[-1]["response"]["output"] == []
        assert stack.upstream.requests == []
        # Codex continues from the warm-up's id with the input it already sent: none new.
        ws.send(create(previous_response_id=warm[-1]["response"]["id"], input=[]))
        turn = until_terminal(ws)
    assert turn[-1]["type"] == "response.completed"
    [req] = stack.upstream.requests
    assert [m.content for m in req.prompt.messages] == ["Hi"]  # type: ignore[union-attr]


# -- errors ----------------------------------------------------------------------------------


def test_a_bad_request_is_a_typed_error_with_the_http_status_and_the_socket_stays_open(
        serve) -> None:
    stack = serve()
    with open_ws(stack) as ws:
        ws.send(create(model="no-such-model"))
        [error] = until_terminal(ws)
        ws.send(create(temperature="hot"))
        [bad] = until_terminal(ws)
        ws.send(create())
        assert until_terminal(ws)[-1]["type"] == "response.completed"
    assert error["status"] == 404 and error["error"]["code"] == "model_not_found"
    assert bad["status"] == 400 and bad["error"]["param"] == "temperature"


def test_a_malformed_message_is_a_typed_error_then_close_1007(serve) -> None:
    stack = serve()
    with open_ws(stack) as ws:
        ws.send("{not json")
        [error] = until_terminal(ws)
        code, _ = closed_code(ws)
    assert error["type"] == "error" and error["status"] == 400
    assert code == 1007


def test_a_binary_message_is_a_typed_error_then_close_1003(serve) -> None:
    stack = serve()
    with open_ws(stack) as ws:
        ws.send(b'{"type": "response.create"}')
        [error] = until_terminal(ws)
        code, _ = closed_code(ws)
    assert error["error"]["code"] == "unsupported_message" and code == 1003


def test_an_unknown_message_type_is_a_typed_error_and_the_socket_stays_open(serve) -> None:
    stack = serve()
    with open_ws(stack) as ws:
        ws.send(json.dumps({"type": "response.cancel"}))
        [error] = until_terminal(ws)
        ws.send(create())
        assert until_terminal(ws)[-1]["type"] == "response.completed"
    assert error["error"]["code"] == "unknown_message_type" and error["error"]["param"] == "type"


def test_an_oversized_message_is_a_413_error_then_close_1009(serve) -> None:
    stack = serve(max_body_bytes=4096)
    with connect(stack.url + "/v1/responses", proxy=None, max_size=None,
                 additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        ws.send(create(input="x" * 5000))
        [error] = until_terminal(ws)
        code, _ = closed_code(ws)
    assert error["status"] == 413 and error["error"]["code"] == "request_too_large"
    assert code == 1009
    assert stack.upstream.requests == []


def test_far_past_the_limit_uvicorn_closes_1009_before_buffering_it(serve) -> None:
    stack = serve(max_body_bytes=4096)
    with connect(stack.url + "/v1/responses", proxy=None, max_size=None,
                 additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        ws.send(create(input="x" * (4096 + 200_000)))
        code, _ = closed_code(ws)
    assert code == 1009


def test_a_second_create_while_one_runs_is_a_409_and_the_first_finishes(serve) -> None:
    stack = serve(text_reply("slow ", "answer"))
    stack.upstream.hold_before.add(1)
    with open_ws(stack) as ws:
        ws.send(create())
        assert stack.upstream.reached.wait(WAIT_S)
        ws.send(create())
        first: list[dict] = []
        while not any(e["type"] == "error" for e in first):
            first.append(json.loads(ws.recv(timeout=WAIT_S)))
        stack.upstream.release()
        rest = until_terminal(ws)
    [error] = [e for e in first if e["type"] == "error"]
    assert error["status"] == 409 and error["error"]["code"] == "response_in_progress"
    assert rest[-1]["type"] == "response.completed"
    assert len(stack.upstream.requests) == 1


def test_an_upstream_failure_before_output_is_response_failed_as_on_sse(serve) -> None:
    from tokenwire.gateway.ir import Failure, FailureClass

    stack = serve(lambda r: [Failure(failure_class=FailureClass.CONTEXT_LENGTH, status=400,
                                     message="too long", code="context_length_exceeded")])
    with open_ws(stack) as ws:
        ws.send(create())
        events = until_terminal(ws)
    assert [e["type"] for e in events] == ["response.created", "response.in_progress",
                                           "response.failed"]
    assert events[-1]["response"]["error"]["code"] == "context_length_exceeded"


# -- the client going away, capacity -----------------------------------------------------------


def test_a_client_closing_mid_stream_stops_the_generation_and_returns_capacity(serve) -> None:
    stack = serve(text_reply("one ", "two"))
    stack.upstream.hold_before.add(1)
    ws = open_ws(stack)
    ws.send(create())
    assert stack.upstream.reached.wait(WAIT_S)
    assert stack.state.admission.counts()[0] == 1  # the running response holds a slot
    ws.close()
    deadline = time.monotonic() + WAIT_S
    while not stack.upstream.cancelled and time.monotonic() < deadline:
        time.sleep(0.01)
    stack.upstream.release()
    assert stack.upstream.cancelled == [stack.upstream.requests[0].request_id]
    # The session's end (its socket leaving the table) runs after the slot is released.
    while ((stack.state.admission.counts() != (0, 0) or len(stack.state.ws_sockets))
           and time.monotonic() < deadline):
        time.sleep(0.01)
    assert stack.state.admission.counts() == (0, 0)
    assert len(stack.state.ws_sockets) == 0


def test_an_idle_open_socket_holds_no_capacity(serve) -> None:
    stack = serve(max_concurrent=1, queue_size=0)
    idle = [open_ws(stack) for _ in range(3)]
    try:
        assert stack.state.admission.counts() == (0, 0)
        for ws in idle:  # each one, in turn, gets the only slot
            ws.send(create())
            assert until_terminal(ws)[-1]["type"] == "response.completed"
    finally:
        for ws in idle:
            ws.close()


def test_sockets_per_address_are_capped_with_a_429_before_the_handshake(serve) -> None:
    stack = serve(ws_max_sockets_per_client=2)
    held = [open_ws(stack), open_ws(stack)]
    try:
        with pytest.raises(InvalidStatus) as refused:
            open_ws(stack)
        assert refused.value.response.status_code == 429
        assert refused.value.response.headers["retry-after"] == "1"
        assert json.loads(refused.value.response.body)["error"]["code"] == \
            "too_many_connections"
        held.pop().close()
        deadline = time.monotonic() + WAIT_S
        while len(stack.state.ws_sockets) > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        open_ws(stack).close()  # a slot came back
    finally:
        for ws in held:
            ws.close()


# -- the upgrade's checks, and the setting ----------------------------------------------------


def test_the_upgrade_needs_the_key_from_authorization_or_x_api_key(serve) -> None:
    stack = serve()
    with pytest.raises(InvalidStatus) as no_key:
        connect(stack.url + "/v1/responses", proxy=None)
    assert no_key.value.response.status_code == 401
    with connect(stack.url + "/v1/responses", proxy=None,
                 additional_headers={"x-api-key": KEY}) as ws:
        ws.send(create())
        assert until_terminal(ws)[-1]["type"] == "response.completed"


def test_an_upgrade_with_a_foreign_origin_is_403(serve) -> None:
    stack = serve()
    with pytest.raises(InvalidStatus) as refused:
        connect(stack.url + "/v1/responses", proxy=None, origin="https://evil.example",
                additional_headers={"Authorization": f"Bearer {KEY}"})
    assert refused.value.response.status_code == 403


def test_upgrades_on_other_paths_keep_their_404(serve) -> None:
    stack = serve()
    with pytest.raises(InvalidStatus) as refused:
        connect(stack.url + "/v1/chat/completions", proxy=None,
                additional_headers={"Authorization": f"Bearer {KEY}"})
    assert refused.value.response.status_code == 404


def test_with_the_setting_off_the_upgrade_is_the_old_426_exactly(serve) -> None:
    import socket

    stack = serve(responses_websocket=False)
    port = int(stack.url.rsplit(":", 1)[1])
    head = (f"GET /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as conn:
        conn.sendall(head)
        data = b""
        while chunk := conn.recv(4096):
            data += chunk
    assert data == (b"HTTP/1.1 426 \r\ncontent-length: 0\r\nconnection: close\r\n\r\n")


def test_shutdown_lets_a_running_response_finish_then_closes_1001(serve) -> None:
    stack = serve(text_reply("last ", "words"))
    stack.upstream.hold_before.add(1)
    with open_ws(stack) as ws, open_ws(stack) as idle:
        ws.send(create())
        assert stack.upstream.reached.wait(WAIT_S)
        stack.server.begin_shutdown()
        idle_code, _ = closed_code(idle)  # an idle socket goes at once
        stack.upstream.release()
        events = until_terminal(ws)
        code, _ = closed_code(ws)
    assert idle_code == 1001
    assert events[-1]["type"] == "response.completed"
    assert code == 1001


# -- sans-IO pieces ---------------------------------------------------------------------------


def test_parse_message_decisions() -> None:
    from functools import partial

    from tokenwire.gateway.http.requests import decode_json

    limit = 100
    parse_message = partial(_parse, decode=decode_json)
    assert parse_message(None, b"x", max_bytes=limit).close_code == 1003  # type: ignore
    assert parse_message("[1]", None, max_bytes=limit).close_code == 1007  # type: ignore
    assert parse_message("x" * 101, None, max_bytes=limit).close_code == 1009  # type: ignore
    bad = parse_message('{"type": "response.create", "generate": "no"}', None,
                        max_bytes=limit)
    assert bad.param == "generate" and bad.close_code is None  # type: ignore[union-attr]
    ok = parse_message('{"type": "response.create", "generate": false, "model": "m"}', None,
                       max_bytes=limit)
    assert ok.body == {"model": "m"} and ok.generate is False  # type: ignore[union-attr]


def test_socket_table_caps_per_address_then_in_all() -> None:
    table = SocketTable(max_sockets=3, max_per_client=2)
    assert [table.open("a"), table.open("a"), table.open("a")] == [None, None, 429]
    assert [table.open("b"), table.open("c")] == [None, 503]
    table.close("a")
    assert table.open("c") is None and len(table) == 3


def test_session_clock_idle_and_cap() -> None:
    clock = SessionClock(opened_at=0.0, idle_timeout_s=900.0, cap_s=3600.0)
    assert clock.wait_budget(0.0) == 900.0
    clock.response_ended(3000.0)
    assert clock.wait_budget(3000.0) == 600.0  # the cap comes before the idle deadline
    assert not clock.capped(3599.0) and clock.capped(3600.0)
    clock.response_ended(3700.0)  # a response ran across the cap: wait for the next message
    assert clock.over_cap and clock.wait_budget(3700.0) == 900.0


# -- the clock rules on a looptime loop, through an in-memory ASGI WebSocket -------------------


class MemorySocket:
    """An ASGI ``websocket`` scope driven from the test: ``send_text`` in, ``sent`` out."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[dict] = asyncio.Queue()
        self.sent: asyncio.Queue[dict] = asyncio.Queue()
        self.scope = {"type": "websocket", "path": "/v1/responses", "raw_path": b"/v1/responses",
                      "query_string": b"", "headers": [(b"host", b"x")], "root_path": "",
                      "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80),
                      "subprotocols": [], "scheme": "ws", "asgi": {"version": "3.0"},
                      "extensions": {"websocket.http.response": {}}}
        self.inbox.put_nowait({"type": "websocket.connect"})

    async def receive(self) -> dict:
        return await self.inbox.get()

    async def send(self, message: dict) -> None:
        await self.sent.put(message)

    async def next_json(self) -> dict:
        while True:
            msg = await self.sent.get()
            if msg["type"] == "websocket.send":
                return json.loads(msg["text"])
            if msg["type"] == "websocket.close":
                return {"closed": msg.get("code"), "reason": msg.get("reason")}

    def say(self, text: str) -> None:
        self.inbox.put_nowait({"type": "websocket.receive", "text": text})


def _looptime_session(script, body: Callable[[MemorySocket, GatewayState], Any],
                      **kw: Any) -> Any:
    async def main() -> Any:
        state = GatewayState(settings=ServerSettings(**kw), router=_router(PacedUpstream(script)))
        sock = MemorySocket()
        task = asyncio.create_task(create_app(state)(sock.scope, sock.receive, sock.send))
        assert (await sock.sent.get())["type"] == "websocket.accept"
        try:
            return await body(sock, state)
        finally:
            sock.inbox.put_nowait({"type": "websocket.disconnect", "code": 1000})
            await asyncio.wait_for(task, 10)

    with asyncio.Runner(loop_factory=lambda: looptime.new_event_loop(start=0)) as runner:
        return runner.run(main())


async def _terminal(sock: MemorySocket) -> list[dict]:
    out = [await sock.next_json()]
    while out[-1].get("type") not in ("response.completed", "response.failed", "error") \
            and "closed" not in out[-1]:
        out.append(await sock.next_json())
    return out


def test_an_idle_socket_is_closed_at_the_idle_timeout() -> None:
    async def body(sock: MemorySocket, state: GatewayState) -> Any:
        sock.say(create())
        await _terminal(sock)
        done_at = asyncio.get_running_loop().time()
        closed = await sock.next_json()
        return closed, asyncio.get_running_loop().time() - done_at

    closed, waited = _looptime_session(text_reply("hi"), body, ws_idle_timeout_s=900.0)
    assert closed == {"closed": 1000, "reason": "idle timeout"}
    assert waited == pytest.approx(900.0, abs=1.0)


def test_an_idle_socket_is_closed_at_the_60_minute_cap() -> None:
    async def body(sock: MemorySocket, state: GatewayState) -> Any:
        closed = await sock.next_json()
        return closed, asyncio.get_running_loop().time()

    closed, at = _looptime_session(text_reply("hi"), body, ws_idle_timeout_s=7200.0)
    assert closed == {"closed": 1000, "reason": CONNECTION_LIMIT_MESSAGE}
    assert at == pytest.approx(3600.0, abs=1.0)


def test_a_response_running_at_the_cap_finishes_then_the_next_create_is_refused() -> None:
    def slow(request: GenerationRequest) -> list[Event]:
        return [TokenDelta(text="long"), Finish(reason=FinishKind.EOS)]

    async def body(sock: MemorySocket, state: GatewayState) -> Any:
        await asyncio.sleep(3500.0)  # idle until 100 s before the cap (idle timeout 2 h)
        upstream = state.router.primary.upstream
        upstream.hold_before.add(1)
        upstream.loop_gate = asyncio.Event()
        sock.say(create())
        events = [await sock.next_json() for _ in range(4)]  # created .. first delta
        await asyncio.sleep(200.0)  # past the cap while the response runs
        upstream.loop_gate.set()
        events += await _terminal(sock)
        sock.say(create())
        refused = await sock.next_json()
        closed = await sock.next_json()
        return events, refused, closed

    events, refused, closed = _looptime_session(slow, body, ws_idle_timeout_s=7200.0,
                                                heartbeat_s=1000.0)
    assert events[-1]["type"] == "response.completed"
    assert refused["status"] == 400 and refused["error"]["code"] == CONNECTION_LIMIT_CODE
    assert refused["error"]["message"] == CONNECTION_LIMIT_MESSAGE
    assert closed["closed"] == 1000


def test_the_upgrade_meets_the_capacity_rule_a_429_when_nothing_could_be_admitted(
        serve) -> None:
    stack = serve(text_reply("busy"), max_concurrent=1, queue_size=0)
    stack.upstream.hold_before.add(1)
    with open_ws(stack) as ws:
        ws.send(create())
        assert stack.upstream.reached.wait(WAIT_S)  # the only slot is taken
        with pytest.raises(InvalidStatus) as refused:
            open_ws(stack)
        stack.upstream.release()
        assert until_terminal(ws)[-1]["type"] == "response.completed"
    assert refused.value.response.status_code == 429
    assert json.loads(refused.value.response.body)["error"]["code"] == "rate_limit_exceeded"


def test_the_upstreams_turn_state_is_kept_by_the_socket_for_its_next_turn(serve) -> None:
    from tokenwire.gateway.affinity import TURN_STATE_HEADER, wrap_turn_state
    from tokenwire.gateway.ir import ResponseMeta

    wrapped = wrap_turn_state("scripted", "sticky-1")

    def script(request: GenerationRequest) -> list[Event]:
        meta = [ResponseMeta(turn_state=wrapped)] if len(stack.upstream.requests) == 1 else []
        return [*meta, *text_reply("ok")(request)]

    stack = serve(script)
    with open_ws(stack) as ws:
        ws.send(create())
        first = until_terminal(ws)
        ws.send(create())  # Codex would echo it in client_metadata; the socket needs not
        until_terminal(ws)
    [meta] = [e for e in first if e["type"] == "response.metadata"]
    assert meta["headers"] == {TURN_STATE_HEADER: wrapped}  # Codex reads it as on SSE
    assert (TURN_STATE_HEADER, wrapped) in stack.upstream.requests[1].affinity


def test_a_bug_inside_one_response_is_a_500_error_and_the_socket_goes_on(
        serve, monkeypatch) -> None:
    from tokenwire.gateway.http import responses_ws

    real, calls = responses_ws.prepare_response, []

    def buggy(*args: Any, **kw: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("secret-bug-detail")
        return real(*args, **kw)

    monkeypatch.setattr(responses_ws, "prepare_response", buggy)
    stack = serve()
    with open_ws(stack) as ws:
        ws.send(create())
        [error] = until_terminal(ws)
        ws.send(create())
        assert until_terminal(ws)[-1]["type"] == "response.completed"
    assert error["status"] == 500 and error["error"]["code"] == "internal_error"
    assert "secret-bug-detail" not in json.dumps(error)
    assert stack.state.admission.counts() == (0, 0)


def test_the_http_body_deadline_does_not_cut_an_upgraded_socket(serve) -> None:
    """h11 still waits for the upgrade request's "body" when the socket changes hands: the
    guarded protocol's body backstop (body_timeout_s + 5 s) once closed every WebSocket at
    that age, mid-response (Codex saw "Connection reset without closing handshake")."""
    from tokenwire.gateway.http.connections import BODY_BACKSTOP_GRACE_S

    body_timeout = 0.2
    stack = serve(text_reply("still ", "here"), body_timeout_s=body_timeout)
    stack.upstream.hold_before.add(1)
    with open_ws(stack) as ws:
        ws.send(create())
        assert stack.upstream.reached.wait(WAIT_S)
        time.sleep(body_timeout + BODY_BACKSTOP_GRACE_S + 1.0)  # past the backstop
        stack.upstream.release()
        assert until_terminal(ws)[-1]["type"] == "response.completed"
        ws.send(create())
        assert until_terminal(ws)[-1]["type"] == "response.completed"


def test_a_peer_that_sends_pings_and_reads_nothing_is_not_read_either(serve) -> None:
    """Each Ping's Pong waits in the server's write buffer while the peer reads nothing;
    once that buffer is past the transport's mark the server stops reading the socket, so
    the peer's own sends block (they used to be read and answered without end: 300 MB of
    Pings grew the server by 450 MB). Sending 64 MB must block well before the end."""
    import base64
    import os
    import socket

    stack = serve()
    port = int(stack.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # read nothing, hold little
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /v1/responses HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                  f"Sec-WebSocket-Version: 13\r\nAuthorization: Bearer {KEY}\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    ping = bytes([0x89, 0x80 | 125]) + b"\0\0\0\0" + b"p" * 125  # masked, zero mask
    batch = ping * 8000  # ~1 MB
    sock.settimeout(5.0)  # a send that waits this long: the server stopped reading
    sent = 0
    try:
        while sent < 64:
            sock.sendall(batch)
            sent += 1
    except TimeoutError:
        pass
    finally:
        sock.close()
    assert sent < 64, "64 MB of Pings were all read while their Pongs went unread"
