"""The local balancer (cluster/balancer.py) over real uvicorn servers on loopback sockets.

Each property a client can see is checked against backends that make it observable
without timing: a stream whose second chunk is held until the client has read the first
(so a buffering balancer would hang, caught by the safety timeout), a backend that breaks
its connection mid-body, a backend that waits for its client to go away.
"""

from __future__ import annotations

import asyncio
import json

import h11
import httpx
import pytest
import websockets
from starlette.requests import Request

from tests.gateway.faults.scripted_upstream import closed_port, serve_app
from tokenwire.cluster.balancer import INSTANCE_HEADER, Backend, Balancer

#: Safety net for each test's whole run; never the thing measured.
SAFETY_S = 60.0


class _App:
    """A backend named ``name``; ``gate`` holds the second chunk of ``/stream``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.gate = asyncio.Event()
        self.disconnected = asyncio.Event()
        self.bodies: list[bytes] = []

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "websocket":
            await self._ws(receive, send)
            return
        if scope["type"] != "http":
            return
        body = await Request(scope, receive).body()
        self.bodies.append(body)
        path = scope["path"]
        head = [(b"content-type", b"text/plain"), (b"x-backend", self.name.encode())]
        if path.startswith("/status/"):
            await send({"type": "http.response.start", "status": int(path[8:]),
                        "headers": [*head, (b"retry-after", b"7"), (b"x-custom", b"kept")]})
            await send({"type": "http.response.body", "body": b'{"error": "scripted"}'})
            return
        if path == "/echo":
            await send({"type": "http.response.start", "status": 200, "headers": head})
            await send({"type": "http.response.body", "body": body})
            return
        await send({"type": "http.response.start", "status": 200, "headers": head})
        if path == "/stream":
            await send({"type": "http.response.body", "body": b"one,", "more_body": True})
            await self.gate.wait()
            await send({"type": "http.response.body", "body": b"two", "more_body": False})
        elif path == "/cut":
            await send({"type": "http.response.body", "body": b"one,", "more_body": True})
            raise RuntimeError("scripted crash mid-body")  # uvicorn drops the connection
        elif path == "/hold":
            await send({"type": "http.response.body", "body": b"one,", "more_body": True})
            beats = asyncio.create_task(self._heartbeats(send))
            while (await receive())["type"] != "http.disconnect":
                pass
            beats.cancel()
            self.disconnected.set()
        else:
            await send({"type": "http.response.body", "body": self.name.encode()})

    @staticmethod
    async def _heartbeats(send) -> None:
        """What a gateway's stream writes while it waits (``heartbeat_s``): a client that
        left is found by a write (the balancer cannot tell it from a half-close before)."""
        while True:
            await asyncio.sleep(0.05)  # pacing, not a measurement
            await send({"type": "http.response.body", "body": b":", "more_body": True})

    async def _ws(self, receive, send) -> None:
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        while True:
            msg = await receive()
            if msg["type"] != "websocket.receive":
                return
            await send({"type": "websocket.send", "text": f"{self.name}:{msg.get('text')}"})


async def _cluster(n: int = 2, *, dead_first: bool = False):
    apps = [_App(f"b{i}") for i in range(n)]
    servers = [await serve_app(app) for app in apps]
    backends = [Backend("127.0.0.1", port) for _, _, port in servers]
    if dead_first:
        backends.insert(0, Backend("127.0.0.1", closed_port()))
    balancer = Balancer(backends)
    port = await balancer.start()
    return apps, servers, balancer, f"http://127.0.0.1:{port}"


async def _close(servers, balancer) -> None:
    await balancer.aclose()
    for server, task, _ in servers:
        server.stop()
        await task


def _run(coro) -> None:
    asyncio.run(asyncio.wait_for(coro, SAFETY_S))


def test_each_request_of_one_keep_alive_connection_goes_to_the_next_backend() -> None:
    async def main() -> None:
        _apps, servers, balancer, url = await _cluster(3)
        async with httpx.AsyncClient(base_url=url) as client:
            answers = [(await client.get("/")) for _ in range(6)]
        assert [a.text for a in answers] == ["b0", "b1", "b2", "b0", "b1", "b2"]
        assert len({a.headers[INSTANCE_HEADER] for a in answers}) == 3
        assert [b.requests for b in balancer.backends] == [2, 2, 2]
        await _close(servers, balancer)

    _run(main())


def test_status_headers_and_body_pass_through_unchanged() -> None:
    async def main() -> None:
        apps, servers, balancer, url = await _cluster(1)
        async with httpx.AsyncClient(base_url=url) as client:
            r = await client.get("/status/429")
            echoed = await client.post("/echo", content=b"x" * 300_000)
        assert r.status_code == 429 and r.headers["retry-after"] == "7"
        assert r.headers["x-custom"] == "kept" and r.json() == {"error": "scripted"}
        assert echoed.content == b"x" * 300_000 and apps[0].bodies[-1] == b"x" * 300_000
        await _close(servers, balancer)

    _run(main())


def test_a_stream_is_forwarded_chunk_by_chunk_not_buffered() -> None:
    async def main() -> None:
        apps, servers, balancer, url = await _cluster(1)
        async with httpx.AsyncClient(base_url=url) as client, \
                client.stream("GET", "/stream") as r:
            chunks = r.aiter_raw()
            first = await anext(chunks)  # the backend holds "two" until this arrived
            assert first == b"one,"
            apps[0].gate.set()
            rest = b"".join([c async for c in chunks])
        assert rest == b"two"
        await _close(servers, balancer)

    _run(main())


def test_a_backend_cut_mid_body_is_a_cut_for_the_client() -> None:
    async def main() -> None:
        _apps, servers, balancer, url = await _cluster(1)
        async with httpx.AsyncClient(base_url=url) as client:
            with pytest.raises(httpx.RemoteProtocolError):
                async with client.stream("GET", "/cut") as r:
                    assert r.status_code == 200
                    async for _ in r.aiter_raw():
                        pass
            # The balancer itself is fine: the next request is answered.
            assert (await client.get("/")).text == "b0"
        await _close(servers, balancer)

    _run(main())


def test_a_client_that_goes_away_closes_the_backend_connection() -> None:
    async def main() -> None:
        apps, servers, balancer, url = await _cluster(1)
        async with httpx.AsyncClient(base_url=url) as client, \
                client.stream("GET", "/hold") as r:
            assert await anext(r.aiter_raw()) == b"one,"
        await apps[0].disconnected.wait()  # the safety timeout fails the test otherwise
        await _close(servers, balancer)

    _run(main())


def test_a_client_that_half_closes_after_its_request_gets_the_whole_response() -> None:
    """``shutdown(SHUT_WR)`` once the request is sent (netcat -N, some scripts) says "no
    more requests", not "gone": the response, streamed or not, still comes whole."""
    async def main() -> None:
        apps, servers, balancer, url = await _cluster(1)
        port = int(url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello")
        writer.write_eof()  # shutdown(SHUT_WR)
        answer = await reader.read()  # until the balancer closes
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"5\r\nhello\r\n0\r\n\r\n")
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
        writer.write_eof()
        head = await reader.readuntil(b"one,\r\n")  # the first chunk, then release the rest
        apps[0].gate.set()
        answer = head + await reader.read()
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"two\r\n0\r\n\r\n")
        writer.close()
        await _close(servers, balancer)

    _run(main())


def test_a_request_body_cut_short_by_the_client_is_its_400_not_the_instance_s_502() -> None:
    async def main() -> None:
        _apps, servers, balancer, url = await _cluster(1)
        port = int(url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nhello")
        writer.write_eof()  # 5 of the 10 bytes it announced
        answer = await reader.read()
        assert answer.startswith(b"HTTP/1.1 400"), answer
        assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == (
            "incomplete_request")
        writer.close()
        await _close(servers, balancer)

    _run(main())


def test_a_refused_backend_is_skipped_and_none_left_is_a_502() -> None:
    async def main() -> None:
        _apps, servers, balancer, url = await _cluster(1, dead_first=True)
        async with httpx.AsyncClient(base_url=url) as client:
            assert [(await client.get("/")).text for _ in range(3)] == ["b0"] * 3
            for server, task, _ in servers:
                server.stop()
                await task
            r = await client.get("/")
        assert r.status_code == 502 and r.json()["error"]["code"] == "no_instance"
        await balancer.aclose()

    _run(main())


def test_a_malformed_request_gets_400_from_the_balancer() -> None:
    async def main() -> None:
        apps, servers, balancer, _ = await _cluster(1)
        reader, writer = await asyncio.open_connection("127.0.0.1", balancer.port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n")
        head = await reader.read(4096)
        assert head.startswith(b"HTTP/1.1 400 ")
        assert json.loads(head.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "invalid_request"
        writer.close()
        assert apps[0].bodies == []
        await _close(servers, balancer)

    _run(main())


def test_websocket_is_spliced_through_after_the_101() -> None:
    async def main() -> None:
        _apps, servers, balancer, url = await _cluster(2)
        async with websockets.connect(url.replace("http", "ws") + "/ws") as ws:
            for word in ("a", "b", "c"):
                await ws.send(word)
                assert await ws.recv() == f"b0:{word}"  # one socket, one backend
        await _close(servers, balancer)

    _run(main())


def test_bytes_a_client_sends_during_a_response_are_kept_only_up_to_a_head() -> None:
    """A client that keeps sending after its request while the response streams back: the
    balancer keeps at most one head's worth for a next request and leaves the rest in the
    socket (back-pressure), instead of buffering all of it."""
    from tokenwire.cluster import balancer as bal

    async def main() -> tuple[int, int]:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=bal.MAX_HEAD_BYTES)
        b_conn = h11.Connection(h11.CLIENT)
        b_conn.send(h11.Request(method="POST", target="/", headers=[
            ("host", "x"), ("content-length", "2")]))
        reader = asyncio.StreamReader(limit=bal.MAX_HEAD_BYTES)
        reader.feed_data(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhi")
        flood = 4 * 1024 * 1024
        reader.feed_data(b"x" * flood)  # never EOF: the client keeps its side open
        sent = bytearray()

        class Writer:
            def write(self, data: bytes) -> None:
                sent.extend(data)

            async def drain(self) -> None:
                return None

        await asyncio.wait_for(bal._upload(conn, reader, b_conn, Writer()), 10)  # type: ignore[arg-type]
        kept = len(conn.trailing_data[0])
        return kept, flood - kept

    kept, left = asyncio.run(main())
    assert kept <= 2 * 64 * 1024  # one head's worth (plus the last read)
    assert left > 0  # the rest is still in the socket's buffer, unread
