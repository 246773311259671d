"""A streamed generation's response head leaves with its first body (``asgi.CORK_EXTENSION``).

Written alone, the head woke the client, which read it on the gateway's core before the
gateway could write the first token (BENCHMARKS.md, "Session of 2026-12-05 (2)"). The check:
loopback TCP puts a written segment in the peer's receive queue before ``write`` returns,
so at the moment the gateway hands its first body to the server, a peek at the client's
socket shows whether the head already went out. Corked, it has not; uncorked (a plain
Starlette route, the control), it has. Served by the real server on both event loops.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .raw_sockets import CLOSE_WAIT_S, EVENT_LOOPS, connect_from, read_until_closed
from .test_hardening import KEY, SIMPLE, Scripted, serve_stack, stop_stacks

#: Safety net for the server to reach its first body write (it is never the thing measured).
WAIT_S = 60


class PeekAtFirstBody:
    """Inside the hardening: when the app sends its first body message, records whether the
    client's socket had received anything yet (the head), then lets the body go."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.client: socket.socket | None = None
        self.head_out_before_body: bool | None = None
        self.observed = threading.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def peeking(message: Any) -> None:
            if message["type"] == "http.response.body" and not self.observed.is_set():
                self.head_out_before_body = self._client_has_bytes()
                self.observed.set()
            await send(message)

        await self.app(scope, receive, peeking)

    def _client_has_bytes(self) -> bool:
        assert self.client is not None
        try:
            return bool(self.client.recv(65536, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except BlockingIOError:
            return False


@pytest.fixture(params=EVENT_LOOPS)
def served(request: Any, smollm2_map: Any) -> Iterator[Callable[[list], Any]]:
    """``served(script) -> (port, peek)``: the gateway over a scripted upstream replaying
    ``script``, with :class:`PeekAtFirstBody` inside its hardening."""
    from tokenwire.gateway.settings import ServerSettings

    if request.param == "uvloop":
        pytest.importorskip("uvloop")
    running: list = []
    patch = pytest.MonkeyPatch()

    def start(script: list) -> Any:
        settings = ServerSettings(api_keys=(KEY,), auth="keys", event_loop=request.param)
        stack = serve_stack(patch, running, settings, smollm2_map,
                            upstream=Scripted(script), wrap=PeekAtFirstBody)
        return stack.port, stack.app

    yield start
    stop_stacks(patch, running)


def _exchange(port: int, peek: PeekAtFirstBody, head: bytes) -> bytes:
    """Send ``head`` (a whole request), wait until the server wrote its first body, and
    return the whole answer (each request closes its connection)."""
    with connect_from(port) as conn:
        peek.client = conn
        conn.sendall(head)
        assert peek.observed.wait(WAIT_S), "the server never wrote a body"
        return read_until_closed(conn, CLOSE_WAIT_S)


def _chat(stream: bool) -> bytes:
    body = json.dumps({"model": "scripted", "stream": stream,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Authorization: Bearer " + KEY.encode() + b"\r\nAccept-Encoding: identity\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


def test_a_streamed_answer_s_head_waits_for_its_first_token(served) -> None:
    port, peek = served(SIMPLE)
    answer = _exchange(port, peek, _chat(stream=True))
    assert peek.head_out_before_body is False
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"text/event-stream" in head
    assert b'"content":"a"' in body and b"data: [DONE]" in body


def test_the_peek_sees_a_head_written_alone(served) -> None:
    """The control: a Starlette route writes its head, then its body, uncorked; the peek
    finds the head already at the client, so the checks above can fail."""
    port, peek = served(SIMPLE)
    answer = _exchange(port, peek, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close"
                       b"\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert peek.head_out_before_body is True


def test_a_kept_alive_connection_corks_each_of_its_streamed_answers(served) -> None:
    """The cork belongs to one request's cycle: two streamed requests on one connection,
    each answer whole (its head held for its own first body, then released)."""
    port, peek = served(SIMPLE)
    first = _chat(stream=True).replace(b"Connection: close\r\n", b"")
    with connect_from(port) as conn:
        peek.client = conn
        conn.sendall(first)
        assert peek.observed.wait(WAIT_S), "the server never wrote a body"
        answer = b""
        while not answer.endswith(b"0\r\n\r\n"):  # the first answer's chunked end
            data = conn.recv(65536)
            assert data, "the connection closed before the first answer ended"
            answer += data
        conn.sendall(_chat(stream=True))  # the second asks to close after its answer
        answer += read_until_closed(conn, CLOSE_WAIT_S)
    assert peek.head_out_before_body is False
    assert answer.count(b"HTTP/1.1 200 ") == 2 and answer.count(b"data: [DONE]") == 2
    assert answer.count(b'"content":"a"') == 2


def test_the_cork_holds_a_cycle_s_writes_and_sends_them_as_one() -> None:
    """``held_writes.cork_cycle`` on a stand-in cycle and transport: the writes while corked
    leave as one write when it comes off; a close while corked sends them first; a transport
    closed under the cork gets nothing; anything else is the transport's own."""
    from tokenwire.gateway.http.held_writes import cork_cycle as _cork

    class Transport:
        def __init__(self) -> None:
            self.writes: list[bytes] = []
            self.closed = False

        def write(self, data: bytes) -> None:
            self.writes.append(data)

        def close(self) -> None:
            self.closed = True

        def is_closing(self) -> bool:
            return self.closed

        def get_extra_info(self, name: str) -> str:
            return f"info {name}"

    class Cycle:
        def __init__(self, transport: Transport) -> None:
            self.transport: Any = transport

    transport = Transport()
    cycle = Cycle(transport)
    _cork(cycle, False)  # uncorked already: nothing changes
    assert cycle.transport is transport
    _cork(cycle, True)
    _cork(cycle, True)  # twice is once
    cycle.transport.write(b"head")
    cycle.transport.write(b"body")
    assert transport.writes == [] and cycle.transport.get_extra_info("x") == "info x"
    _cork(cycle, False)
    assert transport.writes == [b"headbody"] and cycle.transport is transport
    _cork(cycle, True)
    cycle.transport.write(b"last")
    cycle.transport.close()  # uvicorn closing a connection that is not kept alive
    assert transport.writes[-1] == b"last" and transport.closed
    gone = Transport()
    cycle = Cycle(gone)
    _cork(cycle, True)
    cycle.transport.write(b"head")
    gone.closed = True  # the client left
    _cork(cycle, False)
    assert gone.writes == [] and cycle.transport is gone


# -- HTTP/2: the HEADERS frame waits in h2's buffer for the first DATA frame -------------------


def _frames(data: bytes) -> list[tuple[int, int]]:
    """(type, stream id) of each whole HTTP/2 frame in ``data``."""
    out, at = [], 0
    while at + 9 <= len(data):
        length = int.from_bytes(data[at:at + 3], "big")
        out.append((data[at + 3], int.from_bytes(data[at + 5:at + 9], "big") & 0x7FFFFFFF))
        at += 9 + length
    return out


class PeekForHeaders(PeekAtFirstBody):
    """Over HTTP/2 the client's socket also holds SETTINGS and WINDOW_UPDATE frames: what
    counts is whether a HEADERS frame (type 1) was there before the first body."""

    def _client_has_bytes(self) -> bool:
        assert self.client is not None
        try:
            data = self.client.recv(65536, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        return any(kind == 1 for kind, _ in _frames(data))


@pytest.mark.parametrize(("path", "corked"), [("/v1/chat/completions", True),
                                              ("/v1/models", False)])
def test_over_http2_the_head_waits_for_the_first_body(smollm2_map, path, corked) -> None:
    from tokenwire.gateway.settings import ServerSettings

    from .test_http2 import RawH2

    running: list = []
    patch = pytest.MonkeyPatch()
    stack = serve_stack(patch, running, ServerSettings(api_keys=(KEY,), auth="keys"),
                        smollm2_map, upstream=Scripted(SIMPLE), wrap=PeekForHeaders)
    peek, client = stack.app, RawH2(stack.port)
    try:
        peek.client = client.sock
        body = json.dumps({"model": "scripted", "stream": True,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()
        sid = client.request("POST", path, body, {"content-type": "application/json"}) \
            if path.endswith("completions") else client.request("GET", path)
        assert peek.observed.wait(WAIT_S), "the server never wrote a body"
        client.pump(lambda: sid in client.ended)
        assert client.heads[sid][b":status"] == b"200"
        assert peek.head_out_before_body is (not corked)
    finally:
        client.close()
        stop_stacks(patch, running)
