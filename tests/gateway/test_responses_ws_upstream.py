"""One upstream WebSocket per client WebSocket (``upstreams/responses_socket.py``).

A Responses upstream with ``websocket = true`` gets, for each client Responses WebSocket whose
requests route to it, one upstream WebSocket. Shown two ways, both served as ``tokenwire
serve`` serves (``serve_stack``) and driven with the ``websockets`` client:

* tokenwire in front of tokenwire: the upstream instance serves ``GET /v1/responses`` over
  WebSocket (over an in-process scripted model), and a recorder inside its hardening counts
  its sockets and POSTs and keeps every message; the client's tool session must be ONE
  upstream socket, zero POSTs, continued by id, with the ids, usage and tool arguments the
  upstream sent;
* faults, against a scripted Responses upstream that offers both transports
  (``fakes_responses.ScriptedServer(websocket=True)``): the upgrade refused, a socket closed
  while idle, cut before output, cut after output, an oversized message.

The pure rule for continuing on the socket (:func:`continuation`) is tested on its own.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import looptime
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.gateway.test_codex_cli_ws import Recording
from tests.gateway.test_hardening import serve_stack, stop_stacks
from tests.gateway.test_responses_ws import PacedUpstream, text_reply
from tests.gateway.upstreams.fakes_responses import (
    ResponsesStream,
    Script,
    ScriptedServer,
    SocketScript,
    Turn,
    ws_messages,
)
from tokenwire.errors import ConfigError
from tokenwire.gateway.ir import (
    Event,
    Finish,
    FinishKind,
    GenerationRequest,
    IdsSource,
    ToolCallDelta,
    Usage,
)
from tokenwire.gateway.routing.router import Router, ServedModel
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.supervision.retry import RetryPolicy
from tokenwire.gateway.upstreams import responses_socket
from tokenwire.gateway.upstreams.base import ModelRoute, UpstreamConfig
from tokenwire.gateway.upstreams.responses_socket import (
    CLOSE_TIMEOUT_S,
    Remembered,
    UpstreamSocket,
    continuation,
    remembered,
    socket_url,
)
from tokenwire.gateway.upstreams.responses_upstream import ResponsesUpstream, parse_options

KEY = "tw-wsup-client-key-0123456789"
UP_KEY = "tw-wsup-upstream-key-0123456789"
UP_KEY_ENV = "TW_WSUP_UPSTREAM_KEY"
#: A safety net against a server that never answers, never the thing measured.
WAIT_S = 20.0
TERMINALS = ("response.completed", "response.failed", "response.incomplete", "error")


# -- continuing on the socket (pure) ---------------------------------------------------------

_USER = {"type": "message", "role": "user", "content": "run it"}
_CALL_OUT = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "sh",
             "arguments": "{}", "status": "completed"}
_CALL_IN = {"type": "function_call", "call_id": "c1", "name": "sh", "arguments": "{}"}
_OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "hi"}


def _last(**settings: Any) -> Remembered:
    body = {"model": "m", "store": False, "input": [_USER], **settings}
    done = remembered(body, {"id": "resp_up1", "output": [
        {"type": "reasoning", "id": "rs_0", "summary": []}, _CALL_OUT]})
    assert done is not None
    return done


def test_a_request_extending_the_last_one_sends_only_its_new_items() -> None:
    body = {"model": "m", "store": False, "input": [_USER, _CALL_IN, _OUTPUT]}
    assert continuation(_last(), body) == {"model": "m", "store": False,
                                           "previous_response_id": "resp_up1",
                                           "input": [_OUTPUT]}


@pytest.mark.parametrize("body", [
    {"model": "m", "store": False, "input": [_USER, _OUTPUT]},  # the answer not replayed
    {"model": "m", "store": False, "input": [_USER, {**_CALL_IN, "arguments": "{\"x\":1}"},
                                            _OUTPUT]},  # an edited answer
    {"model": "m", "store": False, "input": [{**_USER, "content": "other"}, _CALL_IN,
                                            _OUTPUT]},  # an edited history
    {"model": "m2", "store": False, "input": [_USER, _CALL_IN, _OUTPUT]},  # another field
    {"model": "m", "store": False, "input": [_USER, _CALL_IN]},  # nothing new
    {"model": "m", "store": False, "input": "text"},
])
def test_anything_else_goes_whole(body: dict) -> None:
    assert continuation(_last(), body) is None
    assert continuation(None, body) is None


def test_the_socket_url_and_the_option() -> None:
    assert socket_url("http://h:1/v1") == "ws://h:1/v1/responses"
    assert socket_url("https://api.example/v1") == "wss://api.example/v1/responses"
    assert parse_options("u", {}) == {"websocket": False}
    assert parse_options("u", {"websocket": True}) == {"websocket": True}
    with pytest.raises(ConfigError, match="websocket must be true or false"):
        parse_options("u", {"websocket": "yes"})
    with pytest.raises(ConfigError, match="unknown responses option 'web_socket'"):
        parse_options("u", {"web_socket": True})


# -- helpers ---------------------------------------------------------------------------------


def _responses_router(base_url: str, model: str, upstream_model: str, *,
                      websocket: bool = True) -> Router:
    cfg = UpstreamConfig(name="up", kind="responses", base_url=base_url, api_key_env=UP_KEY_ENV,
                         options={"websocket": websocket},
                         models=(ModelRoute(name=model, upstream_model=upstream_model),))
    up = ResponsesUpstream.from_config(cfg)
    return Router([ServedModel(name=model, upstream=up, ids_source=IdsSource.NONE,
                               upstream_name="up")], default=model)


def _open(url: str) -> ClientConnection:
    return connect(url.replace("http://", "ws://") + "/v1/responses", proxy=None,
                   open_timeout=WAIT_S, additional_headers={"Authorization": f"Bearer {KEY}"})


def _create(model: str, **fields: Any) -> str:
    return json.dumps({"type": "response.create", "model": model, "store": False, **fields})


def _until_terminal(ws: ClientConnection) -> list[dict]:
    out: list[dict] = []
    while True:
        out.append(json.loads(ws.recv(timeout=WAIT_S)))
        if out[-1]["type"] in TERMINALS:
            return out


def _wait(check: Any) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, "the condition never came true"
        time.sleep(0.01)


def _metric(state: Any, outcome: str) -> float:
    value = state.observability.registry.get_sample_value(
        "tokenwire_upstream_websockets_total", {"upstream": "up", "outcome": outcome})
    return value or 0.0


@pytest.fixture(scope="module")
def module_patch() -> Iterator[pytest.MonkeyPatch]:
    patch = pytest.MonkeyPatch()
    patch.setenv(UP_KEY_ENV, UP_KEY)
    yield patch
    patch.undo()


# -- tokenwire in front of tokenwire ---------------------------------------------------------

_ARGS = '{"cmd": "echo hi"}'


def _session_script(request: GenerationRequest) -> list[Event]:
    """Turn 1 calls a tool; after its output, words; after the next user turn, more."""
    msgs = request.prompt.messages  # type: ignore[union-attr]
    if msgs[-1].role == "user" and len(msgs) > 1:
        return text_reply("Bye.")(request)
    if msgs[-1].role == "tool":
        return [*text_reply("It printed hi.")(request)[:-2],
                Usage(prompt_tokens=40, completion_tokens=5), Finish(reason=FinishKind.EOS)]
    return [ToolCallDelta(index=0, id="call_pair1", name="exec_command", arguments=_ARGS[:9]),
            ToolCallDelta(index=0, arguments=_ARGS[9:]),
            Usage(prompt_tokens=21, completion_tokens=9), Finish(reason=FinishKind.TOOL_CALLS)]


@pytest.fixture(scope="module")
def pair(module_patch) -> Iterator[tuple[Any, Any, PacedUpstream]]:
    """(gateway stack, upstream stack, the upstream's model): both ``serve_gateway``."""
    running: list[tuple[Any, threading.Thread]] = []
    model = PacedUpstream(_session_script)
    inner = Router([ServedModel(name="scripted", upstream=model, ids_source=IdsSource.NONE,
                                upstream_name="scripted")], default="scripted")
    upstream = serve_stack(module_patch, running, ServerSettings(api_keys=(UP_KEY,),
                                                                 auth="keys"),
                           router=inner, wrap=Recording)
    gateway = serve_stack(module_patch, running, ServerSettings(api_keys=(KEY,), auth="keys"),
                          router=_responses_router(upstream.url + "/v1", "m", "scripted"))
    yield gateway, upstream, model
    stop_stacks(pytest.MonkeyPatch(), running)


def test_a_tool_session_through_tokenwire_is_one_upstream_socket_continued_by_id(pair) -> None:
    gateway, upstream, model = pair
    tools = [{"type": "function", "name": "exec_command", "description": "run",
              "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
    with _open(gateway.url) as ws:
        ws.send(_create("m", tools=tools, input=[{"type": "message", "role": "user",
                                                  "content": "run echo hi"}]))
        one = _until_terminal(ws)
        first = one[-1]["response"]
        [call] = [i for i in first["output"] if i["type"] == "function_call"]
        ws.send(_create("m", tools=tools, previous_response_id=first["id"], input=[
            {"type": "function_call_output", "call_id": call["call_id"], "output": "hi\n"}]))
        second = _until_terminal(ws)[-1]["response"]
        ws.send(_create("m", tools=tools, previous_response_id=second["id"],
                        input=[{"type": "message", "role": "user", "content": "thanks"}]))
        third = _until_terminal(ws)[-1]["response"]
    _wait(lambda: len(upstream.app.sockets) == 1 and upstream.app.sockets[0]["out"]
          and upstream.app.sockets[0]["out"][-1]["type"] == "response.completed")
    # ONE upstream socket, zero POSTs, the upstream's key on the upgrade (not the client's).
    assert len(upstream.app.sockets) == 1 and upstream.app.posts == []
    sock = upstream.app.sockets[0]
    assert sock["headers"]["authorization"] == f"Bearer {UP_KEY}"
    assert sock["headers"]["openai-beta"] == "responses_websockets=2026-02-06"
    # What the client got is what the upstream sent: the call's id and arguments, usage.
    up_done = [m["response"] for m in sock["out"] if m["type"] == "response.completed"]
    [up_call] = [i for i in up_done[0]["output"] if i["type"] == "function_call"]
    assert (call["call_id"], call["arguments"]) == (up_call["call_id"], up_call["arguments"]) \
        == ("call_pair1", _ARGS)
    assert "".join(e["delta"] for e in one if e["type"] ==
                   "response.function_call_arguments.delta") == _ARGS
    for mine, theirs in zip((first, second, third), up_done, strict=True):
        assert mine["usage"] == theirs["usage"]
        assert mine["id"] != theirs["id"]  # the gateway's own ids, mapped per socket
    assert first["usage"]["input_tokens"] == 21 and second["usage"]["output_tokens"] == 5
    assert second["output"][0]["content"][0]["text"] == "It printed hi."
    # Turns 2 and 3 continued the upstream's own last response with only the new items.
    creates = sock["in"]
    assert [c.get("previous_response_id") for c in creates] == [None, up_done[0]["id"],
                                                               up_done[1]["id"]]
    assert [[i["type"] for i in c["input"]] for c in creates[1:]] == [
        ["function_call_output"], ["message"]]
    assert all(c["store"] is False and c["model"] == "scripted" for c in creates)
    # ...and the model behind the upstream saw the whole conversation each time.
    roles = [[m.role for m in r.prompt.messages] for r in model.requests]  # type: ignore[union-attr]
    assert roles == [["user"], ["user", "assistant", "tool"],
                     ["user", "assistant", "tool", "assistant", "user"]]
    assert _metric(gateway.state, "opened") == 1.0


def test_the_client_closing_closes_the_upstream_socket(pair) -> None:
    gateway, upstream, _ = pair
    _wait(lambda: len(upstream.state.ws_sessions) == 0)  # an earlier test's, still closing
    with _open(gateway.url) as ws:
        ws.send(_create("m", input="hello"))
        _until_terminal(ws)
        assert len(upstream.state.ws_sessions) == 1
    _wait(lambda: len(upstream.state.ws_sessions) == 0)


# -- faults, against a scripted upstream -----------------------------------------------------


@pytest.fixture(scope="module")
def scripted(module_patch) -> Iterator[tuple[Any, ScriptedServer]]:
    srv = ScriptedServer(stream_path="/v1/responses", models_path="/v1/models", websocket=True)
    running: list[tuple[Any, threading.Thread]] = []
    gateway = serve_stack(module_patch, running, ServerSettings(api_keys=(KEY,), auth="keys"),
                          router=_responses_router(srv.url + "/v1", "g", "gpt-test"))
    yield gateway, srv
    stop_stacks(pytest.MonkeyPatch(), running)
    srv.stop()


@pytest.fixture
def fake(scripted) -> tuple[Any, ScriptedServer]:
    gateway, srv = scripted
    srv.requests.clear()
    srv.sockets.clear()
    srv.disconnected.clear()
    return gateway, srv


def _answer(rid: str, *words: str) -> list[str]:
    return ws_messages(ResponsesStream(rid).message(list(words)).completed().chunks())


def test_a_refused_upgrade_falls_back_to_http_for_the_session(fake) -> None:
    gateway, srv = fake
    refused = _metric(gateway.state, "refused")
    srv.socket_scripts.append(SocketScript(refuse=426))
    srv.push(Script(chunks=ResponsesStream("resp_h1").message(["over ", "HTTP"]).completed()
                    .chunks()),
             Script(chunks=ResponsesStream("resp_h2").message(["again"]).completed().chunks()))
    with _open(gateway.url) as ws:
        ws.send(_create("g", input="one"))
        one = _until_terminal(ws)[-1]
        ws.send(_create("g", input="two"))
        two = _until_terminal(ws)[-1]
    assert one["type"] == two["type"] == "response.completed"
    assert one["response"]["output"][0]["content"][0]["text"] == "over HTTP"
    # One refused upgrade, then HTTP for the rest of the session (no second upgrade).
    assert len(srv.sockets) == 1 and not srv.sockets[0].accepted
    assert [r.path for r in srv.requests] == ["/v1/responses", "/v1/responses"]
    assert srv.requests[0].headers["authorization"] == f"Bearer {UP_KEY}"
    assert _metric(gateway.state, "refused") == refused + 1


def test_a_busy_upgrade_answer_is_a_connection_failure_not_a_refusal(fake,
                                                                    monkeypatch) -> None:
    """A 503 on the upgrade says the upstream is busy now, not that it has no sockets: the
    retry opens a socket, and the session does not switch to HTTP."""
    monkeypatch.setattr(RetryPolicy, "backoff", lambda self, n, rng: 0.0)  # no real wait
    gateway, srv = fake
    refused = _metric(gateway.state, "refused")
    srv.socket_scripts += [SocketScript(refuse=503),
                           SocketScript(turns=[Turn(_answer("resp_s", "socket"))])]
    with _open(gateway.url) as ws:
        ws.send(_create("g", input="one"))
        last = _until_terminal(ws)[-1]
    assert last["type"] == "response.completed", last["response"].get("error")
    assert last["response"]["output"][0]["content"][0]["text"] == "socket"
    assert [s.accepted for s in srv.sockets] == [False, True] and srv.requests == []
    assert _metric(gateway.state, "refused") == refused


def test_an_upstream_closing_with_1009_is_the_clients_413_not_a_502(fake) -> None:
    """The upstream closed first with 1009 (our request over its message limit): the
    client's request is too large; before, the echoed close read as the upstream's fault."""
    gateway, srv = fake
    srv.socket_scripts.append(SocketScript(turns=[Turn(then="too_big")]))
    with _open(gateway.url) as ws:
        ws.send(_create("g", input="one"))
        last = _until_terminal(ws)[-1]
    # response.created went out before the upstream answered: the end is response.failed,
    # with the Responses API's own code for a request that cannot succeed as sent.
    assert last["type"] == "response.failed", last
    error = last["response"]["error"]
    assert error["code"] == "invalid_prompt" and "message limit" in error["message"], error


def test_a_socket_the_upstream_closed_while_idle_is_reopened(fake) -> None:
    gateway, srv = fake
    srv.socket_scripts += [SocketScript(turns=[Turn(_answer("resp_a", "first"), then="close")]),
                           SocketScript(turns=[Turn(_answer("resp_b", "second"))])]
    with _open(gateway.url) as ws:
        ws.send(_create("g", input="one"))
        assert _until_terminal(ws)[-1]["type"] == "response.completed"
        _wait(srv.sockets[0].closed.is_set)
        ws.send(_create("g", input=[{"type": "message", "role": "user", "content": "one"},
                                    {"type": "message", "role": "assistant", "content": "first"},
                                    {"type": "message", "role": "user", "content": "two"}]))
        last = _until_terminal(ws)[-1]
    assert last["response"]["output"][0]["content"][0]["text"] == "second"
    assert [s.accepted for s in srv.sockets] == [True, True] and srv.requests == []
    # A new socket remembers nothing: the request went whole.
    [sent] = srv.sockets[1].received
    assert "previous_response_id" not in sent and len(sent["input"]) == 3


def test_a_socket_cut_before_output_is_retried_on_a_new_socket(fake, monkeypatch) -> None:
    monkeypatch.setattr(RetryPolicy, "backoff", lambda self, n, rng: 0.0)  # no real wait
    gateway, srv = fake
    srv.socket_scripts += [SocketScript(turns=[Turn([], then="break")]),
                           SocketScript(turns=[Turn(_answer("resp_r", "retried"))])]
    with _open(gateway.url) as ws:
        ws.send(_create("g", input="one"))
        events = _until_terminal(ws)
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "retried"
    assert len(srv.sockets) == 2 and srv.requests == []
    assert srv.sockets[0].received[0]["input"] == srv.sockets[1].received[0]["input"]


def _retries(state: Any) -> float:
    value = state.observability.registry.get_sample_value(
        "tokenwire_retries_total", {"upstream": "up", "budget": "connection"})
    return value or 0.0


def test_a_reused_socket_cut_after_the_request_was_written_is_a_budgeted_retry(
        fake, monkeypatch) -> None:
    """The upstream read turn 2 on the reused socket, then broke: it may have started it, so
    the gateway must not resend it on its own as if the socket had been found closed. It is
    the HTTP path's "connection lost before any byte came back": a CONNECTION failure the
    supervisor retries on its connection budget (before output only), on a new socket."""
    monkeypatch.setattr(RetryPolicy, "backoff", lambda self, n, rng: 0.0)  # no real wait
    gateway, srv = fake
    retries, lost = _retries(gateway.state), _metric(gateway.state, "lost")
    srv.socket_scripts += [SocketScript(turns=[Turn(_answer("resp_1", "first")),
                                               Turn([], then="break")]),
                           SocketScript(turns=[Turn(_answer("resp_2", "second"))])]
    with _open(gateway.url) as ws:
        ws.send(_create("g", input="one"))
        assert _until_terminal(ws)[-1]["type"] == "response.completed"
        ws.send(_create("g", input="two"))
        last = _until_terminal(ws)[-1]
    assert last["type"] == "response.completed", last["response"].get("error")
    assert last["response"]["output"][0]["content"][0]["text"] == "second"
    # The upstream saw turn 2 on the first socket; the resend was the budget's one retry.
    assert [len(s.received) for s in srv.sockets] == [2, 1]
    assert _retries(gateway.state) == retries + 1
    assert _metric(gateway.state, "lost") == lost + 1


def test_a_reused_socket_cut_after_the_write_is_an_error_when_the_budget_refuses(
        fake, monkeypatch) -> None:
    """The same cut when the budget refuses the retry (its wait would pass the budget's
    window): the client gets the connection error, and the request reached the upstream
    exactly once."""
    monkeypatch.setattr(RetryPolicy, "backoff", lambda self, n, rng: 1e9)  # over the window
    gateway, srv = fake
    srv.socket_scripts += [SocketScript(turns=[Turn(_answer("resp_3", "first")),
                                               Turn([], then="break")])]
    with _open(gateway.url) as ws:
        ws.send(_create("g", input="one"))
        assert _until_terminal(ws)[-1]["type"] == "response.completed"
        ws.send(_create("g", input="two"))
        last = _until_terminal(ws)[-1]
    assert last["type"] == "response.failed", last
    assert "before answering" in last["response"]["error"]["message"]
    assert len(srv.sockets) == 1 and len(srv.sockets[0].received) == 2


def test_a_socket_cut_after_output_is_the_http_stream_cut_error(fake) -> None:
    gateway, srv = fake
    partial = _answer("resp_c", "half ", "way")[:5]  # created..the first delta
    srv.socket_scripts.append(SocketScript(turns=[Turn(partial, then="break")]))
    with _open(gateway.url) as ws:
        ws.send(_create("g", input="one"))
        events = _until_terminal(ws)
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert deltas == ["half "] and len(srv.sockets) == 1  # nothing replayed
    failed = events[-1]
    assert failed["type"] == "response.failed"
    # UPSTREAM after output, as an HTTP stream cut: Codex's retryable server_error.
    assert failed["response"]["error"]["code"] == "server_error"
    assert "closed mid-response" in failed["response"]["error"]["message"]


def test_a_client_leaving_mid_response_closes_the_upstream_socket(fake) -> None:
    gateway, srv = fake
    partial = _answer("resp_l", "still ", "going")[:5]  # the response never ends upstream
    srv.socket_scripts.append(SocketScript(turns=[Turn(partial)]))
    with _open(gateway.url) as ws:
        ws.send(_create("g", input="one"))
        while json.loads(ws.recv(timeout=WAIT_S))["type"] != "response.output_text.delta":
            pass
    # Its generation must stop: the upstream socket goes, as an HTTP response would.
    _wait(srv.disconnected.is_set)
    _wait(lambda: gateway.state.admission.counts() == (0, 0))


def test_an_oversized_upstream_message_is_a_typed_error(fake, monkeypatch) -> None:
    monkeypatch.setattr(responses_socket, "MAX_MESSAGE_BYTES", 4096)
    gateway, srv = fake
    big = _answer("resp_o", "x" * 8192)
    srv.socket_scripts.append(SocketScript(turns=[Turn(big)]))
    with _open(gateway.url) as ws:
        ws.send(_create("g", input="one"))
        events = _until_terminal(ws)
    failed = events[-1]
    assert failed["type"] == "response.failed"
    assert "over 4096 bytes" in failed["response"]["error"]["message"]
    assert len(srv.sockets) == 1  # final: the same bytes would come again
    _wait(lambda: srv.disconnected.is_set())  # the socket was closed (1009)


def test_the_upstream_websocket_flag_sets_the_option_on_responses_upstreams() -> None:
    import argparse

    from tokenwire.cli import serve as serve_cmd

    parser = argparse.ArgumentParser()
    serve_cmd.register(parser.add_subparsers())

    def config(*argv: str) -> Any:
        args = parser.parse_args(["serve", *argv])
        return serve_cmd.gateway_config_from_args(args, env={})

    on = config("--upstream", "http://a:1/v1", "--upstream-kind", "responses",
                "--upstream-websocket")
    assert [u.options for u in on.upstreams] == [{"websocket": True}]
    off = config("--upstream", "http://a:1/v1", "--upstream-kind", "responses")
    assert [u.options for u in off.upstreams] == [{}]
    with pytest.raises(ConfigError, match="--upstream-websocket applies to Responses"):
        config("--upstream", "http://a:1/v1", "--upstream-websocket")


def test_shutdown_closes_the_client_socket_and_then_the_upstream_one(scripted) -> None:
    _, srv = scripted
    srv.sockets.clear()
    srv.disconnected.clear()
    srv.socket_scripts.append(SocketScript(turns=[Turn(_answer("resp_s", "bye"))]))
    running: list[tuple[Any, threading.Thread]] = []
    patch = pytest.MonkeyPatch()
    gateway = serve_stack(patch, running, ServerSettings(api_keys=(KEY,), auth="keys"),
                          router=_responses_router(srv.url + "/v1", "g", "gpt-test"))
    try:
        with _open(gateway.url) as ws:
            ws.send(_create("g", input="one"))
            assert _until_terminal(ws)[-1]["type"] == "response.completed"
            gateway.server.should_exit = True  # an idle client socket: closed at once (1001)
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=WAIT_S)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
        _wait(srv.disconnected.is_set)  # ...and the upstream socket held for it
    finally:
        stop_stacks(patch, running)


class _StuckConnection:
    """An upstream socket whose close handshake never ends (a peer that stopped reading:
    websockets' close() first drains the send buffer, with no deadline of its own)."""

    def __init__(self) -> None:
        self.aborted = self.close_started = False
        self.transport = self

    def abort(self) -> None:
        self.aborted = True

    async def close(self) -> None:
        self.close_started = True
        await asyncio.Event().wait()


def _stuck_socket() -> tuple[UpstreamSocket, _StuckConnection]:
    sock = UpstreamSocket(upstream="up", url="ws://127.0.0.1:9/v1/responses", headers={},
                          open_timeout_s=5.0, note=lambda upstream, outcome: None)
    conn = _StuckConnection()
    sock._conn = conn  # type: ignore[assignment]  # the fault under test
    return sock, conn


def test_closing_a_stuck_upstream_socket_is_bounded_then_aborted() -> None:
    async def main() -> tuple[float, _StuckConnection]:
        sock, conn = _stuck_socket()
        loop = asyncio.get_running_loop()
        await sock.aclose()
        return loop.time(), conn

    with asyncio.Runner(loop_factory=lambda: looptime.new_event_loop(start=0)) as runner:
        at, conn = runner.run(main())
    assert conn.close_started and conn.aborted and at == CLOSE_TIMEOUT_S


def test_closing_while_a_response_runs_aborts_without_a_handshake() -> None:
    async def main() -> _StuckConnection:
        sock, conn = _stuck_socket()
        async with sock.lock:  # a response still reading from the socket
            await sock.aclose()
        return conn

    conn = asyncio.run(main())
    assert conn.aborted and not conn.close_started
