"""The connection hardening over HTTP/2 (issue 15; the HTTP/1.1 side is
``test_connection_limits.py`` and ``test_hardening.py``): head deadlines, caps and eviction,
size limits, and HTTP/2's own floods (PING, rapid reset — CVE-2023-44487 —, CONTINUATION,
too many streams).

Raw sockets carry exact frames (``hyperframe``/``hpack``, what ``h2`` is built on) so a test
can send what no well-behaved client sends; the server is ``serve_gateway`` on its own
loopback port. Deadlines are configured short by each test; waits are safety nets.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import hpack
import httpx
import pytest
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
)

from tokenwire.gateway.http.http2 import FLOOD_BUDGET, H2_PREFACE, MAX_HEADER_LIST_SIZE

from .raw_sockets import (
    EVENT_LOOPS,
    connect_from,
    keyed_stacks,
    read_all_until_closed,
    read_until_closed,
    wait_busy,
)
from .test_hardening import KEY
from .test_http2 import RawH2

WAIT_S = 60
ENHANCE_YOUR_CALM = 0xB


@pytest.fixture(scope="module", params=EVENT_LOOPS)
def guarded(request, smollm2_map) -> Iterator[Callable[..., Any]]:
    """Once per event loop ``tokenwire serve`` can run on."""
    yield from keyed_stacks(smollm2_map, backlog=1024, event_loop=request.param)


def _open(port: int, source: str = "127.0.0.1") -> socket.socket:
    """A connection that has sent the preface and an empty SETTINGS, nothing else."""
    sock = connect_from(port, source)
    sock.sendall(H2_PREFACE + SettingsFrame(0).serialize())
    return sock


def _frames_until_closed(sock: socket.socket, wait: float = WAIT_S) -> list[Frame]:
    """Every frame the server sends until it closes; fails if it keeps the socket open."""
    data = read_until_closed(sock, wait)
    frames = []
    while len(data) >= 9:
        frame, length = Frame.parse_frame_header(memoryview(data[:9]))
        frame.parse_body(memoryview(data[9:9 + length]))
        frames.append(frame)
        data = data[9 + length:]
    return frames


def _goaway(frames: list[Frame]) -> GoAwayFrame:
    goaways = [f for f in frames if isinstance(f, GoAwayFrame)]
    assert goaways, f"no GOAWAY in {[type(f).__name__ for f in frames]}"
    return goaways[-1]


def _head_block(path: str = "/v1/models", **extra: str) -> bytes:
    return hpack.Encoder().encode([(":method", "GET"), (":path", path), (":scheme", "http"),
                                   (":authority", "x"), ("authorization", f"Bearer {KEY}"),
                                   *extra.items()])


def _served_on_h2(port: int, source: str = "127.0.0.1") -> int:
    client = RawH2(port, source)
    try:
        sid = client.request("GET", "/v1/models")
        client.pump(lambda: sid in client.ended or sid in client.reset)
        head = client.heads.get(sid, {})
        return int(head.get(b":status", b"0"))
    finally:
        client.close()


# -- deadlines ---------------------------------------------------------------------------------


def test_a_silent_h2_connection_is_closed_at_the_head_deadline(guarded) -> None:
    stack = guarded(head_timeout_s=0.5)
    with _open(stack.port) as sock:
        assert _goaway(_frames_until_closed(sock)).error_code == 0


def test_a_header_block_dripped_in_continuations_is_closed_at_the_head_deadline(
        guarded) -> None:
    stack = guarded(head_timeout_s=1.0)
    block = _head_block()
    with _open(stack.port) as sock:
        sock.sendall(HeadersFrame(1, block[:4]).serialize())  # no END_HEADERS
        sock.settimeout(0.1)
        for i in range(int(WAIT_S / 0.1)):  # one CONTINUATION byte every 0.1 s
            try:
                sock.sendall(ContinuationFrame(1, block[4 + i % 8:5 + i % 8]).serialize())
                if not sock.recv(65536):
                    break
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
        else:
            pytest.fail("a dripping header block was never closed")


def test_an_idle_h2_connection_gets_a_fresh_deadline_after_each_response(guarded) -> None:
    stack = guarded(head_timeout_s=1.0)
    client = RawH2(stack.port)
    try:
        sid = client.request("GET", "/v1/models")
        client.pump(lambda: sid in client.ended)
        assert client.heads[sid][b":status"] == b"200"
        client.pump(lambda: False)  # returns once the server closes, fails if never
        assert client.closed and client.goaway is not None and client.goaway.error_code == 0
    finally:
        client.close()


def test_a_slow_body_gets_the_routes_408_and_the_connection_lives_on(guarded) -> None:
    stack = guarded(body_timeout_s=0.3)
    client = RawH2(stack.port)
    try:
        sid = client.request("POST", "/tokenize", b"{", end=False,
                             headers={"content-type": "application/json",
                                      "content-length": "100"})
        client.pump(lambda: sid in client.ended or sid in client.reset)
        assert client.heads[sid][b":status"] == b"408"
        assert json.loads(client.data[sid])["error"]
        again = client.request("GET", "/v1/models")
        client.pump(lambda: again in client.ended)
        assert client.heads[again][b":status"] == b"200"
    finally:
        client.close()


# -- caps ----------------------------------------------------------------------------------------


def test_one_address_over_its_cap_gets_an_h2_429_and_another_address_is_served(guarded) -> None:
    stack = guarded(max_connections_per_client=3, head_timeout_s=30)
    held = [_open(stack.port, "127.0.0.2") for _ in range(3)]
    try:
        time.sleep(0.2)  # not measured: lets the server accept the three first
        client = RawH2(stack.port, "127.0.0.2")
        try:
            sid = client.request("GET", "/v1/models")
            client.pump(lambda: sid in client.ended)
            assert client.heads[sid][b":status"] == b"429"
            assert client.heads[sid][b"retry-after"] == b"1"
            assert json.loads(client.data[sid])["error"]["code"] == "too_many_connections"
        finally:
            client.close()
        assert _served_on_h2(stack.port, "127.0.0.3") == 200
    finally:
        for sock in held:
            sock.close()


def test_at_the_global_cap_idle_h2_connections_make_room_for_requests(guarded) -> None:
    stack = guarded(max_connections=4, head_timeout_s=30)
    held = [_open(stack.port, f"127.0.0.{2 + i}") for i in range(4)]
    try:
        time.sleep(0.2)  # not measured: lets the server accept all four first
        for _ in range(3):
            assert _served_on_h2(stack.port) == 200
        closed = 0
        for sock in held:  # the oldest waiting connections were evicted for them
            sock.settimeout(0.5)
            try:
                while sock.recv(65536):
                    pass
                closed += 1
            except TimeoutError:
                pass
            except ConnectionResetError:
                closed += 1
        assert closed >= 1
    finally:
        for sock in held:
            sock.close()


def test_an_idle_h2_flood_does_not_starve_clients_and_every_idle_connection_is_closed(
        guarded) -> None:
    """300 connections that send the preface and then nothing, at a cap of 100: each new one
    evicts the oldest waiting one, requests are served, the rest close at the deadline."""
    stack = guarded(max_connections=100, head_timeout_s=3)
    held = [_open(stack.port, f"127.0.0.{2 + i % 3}") for i in range(300)]
    try:
        assert [_served_on_h2(stack.port) for _ in range(10)] == [200] * 10
        _, still_open = read_all_until_closed(held, WAIT_S)
        assert not still_open  # every one is evicted or closed at the head deadline
    finally:
        for sock in held:
            sock.close()


def test_when_every_connection_is_busy_an_h2_client_gets_503_with_retry_after(guarded) -> None:
    stack = guarded(max_connections=2, head_timeout_s=30, body_timeout_s=30)
    busy = [RawH2(stack.port, f"127.0.0.{2 + i}") for i in range(2)]
    try:
        for client in busy:  # a body in progress: never evicted
            client.request("POST", "/tokenize", b"{", end=False,
                           headers={"content-type": "application/json",
                                    "content-length": "100"})
        wait_busy(stack, 2)
        with httpx.Client(http1=False, http2=True, timeout=WAIT_S) as client:
            resp = client.get(f"http://127.0.0.1:{stack.port}/v1/models")
        assert resp.status_code == 503 and resp.headers["retry-after"] == "1"
        assert resp.json()["error"]["code"] == "server_busy"
    finally:
        for client in busy:
            client.close()


# -- sizes -------------------------------------------------------------------------------------


def test_an_oversized_header_list_ends_the_connection_and_others_are_served(guarded) -> None:
    stack = guarded()
    with _open(stack.port) as sock:
        big = _head_block(**{"x-pad": "a" * (MAX_HEADER_LIST_SIZE + 10)})
        frames = [HeadersFrame(1, big[:16000])]
        rest = big[16000:]
        while rest:
            frames.append(ContinuationFrame(1, rest[:16000]))
            rest = rest[16000:]
        frames[-1].flags.add("END_HEADERS")
        frames[0].flags.add("END_STREAM")
        sock.sendall(b"".join(f.serialize() for f in frames))
        got = _frames_until_closed(sock)
    assert _goaway(got).error_code == ENHANCE_YOUR_CALM
    assert not [f for f in got if isinstance(f, HeadersFrame)]  # never reached the app
    assert _served_on_h2(stack.port) == 200


def test_an_oversized_body_is_413_in_the_apis_shape_over_h2(guarded) -> None:
    stack = guarded(max_body_bytes=64)
    with httpx.Client(http1=False, http2=True, timeout=WAIT_S) as client:
        resp = client.post(f"http://127.0.0.1:{stack.port}/v1/chat/completions",
                           content=b"x" * 65, headers={"content-type": "application/json",
                                                       "authorization": f"Bearer {KEY}"})
        assert resp.http_version == "HTTP/2" and resp.status_code == 413
        assert resp.json()["error"]
        streamed = client.post(f"http://127.0.0.1:{stack.port}/v1/chat/completions",
                               content=iter([b"x" * 40, b"x" * 40]),
                               headers={"content-type": "application/json",
                                        "authorization": f"Bearer {KEY}"})
        assert streamed.status_code == 413  # no content-length: counted while reading


# -- HTTP/2's own floods -------------------------------------------------------------------------


def test_a_ping_flood_gets_goaway_enhance_your_calm(guarded) -> None:
    stack = guarded()
    with _open(stack.port) as sock:
        pings = b"".join(PingFrame(0, opaque_data=i.to_bytes(8, "big")).serialize()
                         for i in range(FLOOD_BUDGET * 5))
        try:
            sock.sendall(pings)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed while we were still flooding: that is the point
        got = _frames_until_closed(sock)
    assert _goaway(got).error_code == ENHANCE_YOUR_CALM
    assert sum(isinstance(f, PingFrame) for f in got) <= FLOOD_BUDGET + 1


def test_rapid_reset_gets_goaway_and_starts_at_most_its_budget_of_requests(guarded) -> None:
    """CVE-2023-44487: open a stream and reset it at once, again and again."""
    stack = guarded(max_concurrent=64, queue_size=64)
    before = len(stack.upstream.requests)
    enc = hpack.Encoder()
    body = json.dumps({"model": "scripted", "messages": [{"role": "user", "content": "x"}],
                       "stream": True}).encode()
    burst = []
    for i in range(FLOOD_BUDGET * 5):
        sid = 1 + 2 * i
        block = enc.encode([(":method", "POST"), (":path", "/v1/chat/completions"),
                            (":scheme", "http"), (":authority", "x"),
                            ("authorization", f"Bearer {KEY}"),
                            ("content-type", "application/json")])
        head = HeadersFrame(sid, block)
        head.flags.add("END_HEADERS")
        data = DataFrame(sid, body)
        data.flags.add("END_STREAM")
        burst += [head.serialize(), data.serialize(), RstStreamFrame(sid, 8).serialize()]
    with _open(stack.port) as sock:
        try:
            sock.sendall(b"".join(burst))
        except (BrokenPipeError, ConnectionResetError):
            pass
        got = _frames_until_closed(sock)
    assert _goaway(got).error_code == ENHANCE_YOUR_CALM
    assert len(stack.upstream.requests) - before <= FLOOD_BUDGET
    assert _served_on_h2(stack.port) == 200


def test_a_continuation_flood_is_cut(guarded) -> None:
    """Header blocks of endless tiny CONTINUATION frames (the 2024 "CONTINUATION flood"):
    h2 allows 64 per block, then the connection ends."""
    stack = guarded()
    with _open(stack.port) as sock:
        frames = [HeadersFrame(1, b"")] + [ContinuationFrame(1, b"") for _ in range(1000)]
        try:
            sock.sendall(b"".join(f.serialize() for f in frames))
        except (BrokenPipeError, ConnectionResetError):
            pass
        got = _frames_until_closed(sock)
    assert _goaway(got).error_code != 0
    assert _served_on_h2(stack.port) == 200


def test_a_stream_beyond_the_advertised_limit_ends_the_connection(guarded) -> None:
    """More open streams than SETTINGS_MAX_CONCURRENT_STREAMS is the client's protocol
    error (RFC 9113 §5.1.2); h2 answers it with GOAWAY, and nothing past the limit runs."""
    from tokenwire.gateway.http.http2 import MAX_CONCURRENT_STREAMS

    stack = guarded(body_timeout_s=30, head_timeout_s=30)
    enc = hpack.Encoder()
    frames = []
    for i in range(MAX_CONCURRENT_STREAMS + 1):  # bodies in progress hold their stream
        head = HeadersFrame(1 + 2 * i, enc.encode([
            (":method", "POST"), (":path", "/tokenize"), (":scheme", "http"),
            (":authority", "x"), ("authorization", f"Bearer {KEY}"),
            ("content-type", "application/json"), ("content-length", "100")]))
        head.flags.add("END_HEADERS")
        frames.append(head.serialize())
    with _open(stack.port) as sock:
        sock.sendall(b"".join(frames))
        got = _frames_until_closed(sock)
    goaway = _goaway(got)
    assert goaway.error_code != 0 and goaway.last_stream_id < 1 + 2 * MAX_CONCURRENT_STREAMS
    assert _served_on_h2(stack.port) == 200


# -- the sans-IO pieces --------------------------------------------------------------------------


def test_the_flood_guard_counts_per_window_with_the_clock_it_is_given() -> None:
    from tokenwire.gateway.http.http2 import FloodGuard

    guard = FloodGuard(budget=3, window_s=1.0)
    assert [guard.hit(t) for t in (10.0, 10.1, 10.2)] == [False, False, False]
    assert guard.hit(10.3)  # the fourth in one window
    assert not guard.hit(11.05)  # a new window starts at its first hit
    assert [guard.hit(11.1), guard.hit(11.2), guard.hit(11.3)] == [False, False, True]


def test_a_connection_that_becomes_http2_keeps_its_slot_and_stays_evictable() -> None:
    from tokenwire.gateway.http.connections import ConnectionLimits, ConnectionTable

    table = ConnectionTable(ConnectionLimits(max_connections=2, max_connections_per_client=2))
    h11_a, h11_b, h2_a = object(), object(), object()
    table.open(h11_a, "1.2.3.4")
    table.open(h11_b, "1.2.3.4")
    table.replace(h11_a, h2_a)
    assert len(table) == 2
    assert table.open(object(), "1.2.3.4").refusal is not None  # still two from the address
    # It just spoke (the preface is its first bytes): the newest in line, still waiting.
    assert table.open(object(), "5.6.7.8").victim is h11_b
    assert table.open(object(), "5.6.7.9").victim is h2_a
