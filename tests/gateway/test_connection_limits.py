"""Connection limits, tested only through raw sockets against a real server (issue 11 item 1).

The server is what ``serve_gateway`` serves (scripted upstream behind it), in a thread on
its own loopback port; nothing here touches the HTTP server's internals, so a later change
of server keeps these tests. Every deadline is configured short by the test itself; waits
are generous safety nets, never the thing measured.

Before the fix a silent or half-head connection was never closed, 520 of them made every
route answer a bare 503, and a body after a refusal could be dripped for ever.
"""

from __future__ import annotations

import json
import resource
import socket
import time
from collections.abc import Callable, Iterator

import pytest

from tokenwire.gateway.http.connections import MAX_HEAD_BYTES
from tokenwire.gateway.settings import ServerSettings

from .raw_sockets import (
    CLOSE_WAIT_S,
    EVENT_LOOPS,
    connect_from,
    keyed_stacks,
    read_all_until_closed,
    read_until_closed,
    wait_busy,
)
from .test_hardening import KEY, Stack

HALF_HEAD = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: "


@pytest.fixture(scope="module", params=EVENT_LOOPS)
def guarded(request, smollm2_map) -> Iterator[Callable[..., Stack]]:
    """``guarded(**settings) -> Stack``: ``serve_gateway`` on a socket with a deep backlog,
    once per event loop ``tokenwire serve`` can run on."""
    yield from keyed_stacks(smollm2_map, backlog=4096, event_loop=request.param)


@pytest.fixture(scope="module")
def guarded_default_loop(smollm2_map) -> Iterator[Callable[..., Stack]]:
    """``guarded`` on the default loop only, for the flood test: it waits out a 30 s head
    deadline, and the eviction and caps it relies on are tested on both loops above it."""
    yield from keyed_stacks(smollm2_map, backlog=4096)


def _request(port: int, head: bytes, source: str = "127.0.0.1") -> bytes:
    with connect_from(port, source) as conn:
        conn.sendall(head)
        return read_until_closed(conn)


AUTHED = (f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
          "Connection: close\r\n\r\n").encode()


def _status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else 0


def test_the_server_runs_on_the_event_loop_under_test(guarded, request) -> None:
    assert guarded().loop == request.node.callspec.params["guarded"]


# -- deadlines ---------------------------------------------------------------------------------


def test_a_silent_connection_is_closed_at_the_head_deadline(guarded) -> None:
    stack = guarded(head_timeout_s=0.5)
    with connect_from(stack.port) as conn:
        assert read_until_closed(conn) == b""  # nothing was asked, nothing is answered


def test_half_a_head_gets_408_and_is_closed_even_while_it_keeps_dripping(guarded) -> None:
    stack = guarded(head_timeout_s=1.0)
    with connect_from(stack.port) as conn:
        conn.sendall(HALF_HEAD)
        conn.settimeout(0.1)
        data = b""
        for _ in range(int(CLOSE_WAIT_S / 0.1)):  # one header byte every 0.1 s
            try:
                conn.sendall(b"a")
                chunk = conn.recv(4096)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            if not chunk:
                break
            data += chunk
        else:
            pytest.fail("a dripping head was never closed")
    assert data.startswith(b"HTTP/1.1 408 ")


def test_a_keep_alive_connection_gets_a_fresh_head_deadline_after_each_response(guarded) -> None:
    stack = guarded(head_timeout_s=1.0)
    with connect_from(stack.port) as conn:
        conn.sendall(AUTHED.replace(b"Connection: close\r\n", b""))
        conn.settimeout(CLOSE_WAIT_S)
        first = conn.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 ")
        conn.sendall(HALF_HEAD)
        rest = read_until_closed(conn)
        assert rest.endswith(b"\r\n\r\n") and b"HTTP/1.1 408 " in first + rest


def test_a_body_nobody_reads_is_cut_at_the_body_backstop(guarded) -> None:
    stack = guarded(body_timeout_s=0.2)
    # A GET route answers without reading the body and keeps the connection: only the
    # backstop can close it (it stays open for ever without one).
    head = (f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Length: 1000\r\n\r\n{").encode()
    with connect_from(stack.port) as conn:
        conn.sendall(head)
        data = read_until_closed(conn)
    assert data.startswith(b"HTTP/1.1 200 ") and b"HTTP/1.1 408" not in data


# -- the parser: head size, pipelining, upgrades it does not serve -------------------------------


def _responses(data: bytes) -> list[tuple[bytes, bytes]]:
    """Consecutive responses, each with a Content-Length, as (head, body); nothing left."""
    out = []
    while data:
        head, _, data = data.partition(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        out.append((head, data[:length]))
        data = data[length:]
    return out


def test_a_head_that_grows_past_the_limit_over_many_reads_gets_431(guarded) -> None:
    stack = guarded()
    with connect_from(stack.port) as conn:
        conn.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
        # Separate reads, counted across them; then nothing more (bytes sent after the
        # server closed would reset the socket before its answer is read).
        for _ in range(MAX_HEAD_BYTES // 1024 + 1):
            conn.sendall(b"X-Pad: " + b"a" * 1015 + b"\r\n")
            time.sleep(0.01)
        assert read_until_closed(conn).startswith(b"HTTP/1.1 431 ")


def test_a_head_just_under_the_limit_is_served(guarded) -> None:
    stack = guarded()
    head = AUTHED.replace(b"Host: x\r\n", b"Host: x\r\nX-Pad: %s\r\n" % (
        b"a" * (MAX_HEAD_BYTES - len(AUTHED) - 20)))
    assert len(head) < MAX_HEAD_BYTES
    assert _status(_request(stack.port, head)) == 200


def test_pipelined_requests_are_answered_in_order_then_the_head_deadline_runs(guarded) -> None:
    stack = guarded(head_timeout_s=1.0)
    models = AUTHED.replace(b"Connection: close\r\n", b"")
    chat = json.dumps({"model": "scripted", "messages": [{"role": "user", "content": "Hi"}]})
    post = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}"
            f"\r\nContent-Type: application/json\r\nContent-Length: {len(chat)}\r\n\r\n"
            f"{chat}").encode()
    with connect_from(stack.port) as conn:
        conn.sendall(post + models + post)  # one write: three requests
        answers = _responses(read_until_closed(conn))  # closed at the next head deadline
    assert [_status(head) for head, _ in answers] == [200, 200, 200]
    assert json.loads(answers[0][1])["choices"][0]["message"]["content"] == "ab"
    assert json.loads(answers[1][1])["data"][0]["id"] == "scripted"
    assert json.loads(answers[2][1])["choices"][0]["message"]["content"] == "ab"


def test_bytes_that_do_not_parse_after_a_request_do_not_cost_its_answer(guarded) -> None:
    """A valid request and then garbage in one write: llhttp reads the request (its answer
    starts) and fails on the garbage in the same read. The request's answer still comes,
    whole and marked ``connection: close``, and the connection then closes; a lone bad head
    gets the JSON 400 at once."""
    stack = guarded()
    chat = json.dumps({"model": "scripted", "messages": [{"role": "user", "content": "Hi"}]})
    post = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}"
            f"\r\nContent-Type: application/json\r\nContent-Length: {len(chat)}\r\n\r\n"
            f"{chat}").encode()
    with connect_from(stack.port) as conn:
        conn.sendall(post + b"\x00\x01 not http\r\n\r\n")
        ((head, body),) = _responses(read_until_closed(conn))
    assert _status(head) == 200 and b"connection: close" in head.lower()
    assert json.loads(body)["choices"][0]["message"]["content"] == "ab"
    alone = _request(stack.port, b"\x00\x01 not http\r\n\r\n")
    assert alone.startswith(b"HTTP/1.1 400 ") and json.loads(_responses(alone)[0][1])["error"]


#: Chunked bodies whose framing llhttp rejects, each after a valid first chunk: a size that
#: is not hex, one of 20 hex digits (past 64 bits), a chunk longer than its size line (its
#: CRLF comes late), and one shorter (the next size line is read as its data, and then no
#: CRLF follows it).
_BAD_CHUNKS = {"not hex": b"zz\r\n{}\r\n0\r\n\r\n",
               "overflowing size": b"1" * 20 + b"\r\n{}\r\n0\r\n\r\n",
               "longer than its size": b"1\r\n{}\r\n0\r\n\r\n",
               "shorter than its size": b"4\r\n{}\r\n0\r\n\r\n"}
#: What the routes wait for a body: far longer than the answer may take here.
_BODY_TIMEOUT_S = 60
_ANSWER_WAIT_S = 10


def _until(cond: Callable[[], bool], wait: float = _ANSWER_WAIT_S) -> None:
    """Poll ``cond`` (a safety limit, not a timing claim)."""
    deadline = time.monotonic() + wait
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def _chunked_head(path: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            "9\r\n{\"model\":\r\n").encode()  # a valid first chunk


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
@pytest.mark.parametrize("framing", list(_BAD_CHUNKS))
def test_a_chunked_body_that_does_not_parse_is_400_at_once_and_its_route_ends(
        guarded, path, framing) -> None:
    """llhttp rejects the framing as it arrives and reads nothing more after it; the route
    was waiting for the body. Before the fix the route waited on for the rest until its body
    deadline (60 s) and answered 408, holding the connection and its admission ticket. Now:
    the 400 of a request llhttp cannot parse, in the route's API shape, at once (well within
    ``_ANSWER_WAIT_S``, a safety net: the body deadline is 60 s), then the close; the route
    is told the client is gone, so its ticket and its task end. On a keep-alive connection,
    after an answered request, as a client pool sends it."""
    stack = guarded(body_timeout_s=_BODY_TIMEOUT_S)
    admission, tasks = stack.state.admission, stack.server.server_state.tasks
    with connect_from(stack.port) as conn:
        conn.sendall(AUTHED.replace(b"Connection: close\r\n", b""))
        conn.settimeout(CLOSE_WAIT_S)
        first = conn.recv(65536)
        conn.sendall(_chunked_head(path))
        _until(lambda: admission.counts() == (0, 1))  # the route holds its ticket, reading
        conn.sendall(_BAD_CHUNKS[framing])
        (first_head, _), (head, body) = _responses(first + read_until_closed(conn,
                                                                             _ANSWER_WAIT_S))
    assert _status(first_head) == 200
    assert _status(head) == 400 and b"connection: close" in head.lower()
    if path == "/v1/messages":
        assert json.loads(body)["error"]["type"] == "invalid_request_error"
    else:
        assert json.loads(body)["error"]["code"] == "invalid_request"  # as for a bad head
    _until(lambda: admission.counts() == (0, 0) and not tasks)


def test_a_pipelined_request_whose_body_does_not_parse_is_400_after_the_answer_before_it(
        guarded) -> None:
    """The request before it (in the same write, its answer not started) is answered whole
    first; the broken one never reaches its route and gets the 400 in its turn, then the
    close, with no wait for the body deadline."""
    stack = guarded(body_timeout_s=_BODY_TIMEOUT_S)
    keep = AUTHED.replace(b"Connection: close", b"Connection: keep-alive")
    with connect_from(stack.port) as conn:
        conn.sendall(keep + _chunked_head("/v1/chat/completions") + _BAD_CHUNKS["not hex"])
        (first_head, first), (head, body) = _responses(read_until_closed(conn,
                                                                         _ANSWER_WAIT_S))
    assert _status(first_head) == 200 and json.loads(first)["data"]
    assert _status(head) == 400 and b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "invalid_request"
    assert stack.state.admission.counts() == (0, 0)  # its route never ran


def test_an_upgrade_that_is_not_served_is_read_on_as_http11_with_its_body(guarded) -> None:
    """llhttp stops at the end of an upgrade request's head; the guard reads the request on
    as HTTP/1.1 (RFC 9110 §7.8 lets a server ignore Upgrade), body and all, and the
    connection stays usable (``curl --http2`` on http:// asks for h2c this way)."""
    stack = guarded()
    chat = json.dumps({"model": "scripted", "messages": [{"role": "user", "content": "Hi"}]})
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}"
            "\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
            "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(chat)}\r\n\r\n").encode()
    with connect_from(stack.port) as conn:
        conn.sendall(head + chat[:10].encode())  # the body split across reads
        time.sleep(0.05)
        conn.sendall(chat[10:].encode() + AUTHED)  # and the next request on the connection
        (first_head, first), (second_head, _) = _responses(read_until_closed(conn))
    assert _status(first_head) == 200 and _status(second_head) == 200
    assert json.loads(first)["choices"][0]["message"]["content"] == "ab"


def test_connect_is_refused_with_405(guarded) -> None:
    stack = guarded()
    head = b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\nbytes"
    assert _request(stack.port, head).startswith(b"HTTP/1.1 405 ")


@pytest.mark.parametrize("line", [b"GET /v1/models HTTP/2.0", b"GET /v1/models HTTP/0.9",
                                  b"GET /v1/models"])
def test_a_request_line_of_another_http_version_is_505(guarded, line) -> None:
    """llhttp parses ``HTTP/2.0`` written as text and an HTTP/0.9 line with no version;
    uvicorn served both as HTTP/1.1. They get RFC 9110's 505, a JSON error, and the close;
    an HTTP/1.0 request on the same server is still served."""
    stack = guarded()
    answer = _request(stack.port, line + f"\r\nHost: x\r\nAuthorization: Bearer {KEY}"
                      "\r\n\r\n".encode())
    assert _status(answer) == 505 and b"connection: close" in answer.lower()
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == \
        "http_version_not_supported"
    ok = _request(stack.port, AUTHED.replace(b"HTTP/1.1", b"HTTP/1.0", 1))
    assert _status(ok) == 200


def test_a_pipelined_request_of_another_version_waits_for_the_answer_before_it(guarded) -> None:
    """The request before it on the connection gets its whole answer, then the close (and
    the 505 before it, if that answer was complete when the line was read)."""
    stack = guarded()
    keep = AUTHED.replace(b"Connection: close", b"Connection: keep-alive")
    answer = _request(stack.port, keep + b"GET /v1/models HTTP/2.0\r\nHost: x\r\n\r\n")
    (head, body), *rest = _responses(answer)
    assert _status(head) == 200 and json.loads(body)["data"]
    assert [_status(h) for h, _ in rest] in ([], [505])


# -- caps ----------------------------------------------------------------------------------------


def test_one_address_over_its_cap_gets_429_and_another_address_is_served(guarded) -> None:
    stack = guarded(max_connections_per_client=3, head_timeout_s=30)
    held = [connect_from(stack.port, "127.0.0.2") for _ in range(3)]
    try:
        refused = _request(stack.port, AUTHED, "127.0.0.2")
        assert _status(refused) == 429 and b"retry-after: 1" in refused.lower()
        assert json.loads(refused.partition(b"\r\n\r\n")[2])["error"]["code"] == \
            "too_many_connections"
        assert _status(_request(stack.port, AUTHED, "127.0.0.3")) == 200
    finally:
        for conn in held:
            conn.close()


def test_at_the_global_cap_idle_connections_make_room_for_requests(guarded) -> None:
    stack = guarded(max_connections=4, head_timeout_s=30)
    held = [connect_from(stack.port, f"127.0.0.{2 + i}") for i in range(4)]
    try:
        time.sleep(0.2)  # not a timing assertion: lets the server accept all four first
        for _ in range(3):
            assert _status(_request(stack.port, AUTHED)) == 200
        closed = 0
        for conn in held:  # the oldest waiting connections were evicted for them
            conn.settimeout(0.5)
            try:
                closed += conn.recv(1) == b""
            except TimeoutError:
                pass
            except ConnectionResetError:
                closed += 1
        assert closed >= 1
    finally:
        for conn in held:
            conn.close()


def test_when_every_connection_is_busy_a_new_one_gets_503_with_retry_after(guarded) -> None:
    stack = guarded(max_connections=2, head_timeout_s=30, body_timeout_s=30)
    head = (f"POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Length: 100\r\nContent-Type: application/json\r\n\r\n{").encode()
    busy = [connect_from(stack.port, f"127.0.0.{2 + i}") for i in range(2)]
    try:
        for conn in busy:
            conn.sendall(head)  # a body in progress: never evicted
        wait_busy(stack, 2)
        refused = _request(stack.port, AUTHED)
        assert _status(refused) == 503 and b"retry-after: 1" in refused.lower()
    finally:
        for conn in busy:
            conn.close()


# -- the flood ---------------------------------------------------------------------------------


def _raise_nofile(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"needs {need} file descriptors; the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


@pytest.mark.slow
def test_a_flood_of_idle_and_half_head_connections_does_not_starve_keyed_clients(
        guarded_default_loop) -> None:
    idle_n, half_n, sources = 2000, 2000, [f"127.0.0.{i}" for i in range(2, 10)]
    # Each address fills its cap exactly as the table fills: what comes after is refused per
    # address (429), and every keyed request must then evict an idle connection to get in.
    per_client = 350
    max_connections = per_client * len(sources)
    _raise_nofile(2 * (idle_n + half_n) + 1024)
    stack = guarded_default_loop(head_timeout_s=30, max_connections=max_connections,
                                 max_connections_per_client=per_client)
    held: list[socket.socket] = []
    try:
        for i in range(idle_n + half_n):
            conn = connect_from(stack.port, sources[i % len(sources)])
            if i >= idle_n:
                conn.sendall(HALF_HEAD)
            held.append(conn)
        answers = [_request(stack.port, AUTHED) for _ in range(20)]
        for answer in answers:  # answered, or told when to come back
            assert _status(answer) == 200 or (_status(answer) in (429, 503)
                                               and b"retry-after:" in answer.lower())
        assert sum(_status(a) == 200 for a in answers) >= 15
        outcomes = _wait_all_closed(held)
    finally:
        for conn in held:
            conn.close()
    # 500 from each address: 150 of them over the per-address cap, refused with a 429.
    assert outcomes["429"] == (idle_n + half_n) - per_client * len(sources)
    assert outcomes["open"] == 0  # every held connection was closed by the server
    assert outcomes["408"] > 0  # half heads told why, at the head deadline


def _wait_all_closed(conns: list[socket.socket]) -> dict[str, int]:
    """Read every socket until the server closes it; count how each ended."""
    data, open_ = read_all_until_closed(conns)
    counts = {"open": len(open_), "429": 0, "408": 0, "other": 0}
    for conn, got in data.items():
        if conn in open_:
            continue
        key = str(_status(got)) if _status(got) in (429, 408) else "other"
        counts[key] += 1
    return counts


# -- settings ------------------------------------------------------------------------------------


def test_the_limits_come_from_flags_over_the_config_file() -> None:
    from .test_hardening import _settings

    s = _settings(["--head-timeout", "3", "--max-connections-per-client", "9"], {},
                  {"head_timeout_s": 7, "body_timeout_s": 11, "max_connections": 99})
    assert (s.head_timeout_s, s.body_timeout_s, s.max_connections,
            s.max_connections_per_client) == (3, 11, 99, 9)
    defaults = ServerSettings()
    assert (defaults.head_timeout_s, defaults.body_timeout_s, defaults.max_connections,
            defaults.max_connections_per_client) == (10, 60, 4096, 256)


@pytest.mark.parametrize("kw", [{"head_timeout_s": 0}, {"body_timeout_s": -1},
                                {"max_connections": 0}, {"max_connections_per_client": 0}])
def test_limits_are_validated(kw) -> None:
    from tokenwire.errors import ConfigError

    with pytest.raises(ConfigError):
        ServerSettings(**kw)
