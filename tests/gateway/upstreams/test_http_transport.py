"""The lean upstream transport (gateway/upstreams/http_transport.py) against raw sockets.

Each test's server is a plain asyncio server that writes exact bytes, so framing, early
closes and stalls are the test's own preconditions. What is checked is what the adapters
and :mod:`~tokenwire.gateway.upstreams.failures` rely on: the same httpx exceptions (and
causes) as httpx's own transport, connection reuse, a closed response closing its
connection, the pool limit, TLS, and the proxy fallback. Timeouts here are the behaviour
under test (a server that never answers) or safety nets, never a measured time.
"""

from __future__ import annotations

import asyncio
import select
import ssl
from collections.abc import Awaitable, Callable

import httpx
import pytest

from tokenwire.gateway.upstreams.base import UpstreamConfig
from tokenwire.gateway.upstreams.failures import connection_fault, failure_from_exception
from tokenwire.gateway.upstreams.http_heads import MalformedAnswer
from tokenwire.gateway.upstreams.http_transport import (
    LeanTransport,
    _ChunkedBody,
    _Connection,
    upstream_transport,
)
from tokenwire.gateway.upstreams.sse_http import http_client
from tokenwire.gateway.upstreams.stream_post import stream_post

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
CHUNKED_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n")


#: A complete answer whose connection stays open for the next request.
OK_ANSWER = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Server:
    """Counts accepted connections and the requests read on them."""

    def __init__(self, handler: Handler) -> None:
        self.handler, self.accepts, self.eofs = handler, 0, 0
        self.closed = asyncio.Event()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepts += 1
        try:
            await self.handler(reader, writer)
        finally:
            writer.close()

    async def start(self, tls: ssl.SSLContext | None = None) -> str:
        self._srv = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=tls)
        port = self._srv.sockets[0].getsockname()[1]
        return f"{'https' if tls else 'http'}://127.0.0.1:{port}"

    async def stop(self) -> None:
        self._srv.close()
        await self._srv.wait_closed()


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    return head + (await reader.readexactly(length) if length else b"")


def answer_every_request(answer: bytes) -> Handler:
    """A handler that reads requests on its connection and writes ``answer`` to each, until
    the client closes it (keep-alive, as uvicorn serves)."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await _read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(answer)
            await writer.drain()
    return handler


async def _answer_each_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                               answer: bytes, *, piece: int = 0) -> None:
    """Answer each request on the connection with ``answer`` (in writes of ``piece`` bytes a
    millisecond apart, when given) until the client closes, or after one answer that says
    ``connection: close``."""
    step = piece or len(answer)
    while True:
        try:
            await _read_request(reader)
        except asyncio.IncompleteReadError:
            return
        for i in range(0, len(answer), step):
            writer.write(answer[i:i + step])
            await writer.drain()
            if piece:
                await asyncio.sleep(0.001)
        if b"connection: close" in answer:
            return


def _run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), 30))  # the safety net, not a measurement


def _client(**limits) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=LeanTransport(max_connections=limits.get("n", 4)),
                             timeout=httpx.Timeout(limits.get("read", 10.0), connect=5.0,
                                                   pool=limits.get("pool", 10.0)))


def test_a_streamed_body_arrives_whole_and_its_connection_is_reused() -> None:
    async def handler(reader, writer):
        for _ in range(3):  # three requests on one connection
            request = await _read_request(reader)
            assert request.startswith(b"POST /v1/chat HTTP/1.1\r\n")
            assert request.endswith(b'{"n":1}')
            writer.write(CHUNKED_HEAD)
            for word in (b"data: a\n\n", b"data: b\n\n", b"data: [DONE]\n\n"):
                writer.write(_chunk(word))
                await writer.drain()
            writer.write(b"0\r\n\r\n")

    async def main():
        server = Server(handler)
        url = await server.start()
        async with _client() as client:
            for _ in range(3):
                async with client.stream("POST", url + "/v1/chat", json={"n": 1}) as resp:
                    assert resp.status_code == 200
                    assert resp.headers["content-type"] == "text/event-stream"
                    body = b"".join([c async for c in resp.aiter_bytes()])
                assert body == b"data: a\n\ndata: b\n\ndata: [DONE]\n\n"
        await server.stop()
        assert server.accepts == 1

    _run(main)


def test_a_pooled_connection_the_upstream_closed_is_not_reused_before_the_loop_sees_it(
) -> None:
    """The upstream's keep-alive timeout closes an idle connection just as a request takes it:
    its FIN is in the kernel, not yet delivered to the protocol. The request must go on a
    new connection instead of meeting "Server disconnected without sending a response"."""
    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(OK_ANSWER)
        await writer.drain()
        if server.accepts == 1:  # the first connection: closed once idle, as uvicorn does
            writer.close()
            await writer.wait_closed()
            server.closed.set()

    async def main():
        nonlocal server
        server = Server(handler)
        url = await server.start()
        transport = LeanTransport(max_connections=4)
        async with httpx.AsyncClient(transport=transport, timeout=10.0) as client:
            assert (await client.post(url, json={})).text == "ok"
            (pooled,) = [c for idle in transport._idle.values() for c in idle]
            # The precondition, made rather than raced for: the loop stops reading the idle
            # socket, so the FIN below stays in the kernel where only a look at the socket
            # can see it.
            pooled.transport.pause_reading()
            await server.closed.wait()
            fd = pooled.transport.get_extra_info("socket").fileno()
            await asyncio.to_thread(select.select, [fd], [], [], 10)  # the FIN is here
            assert pooled.reusable  # and the protocol has not been told
            assert (await client.post(url, json={})).text == "ok"
        await server.stop()
        assert server.accepts == 2

    server: Server
    _run(main)


def test_the_pool_expires_idle_connections_before_the_upstreams_keep_alive_does() -> None:
    """uvicorn, llama.cpp's server and Node close idle connections after 5 s; a connection
    idle longer than the pool's expiry is closed and a new one opened."""
    from tokenwire.gateway.upstreams import http_transport

    assert http_transport.KEEPALIVE_EXPIRY_S <= 2.5  # half the common 5 s, with margin

    async def main():
        server = Server(answer_every_request(OK_ANSWER))
        url = await server.start()
        transport = LeanTransport(max_connections=4, keepalive_expiry=0.0)
        async with httpx.AsyncClient(transport=transport, timeout=10.0) as client:
            for _ in range(2):
                assert (await client.post(url, json={})).text == "ok"
        await server.stop()
        assert server.accepts == 2

    _run(main)


def test_a_response_closed_before_its_end_closes_its_connection() -> None:
    """The stream's task cancelled (a client went away): the upstream sees the disconnect."""
    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(CHUNKED_HEAD + _chunk(b"data: a\n\n"))
        await writer.drain()
        assert await reader.read(1) == b""  # EOF: the gateway hung up
        server.closed.set()

    async def main():
        nonlocal server
        server = Server(handler)
        url = await server.start()
        async with _client() as client:
            async with client.stream("POST", url, json={}) as resp:
                async for chunk in resp.aiter_bytes():
                    assert chunk == b"data: a\n\n"
                    break
            await server.closed.wait()
            async with client.stream("POST", url, json={}) as resp:  # a new connection
                async for _ in resp.aiter_bytes():
                    break
        await server.stop()
        assert server.accepts == 2

    server: Server
    _run(main)


def test_a_cancelled_read_closes_the_connection() -> None:
    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(CHUNKED_HEAD)
        await writer.drain()
        assert await reader.read(1) == b""
        server.closed.set()

    async def main():
        nonlocal server
        server = Server(handler)
        url = await server.start()
        async with _client() as client:
            started = asyncio.Event()

            async def read():
                async with client.stream("POST", url, json={}) as resp:
                    started.set()
                    await resp.aread()

            task = asyncio.create_task(read())
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await server.closed.wait()
        await server.stop()

    server: Server
    _run(main)


def test_a_stalled_body_is_a_read_timeout() -> None:
    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(CHUNKED_HEAD + _chunk(b"data: a\n\n"))
        await writer.drain()
        await reader.read(1)  # never answers more; returns when the gateway gives up

    async def main():
        server = Server(handler)
        url = await server.start()
        async with _client(read=0.2) as client:
            with pytest.raises(httpx.ReadTimeout) as info:
                async with client.stream("POST", url, json={}) as resp:
                    async for _ in resp.aiter_bytes():
                        pass
        await server.stop()
        assert failure_from_exception(info.value, started=True).code == "read_timeout"

    _run(main)


@pytest.mark.parametrize(("answer", "message", "malformed"), [
    (b"", "Server disconnected without sending a response.", False),
    (CHUNKED_HEAD + _chunk(b"data: a\n\n"), "incomplete chunked read", False),
    (b"HTTP/1.1 200 OK\r\nbroken header\r\n\r\n", "invalid response head", True),
    (b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * (100 * 1024) + b"\r\n\r\n", "head too large",
     True),
    (b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * (100 * 1024), "head too large", True),
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\nxx", "unsupported Transfer-Encoding",
     True),
    (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nok",
     "invalid response head", True),
    (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nok", "3 bytes missing", False),
    (b"HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\nconnection: upgrade\r\n\r\n",
     "unexpected 101", True),
    (b"HTTP/1.1 200", "complete response head", False),
    (CHUNKED_HEAD + b"zz\r\n", "bad chunk-size line", True),
    (CHUNKED_HEAD + b"2\r\nabc\r\n", "not followed by CRLF", True),
])
def test_a_broken_answer_is_a_remote_protocol_error(answer: bytes, message: str,
                                                    malformed: bool) -> None:
    """Bytes that break HTTP are a :class:`MalformedAnswer` (final); a connection that ends
    before or during the answer is the plain error, which a retry may cure."""
    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(answer)
        await writer.drain()

    async def main():
        server = Server(handler)
        url = await server.start()
        async with _client() as client:
            with pytest.raises(httpx.RemoteProtocolError, match=message) as caught:
                async with client.stream("POST", url, json={}) as resp:
                    async for _ in resp.aiter_bytes():
                        pass
        await server.stop()
        assert isinstance(caught.value, MalformedAnswer) is malformed

    _run(main)


def test_a_refused_connect_is_a_connect_error_naming_its_cause() -> None:
    async def main():
        server = Server(_read_request)
        url = await server.start()
        await server.stop()  # the port is free again: nothing listens
        async with _client() as client:
            with pytest.raises(httpx.ConnectError) as info:
                await client.get(url)
        assert connection_fault(info.value) == "connection_refused"
        assert failure_from_exception(info.value, started=False).failure_class.value == \
            "connection"

    _run(main)


def test_a_request_waits_for_a_free_connection_then_times_out() -> None:
    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(CHUNKED_HEAD)
        await writer.drain()
        await reader.read(1)

    async def main():
        server = Server(handler)
        url = await server.start()
        async with _client(n=1, pool=0.2) as client:
            async with client.stream("POST", url, json={}):
                with pytest.raises(httpx.PoolTimeout):
                    await client.get(url)
        await server.stop()

    _run(main)


def test_closing_the_client_closes_a_connection_still_streaming() -> None:
    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(CHUNKED_HEAD + _chunk(b"data: a\n\n"))
        await writer.drain()
        assert await reader.read(1) == b""
        server.closed.set()

    async def main():
        nonlocal server
        server = Server(handler)
        url = await server.start()
        client = _client()
        resp = await client.send(client.build_request("POST", url, json={}), stream=True)
        assert resp.status_code == 200
        await client.aclose()
        await server.closed.wait()
        await server.stop()

    server: Server
    _run(main)


def test_tls_upstreams_are_verified_with_httpx_default_trust(tmp_path, monkeypatch) -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(ca_file)

    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(OK_ANSWER)
        await writer.drain()

    async def main(expect_ok: bool):
        server = Server(handler)
        url = await server.start(tls=server_ctx)
        async with _client() as client:
            if expect_ok:
                assert (await client.get(url)).text == "ok"
            else:
                with pytest.raises(httpx.ConnectError) as info:
                    await client.get(url)
                assert connection_fault(info.value) == "certificate_error"
        await server.stop()

    _run(lambda: main(False))  # a private CA nobody trusts
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))  # httpx's own way to trust it
    _run(lambda: main(True))


def test_a_proxy_in_the_environment_keeps_httpx_own_transport(monkeypatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                 "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert isinstance(upstream_transport(4), LeanTransport)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    assert upstream_transport(4) is None  # httpx applies proxies only on its own transport


def test_idle_connections_close_at_expiry_without_waiting_for_a_request() -> None:
    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(OK_ANSWER)
        await writer.drain()
        assert await reader.read(1) == b""  # the pool closed it on its own
        server.closed.set()

    async def main():
        nonlocal server
        server = Server(handler)
        url = await server.start()
        transport = LeanTransport(max_connections=4, keepalive_expiry=0.05)
        async with httpx.AsyncClient(transport=transport, timeout=10.0) as client:
            assert (await client.post(url, json={})).text == "ok"
            await server.closed.wait()
            assert not any(transport._idle.values())
        await server.stop()

    server: Server
    _run(main)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_loop_that_ends_with_idle_connections_closes_them(loop: str) -> None:
    """The gateway's tests (and any embedder) may end a loop without closing the client:
    the idle connections close with the loop's tasks, so no transport is left open (uvloop
    warns of each, and the warning fails the suite)."""
    import uvloop

    pooled = []

    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(OK_ANSWER)
        await writer.drain()
        await reader.read(1)

    async def main():
        server = Server(handler)
        url = await server.start()
        transport = LeanTransport(max_connections=4)
        client = httpx.AsyncClient(transport=transport, timeout=10.0)
        assert (await client.post(url, json={})).text == "ok"
        pooled.extend(c for idle in transport._idle.values() for c in idle)
        server._srv.close()  # the listener only: the connection stays open, idle
        # returns with the client open, its connection idle in the pool

    (uvloop.run if loop == "uvloop" else asyncio.run)(asyncio.wait_for(main(), 30))
    assert len(pooled) == 1 and pooled[0].closed


def test_an_upstream_client_keeps_no_cookie_from_one_request_for_the_next() -> None:
    """An upstream client serves every user: a cookie the upstream set on one answer (a
    session, a CDN's affinity cookie) must not ride on the next user's request."""
    seen: list[bytes] = []

    async def handler(reader, writer):
        while True:
            try:
                seen.append(await _read_request(reader))
            except asyncio.IncompleteReadError:
                return
            writer.write(b"HTTP/1.1 200 OK\r\nset-cookie: session=user-a; Path=/\r\n"
                         b"content-length: 2\r\n\r\nok")
            await writer.drain()

    async def main():
        server = Server(handler)
        url = await server.start()
        async with http_client(UpstreamConfig(name="u", kind="openai", base_url=url),
                               {}, None) as client:
            for _ in range(2):
                assert (await client.post(url + "/v1/x", json={})).status_code == 200
            assert not client.cookies
        await server.stop()
        assert len(seen) == 2 and all(b"cookie" not in r.lower() for r in seen)

    _run(main)


# -- the heads: written without h11, read by llhttp ----------------------------------------------


def test_a_header_value_that_would_split_the_head_is_refused_before_a_byte_is_sent() -> None:
    requests: list[bytes] = []

    async def main():
        server = Server(lambda r, w: _record(r, w, requests))
        url = await server.start()
        async with _client() as client:
            for bad in ({"x-a": "v\r\nx-injected: 1"}, {"x-a": "v\n"}, {"x a": "v"},
                        {"x-a": " v"}):
                with pytest.raises(httpx.LocalProtocolError):
                    await client.get(url, headers=bad)
            assert (await client.get(url, headers={"x-a": "v\tw"})).text == "ok"
        await server.stop()

    _run(main)
    assert len(requests) == 1 and b"x-a: v\tw\r\n" in requests[0]


async def _record(reader, writer, requests: list[bytes]) -> None:
    while True:
        try:
            requests.append(await _read_request(reader))
        except asyncio.IncompleteReadError:
            return
        writer.write(OK_ANSWER)
        await writer.drain()


@pytest.mark.parametrize(("answer", "body", "reused"), [
    # 1xx heads are skipped; the answer follows on the same connection.
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", b"ok",
     True),
    # A Content-Length body, its head and body cut into many reads (the server drips it).
    (b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nX-A: b  \r\n\r\nhello world", b"hello world",
     True),
    # Bytes past the Content-Length: the answer stands, the connection is not reused.
    (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA", b"ok", False),
    # No length and not chunked: the body runs to the connection's end.
    (b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nto the end", b"to the end", False),
    (b"HTTP/1.1 204 No Content\r\n\r\n", b"", True),
])
def test_response_framing(answer: bytes, body: bytes, reused: bool) -> None:
    async def handler(reader, writer):
        await _answer_each_request(reader, writer, answer, piece=7)

    async def main():
        server = Server(handler)
        url = await server.start()
        async with _client() as client:
            for _ in range(2):
                resp = await client.get(url)
                assert (resp.status_code, resp.content) == (200 if body else 204, body)
        await server.stop()
        assert server.accepts == (1 if reused else 2)

    _run(main)


def test_a_head_request_reads_no_body_and_keeps_its_connection() -> None:
    async def main():
        server = Server(answer_every_request(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"))
        url = await server.start()
        async with _client() as client:
            for _ in range(2):
                resp = await client.head(url)
                assert (resp.status_code, resp.headers["content-length"], resp.content) == \
                    (200, "5", b"")
        await server.stop()
        assert server.accepts == 1

    _run(main)



# -- stream_post: the SSE adapters' POST, without httpx's request and response -------------------


def _fields(request: bytes) -> list[bytes]:
    """A request head's field lines, lower-cased and sorted (the order is not a contract)."""
    return sorted(line.lower() for line in request.split(b"\r\n\r\n")[0].split(b"\r\n")[1:])


def test_stream_post_sends_the_head_and_body_httpx_sends() -> None:
    """The same client headers (httpx's defaults and the upstream's auth), a request header
    replacing one of them, a new one, and the body: the lean path's request is httpx's own
    transport's, field for field."""
    requests: list[bytes] = []

    async def main():
        server = Server(lambda r, w: _record(r, w, requests))
        url = await server.start()
        config = UpstreamConfig(name="u", kind="openai", base_url=url)
        target, body = httpx.URL(url + "/v1/chat?x=1"), b'{"m":"\xc3\xa9"}'
        headers = {"Content-Type": "application/json", "user-agent": "mine", "X-Extra": "1"}
        defaults = {"Authorization": "Bearer k", "X-Config": "c"}
        for transport in (None, httpx.AsyncHTTPTransport()):
            async with http_client(config, defaults, transport) as client:
                assert (client.lean is None) == (transport is not None)
                async with stream_post(client, target, body, headers) as resp:
                    assert resp.status_code == 200
                    assert b"".join([c async for c in resp.aiter_bytes()]) == b"ok"
        await server.stop()

    _run(main)
    lean, reference = requests
    assert lean.startswith(b"POST /v1/chat?x=1 HTTP/1.1\r\n")
    assert _fields(lean) == _fields(reference)
    assert lean.endswith(b'\r\n\r\n{"m":"\xc3\xa9"}') and reference.endswith(lean[-10:])
    assert b"user-agent: mine" in _fields(lean) and b"authorization: bearer k" in _fields(lean)


def test_stream_post_builds_a_head_once_per_target_and_headers() -> None:
    """The head up to Content-Length is built and checked once per (target, headers) of a
    client; every request still carries its own body's length, other headers get their own
    head, and a caller's own Content-Length is sent as given, never cached."""
    requests: list[bytes] = []

    async def main():
        server = Server(lambda r, w: _record(r, w, requests))
        url = await server.start()
        async with http_client(UpstreamConfig(name="u", kind="openai", base_url=url),
                               {"Authorization": "Bearer k"}, None) as client:
            target = httpx.URL(url + "/v1/chat")
            for body, headers in ((b"{}", {"X-A": "1"}), (b'{"long":true}', {"X-A": "1"}),
                                  (b"{}", {"X-A": "2"}), (b"abc", {"Content-Length": "3"})):
                async with stream_post(client, target, body, headers) as resp:
                    assert resp.status_code == 200
            assert len(client.post_heads) == 2
        await server.stop()

    _run(main)
    first, second, other, own = requests
    assert first.endswith(b"\r\n\r\n{}") and second.endswith(b'\r\n\r\n{"long":true}')
    assert b"content-length: 2" in _fields(first) and b"content-length: 13" in _fields(second)
    assert [f for f in _fields(first) if not f.startswith(b"content-length")] == \
        [f for f in _fields(second) if not f.startswith(b"content-length")]
    assert b"x-a: 2" in _fields(other) and b"authorization: bearer k" in _fields(other)
    assert [f for f in _fields(own) if f.startswith(b"content-length")] == \
        [b"content-length: 3"]


def test_stream_post_refuses_a_header_that_would_split_the_head() -> None:
    requests: list[bytes] = []

    async def main():
        server = Server(lambda r, w: _record(r, w, requests))
        url = await server.start()
        async with http_client(UpstreamConfig(name="u", kind="openai", base_url=url),
                               {}, None) as client:
            with pytest.raises(httpx.LocalProtocolError):
                async with stream_post(client, httpx.URL(url), b"{}",
                                       {"x-a": "v\r\nx-injected: 1"}):
                    pass
            async with stream_post(client, httpx.URL(url), b"{}", {}) as resp:
                assert resp.status_code == 200
        await server.stop()

    _run(main)
    assert len(requests) == 1 and b"injected" not in requests[0]


def test_stream_post_reuses_its_connection_and_decodes_a_content_encoding() -> None:
    import gzip
    answers = [_chunk(b"data: a\n\n") + b"0\r\n\r\n",
               _chunk(gzip.compress(b"data: zipped\n\n")) + b"0\r\n\r\n"]

    async def handler(reader, writer):
        for i, body in enumerate(answers):
            await _read_request(reader)
            coding = b"content-encoding: gzip\r\n" if i else b""
            writer.write(CHUNKED_HEAD[:-2] + coding + b"\r\n" + body)
            await writer.drain()
        await reader.read()

    async def main():
        server = Server(handler)
        url = await server.start()
        seen = []
        async with http_client(UpstreamConfig(name="u", kind="openai", base_url=url),
                               {}, None) as client:
            for _ in answers:
                async with stream_post(client, httpx.URL(url), b"{}", {}) as resp:
                    assert resp.headers["content-type"] == "text/event-stream"
                    seen.append(b"".join([c async for c in resp.aiter_bytes()]))
        await server.stop()
        assert seen == [b"data: a\n\n", b"data: zipped\n\n"]
        assert server.accepts == 1

    _run(main)


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "httpx"])
@pytest.mark.parametrize("coding", ["gzip", "br", "deflate"])
def test_a_coded_body_is_decoded_in_bounded_pieces_never_one_read_whole(coding: str,
                                                                         lean: bool) -> None:
    """httpx's decoders expanded each read whole: a 420-byte brotli body took a gateway from
    56 to 579 MB for one request (1.6 KB is 1 GB of zeros). Decoded here in pieces of at
    most PIECE_BYTES, handed on one at a time, the reader's back-pressure bounds it. An
    answer through httpx's own transport (a proxy's) was still decoded by httpx's."""
    import zlib

    import brotli

    from tokenwire.gateway.upstreams.content_coding import PIECE_BYTES

    plain = b"data: " + b"0" * (16 << 20) + b"\n\n"  # 16 MiB that compress to ~16-50 KB
    coded = {"gzip": lambda b: zlib.compress(b, 9, wbits=31),
             "br": lambda b: brotli.compress(b, quality=5),
             "deflate": lambda b: zlib.compress(b, 9)}[coding](plain)
    assert len(coded) < 64 * 1024  # one or two reads, far more than a piece each

    sizes = [len(piece) for piece in _coded_answer(coding, coded, lean=lean)]
    # brotli's output limit is a hint: its pieces came at 1.5x it (98,272 bytes)
    assert sum(sizes) == len(plain) and max(sizes) <= 2 * PIECE_BYTES


@pytest.mark.parametrize(("coding", "body"), [("zstd", b"(\xb5/\xfd..."), ("gzip, br", b"x"),
                                              ("gzip", b"not gzip at all")])
@pytest.mark.parametrize("lean", [True, False], ids=["lean", "httpx"])
def test_a_coding_that_cannot_be_decoded_is_a_malformed_answer(coding: str, body: bytes,
                                                               lean: bool) -> None:
    with pytest.raises(MalformedAnswer):
        _coded_answer(coding, body, lean=lean)


def _coded_answer(coding: str, body: bytes, *, lean: bool = True) -> list[bytes]:
    """The pieces a streamed POST's reader reads of a chunked answer with
    ``Content-Encoding: coding`` and ``body`` as its one chunk (what the read raises,
    raised); ``lean=False``: through httpx's own transport, as when a proxy is set."""
    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(CHUNKED_HEAD[:-2] + f"content-encoding: {coding}\r\n\r\n".encode()
                     + _chunk(body) + b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    pieces: list[bytes] = []

    async def main():
        server = Server(handler)
        url = await server.start()
        try:
            client = http_client(UpstreamConfig(name="u", kind="openai", base_url=url),
                                 {}, None) if lean else httpx.AsyncClient(timeout=10.0)
            async with client:
                post = stream_post(client, httpx.URL(url), b"{}", {})
                async with post:
                    reader = post.reader()
                    while piece := await reader.read():
                        pieces.append(piece)
        finally:
            await server.stop()

    _run(main)
    return pieces


def test_upstreams_are_asked_for_identity_unless_the_configuration_says_otherwise() -> None:
    plain = http_client(UpstreamConfig(name="u", kind="openai", base_url="http://x"), {}, None)
    own = http_client(UpstreamConfig(name="u", kind="openai", base_url="http://x",
                                     headers=(("accept-encoding", "gzip"),)), {}, None)
    assert plain.headers.get_list("accept-encoding") == ["identity"]
    assert own.headers.get_list("accept-encoding") == ["gzip"]


@pytest.mark.parametrize("types", [[b"text/event-stream"], [], [b"text/plain", b"x/y"],
                                   [b"text/event-stream; charset=utf-8"]])
def test_stream_post_content_type_is_httpx_s_reading_of_the_head(types: list[bytes]) -> None:
    """The lean answer's ``Content-Type`` is read with its head (no ``httpx.Headers``): the
    same string httpx's ``headers.get`` gives, absent and repeated ones included."""
    head = b"HTTP/1.1 200 OK\r\n" + b"".join(b"content-type: %s\r\n" % t for t in types) + \
        b"transfer-encoding: chunked\r\n\r\n0\r\n\r\n"

    async def handler(reader, writer):
        await _answer_each_request(reader, writer, head)

    async def main():
        server = Server(handler)
        url = await server.start()
        seen = []
        for transport in (None, httpx.AsyncHTTPTransport()):
            async with http_client(UpstreamConfig(name="u", kind="openai", base_url=url),
                                   {}, transport) as client:
                post = stream_post(client, httpx.URL(url), b"{}", {})
                async with post as resp:
                    seen.append((post.content_type, resp.headers.get("content-type", "")))
        await server.stop()
        assert seen[0] == seen[1] and seen[0][0] == seen[0][1]
        assert seen[0][0] == ", ".join(t.decode() for t in types)

    _run(main)


def test_stream_post_times_out_a_silent_upstream_with_httpx_exception() -> None:
    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(CHUNKED_HEAD)
        await writer.drain()
        await reader.read()  # then nothing: the body never comes

    async def main():
        server = Server(handler)
        url = await server.start()
        config = UpstreamConfig(name="u", kind="openai", base_url=url, read_timeout_s=0.2)
        async with http_client(config, {}, None) as client:
            async with stream_post(client, httpx.URL(url), b"{}", {}) as resp:
                with pytest.raises(httpx.ReadTimeout) as caught:
                    async for _ in resp.aiter_bytes():
                        pass
        await server.stop()
        assert failure_from_exception(caught.value, started=True).code == "read_timeout"

    _run(main)


def test_one_timer_serves_a_connection_s_timed_waits() -> None:
    """A streamed body waits once per chunk: the timer the first wait armed stays armed for
    the later waits (their deadlines are later), and when it fires early for the wait in
    progress it is re-armed for that wait's own deadline; only that one fails the wait."""
    async def main():
        conn = _Connection(asyncio.get_running_loop())
        first = asyncio.ensure_future(conn.read(100.0))
        await asyncio.sleep(0)
        armed = conn._timer
        assert armed is not None
        conn.data_received(b"a")
        assert await first == b"a"
        second = asyncio.ensure_future(conn.read(200.0))
        await asyncio.sleep(0)
        assert conn._timer is armed  # a later deadline: nothing re-armed
        until = conn._until
        assert until > conn._timer_at

        armed.cancel()
        conn._on_timer()  # the first wait's deadline comes, during the second wait
        assert not second.done()
        assert conn._timer is not None and conn._timer_at == until

        conn._timer.cancel()
        conn._on_timer()  # the second wait's own deadline
        with pytest.raises(TimeoutError):
            await second
        conn.close()
        assert conn._timer is None

    _run(main)


# -- a body pushed in its connection's callback (_ChunkedBody.listen) ------------------------


def _pushed_body(timeout: float | None = 100.0) -> tuple[LeanTransport, _Connection,
                                                         _ChunkedBody]:
    transport = LeanTransport(max_connections=1)
    conn = _Connection(asyncio.get_running_loop())
    body = _ChunkedBody(transport, ("http", "up", 80), conn, None, timeout, start=b"",
                        keep_alive=True)
    return transport, conn, body


def test_a_pushed_body_hands_each_chunk_over_and_wakes_its_reader_only_at_the_end() -> None:
    async def main():
        transport, conn, body = _pushed_body()
        assert body.can_listen()
        pieces: list[bytes] = []
        body.listen(pieces.append)
        waiting = asyncio.ensure_future(body.wait_pushed())
        await asyncio.sleep(0)
        conn.data_received(_chunk(b"a"))
        conn.data_received(_chunk(b"b") + _chunk(b"c")[:3])  # a chunk split across reads
        await asyncio.sleep(0)
        assert pieces == [b"a", b"b"] and not waiting.done()
        conn.data_received(_chunk(b"c")[3:] + b"0\r\n\r\n")
        await asyncio.wait_for(waiting, 5)  # the end wakes it (a safety net, not a timing)
        assert pieces == [b"a", b"b", b"c"] and conn.listener is None
        assert await body.read() == b""  # the end, as read() gives it: the connection pooled
        assert conn in transport._idle[("http", "up", 80)]
        await transport.aclose()

    _run(main)


def test_listen_none_wakes_the_reader_and_later_bytes_wait_in_the_buffer() -> None:
    async def main():
        transport, conn, body = _pushed_body()
        pieces: list[bytes] = []
        body.listen(pieces.append)
        waiting = asyncio.ensure_future(body.wait_pushed())
        await asyncio.sleep(0)
        body.listen(None)
        await asyncio.wait_for(waiting, 5)
        conn.data_received(_chunk(b"late"))
        assert pieces == [] and not body.can_listen()  # buffered: read() takes it
        assert await body.read() == b"late"
        await transport.aclose()

    _run(main)


def test_a_pushed_body_times_out_after_silence_since_its_last_bytes() -> None:
    """The connection's timer, armed when the wait began, fires: bytes came since, so it is
    re-armed for the silence that began with them; when that passes, ReadTimeout."""
    async def main():
        transport, conn, body = _pushed_body(timeout=100.0)
        body.listen(lambda piece: None)
        waiting = asyncio.ensure_future(body.wait_pushed())
        await asyncio.sleep(0)
        armed_for = conn._timer_at
        conn.data_received(_chunk(b"a"))
        assert conn._until > armed_for
        conn._timer.cancel()
        conn._on_timer()  # the first deadline: not silent that long
        assert not waiting.done() and conn._timer_at == conn._until
        conn._timer.cancel()
        conn._on_timer()  # silent for the whole read timeout
        with pytest.raises(httpx.ReadTimeout):
            await waiting
        assert conn.closed
        await transport.aclose()

    _run(main)


@pytest.mark.parametrize("end", ["eof", "lost", "bad_framing"])
def test_a_pushed_body_that_breaks_fails_as_a_read_would(end: str) -> None:
    async def main():
        transport, conn, body = _pushed_body()
        body.listen(lambda piece: None)
        waiting = asyncio.ensure_future(body.wait_pushed())
        await asyncio.sleep(0)
        conn.data_received(_chunk(b"a"))
        if end == "eof":
            conn.eof_received()
        elif end == "lost":
            conn.connection_lost(ConnectionResetError("reset"))
        else:
            conn.data_received(b"zz\r\n")
        if end == "bad_framing":
            with pytest.raises(httpx.RemoteProtocolError):
                await asyncio.wait_for(waiting, 5)
            await transport.aclose()
            return
        await asyncio.wait_for(waiting, 5)  # woken: the reader sees the end itself
        assert not body.can_listen()
        with pytest.raises(httpx.RemoteProtocolError if end == "eof" else httpx.ReadError):
            await body.read()
        await transport.aclose()

    _run(main)


def test_take_start_decodes_what_came_with_the_head_once() -> None:
    async def main():
        transport = LeanTransport(max_connections=1)
        conn = _Connection(asyncio.get_running_loop())
        body = _ChunkedBody(transport, ("http", "up", 80), conn, None, 100.0,
                            start=_chunk(b"a") + _chunk(b"b")[:2], keep_alive=True)
        assert not body.can_listen()  # the head's leftover comes first
        assert body.take_start() == [b"a"]
        assert body.take_start() == [] and body.can_listen()
        conn.data_received(_chunk(b"b")[2:])
        assert await body.read() == b"b"  # the rest of the split chunk, as read() gives it

        broken = _ChunkedBody(transport, ("http", "up", 80), _Connection(
            asyncio.get_running_loop()), None, 100.0, start=b"zz\r\n", keep_alive=True)
        with pytest.raises(httpx.RemoteProtocolError):
            broken.take_start()
        await transport.aclose()

    _run(main)


@pytest.mark.parametrize(("coding", "encode"), [
    ("gzip", lambda b: __import__("zlib").compress(b, wbits=31)),
    ("x-gzip", lambda b: __import__("zlib").compress(b, wbits=31)),
    ("deflate", lambda b: __import__("zlib").compress(b)),  # zlib's format, as RFC 9110 says
    ("deflate", lambda b: __import__("zlib").compress(b, wbits=-15)),  # raw, as some send
    ("br", lambda b: __import__("brotli").compress(b)),
])
def test_each_coding_decodes_however_the_reads_split_it(coding: str, encode) -> None:
    from tokenwire.gateway.upstreams.content_coding import decoded_pieces

    plain = b"data: " + bytes(range(256)) * 300 + b"\n\n"
    coded = encode(plain)

    async def reads(size: int):
        for i in range(0, len(coded), size):
            yield coded[i:i + size]

    async def decode(size: int) -> bytes:
        return b"".join([p async for p in decoded_pieces(reads(size), coding)])

    for size in (1, 7, len(coded)):
        assert asyncio.run(decode(size)) == plain


@pytest.mark.parametrize(("coding", "body"), [
    ("gzip", __import__("zlib").compress(b"x", wbits=31) + b"more"),
    ("deflate", __import__("zlib").compress(b"x") + b"more"),
    ("deflate", b"\xff\xff not deflate either way"),
])
def test_a_coded_body_that_breaks_names_its_coding(coding: str, body: bytes) -> None:
    from tokenwire.gateway.upstreams.content_coding import UnsupportedCoding, decoded_pieces

    async def reads():
        yield body

    async def decode() -> None:
        async for _ in decoded_pieces(reads(), coding):
            pass

    with pytest.raises(UnsupportedCoding, match=f"not valid {coding}"):
        asyncio.run(decode())
