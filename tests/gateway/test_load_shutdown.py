"""Issue 6, the load test in small: many streaming clients through the capacity queue, and a
graceful shutdown that finishes or cleanly fails every one of them.

The gateway is the real stack (``harden(create_app())`` under
:func:`~tokenwire.gateway.http.shutdown.graceful_server`, uvicorn on a free loopback port, in a
thread); its upstream is :class:`MarkerUpstream`, which streams text (and ids) naming the
marker found in each request's prompt. Every client has its own marker, so a lost,
duplicated or crossed event shows as text that is not exactly the client's own, and every
client must see exactly one terminal. Assertions are structural (counts, text, terminals),
never timings. ``bench/bench_load.py`` is the 500-client version (BENCHMARKS.md).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import msgspec
import pytest
import uvicorn

from tokenwire.codec.detokenizer import Detokenizer
from tokenwire.codec.frames_msgpack import FrameDecoder
from tokenwire.codec.maps import TokenizerMap
from tokenwire.codec.tokenizer import Tokenizer
from tokenwire.gateway.http.app import create_app
from tokenwire.gateway.http.security import harden
from tokenwire.gateway.http.shutdown import DrainGate, GracefulServer, graceful_server
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.ir import Event, Finish, FinishKind, GenerationRequest, TokenDelta
from tokenwire.gateway.settings import ServerSettings

pytestmark = pytest.mark.slow

APIS = ("chat", "responses", "codec")
CLIENTS = 120
_MARKER = re.compile(r"marker (\w+)")


def chunk_text(marker: str, i: int) -> str:
    return f" {marker}x{i}"


# -- the upstream --------------------------------------------------------------------------------


@dataclass
class MarkerUpstream:
    """``tokens`` chunks ``pace_s`` apart naming the request's marker; counts requests."""

    tmap: TokenizerMap
    tokens: int
    pace_s: float
    model_id: str = "marker-model"
    served: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self._tok = Tokenizer.from_map(self.tmap)

    def submit(self, request: GenerationRequest) -> _MarkerStream:
        found = _MARKER.search(msgspec.json.encode(request).decode())
        marker = found.group(1) if found else "none"
        self.served[marker] += 1
        return _MarkerStream(self, marker)


class _MarkerStream:
    def __init__(self, up: MarkerUpstream, marker: str) -> None:
        self._up, self._marker, self._i = up, marker, 0

    async def next_event(self) -> Event:
        await asyncio.sleep(self._up.pace_s)
        if self._i == self._up.tokens:
            return Finish(reason=FinishKind.EOS)
        text = chunk_text(self._marker, self._i)
        self._i += 1
        return TokenDelta(ids=tuple(self._up._tok.encode(text)), text=text)

    def cancel(self) -> None:
        pass


# -- the server ------------------------------------------------------------------------------


@dataclass
class Running:
    url: str
    state: GatewayState
    server: GracefulServer
    thread: threading.Thread
    upstream: MarkerUpstream


def _start(tmap: TokenizerMap, *, tokens: int, pace_s: float, drain_grace_s: float,
           heartbeat_s: float) -> Running:
    upstream = MarkerUpstream(tmap, tokens, pace_s)
    settings = ServerSettings(max_concurrent=4, queue_size=200, heartbeat_s=heartbeat_s)
    state = GatewayState(settings=settings, upstream=upstream, tmap=tmap, max_model_len=4096)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(512)
    config = uvicorn.Config(harden(create_app(state), settings), log_level="warning",
                            lifespan="off", timeout_graceful_shutdown=10)
    server = graceful_server(config, state, drain_grace_s=drain_grace_s)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the gateway did not start"
        time.sleep(0.02)
    return Running(f"http://127.0.0.1:{sock.getsockname()[1]}", state, server, thread,
                   upstream)


@pytest.fixture
def gateways(smollm2_map) -> Iterator[list[Running]]:
    started: list[Running] = []
    yield started
    for g in started:
        g.server.should_exit = True
        g.server.force_exit = True
        g.thread.join(10)


# -- the clients -----------------------------------------------------------------------------


@dataclass
class Seen:
    api: str
    marker: str
    status: int | None = None
    text: str = ""
    ids: list[int] = field(default_factory=list)
    terminals: list[str] = field(default_factory=list)
    after_terminal: int = 0
    keepalives: int = 0  # keep-alive events before the first output
    cut: str | None = None
    error: dict | None = None  # the error body of a non-200 answer

    @property
    def clean_failure(self) -> bool:
        """A terminal failure in the stream, or an error answer before any byte of one."""
        if self.status == 200:
            return self.terminals == ["failed"] and self.after_terminal == 0
        return self.status == 503 and self.error is not None and not self.terminals


def _sse_events(buf: bytearray, data: bytes) -> Iterator[tuple[str, str]]:
    buf += data
    while (end := buf.find(b"\n\n")) >= 0:
        block = bytes(buf[:end]).decode()
        del buf[:end + 2]
        name, datas = "message", []
        for line in block.split("\n"):
            if line.startswith(":"):
                yield ":", line
            elif line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                datas.append(line[5:].lstrip())
        if datas:
            yield name, "\n".join(datas)


def _on_sse(s: Seen, name: str, data: str) -> None:
    if name == ":" or data == "[DONE]":
        s.keepalives += name == ":" and not s.text
        return
    if s.terminals:
        s.after_terminal += 1
        return
    if s.api == "responses":
        if name in ("response.created", "response.in_progress"):
            s.keepalives += not s.text
        elif name == "response.output_text.delta":
            s.text += json.loads(data)["delta"]
        elif name == "response.completed":
            s.terminals.append("complete")
        elif name in ("response.failed", "response.incomplete", "error"):
            s.terminals.append("failed")
        return
    obj = json.loads(data)
    if "error" in obj:
        s.terminals.append("failed")
        return
    choice = obj["choices"][0]
    s.text += choice["delta"].get("content") or ""
    if choice.get("finish_reason"):
        s.terminals.append("complete" if choice["finish_reason"] == "stop" else "failed")


async def _client(client: httpx.AsyncClient, url: str, api: str, marker: str) -> Seen:
    s = Seen(api, marker)
    prompt = f"Please answer: marker {marker}"
    if api == "responses":
        path, body = "/v1/responses", {"model": "marker-model", "input": prompt,
                                       "stream": True, "store": False}
    else:
        path, body = "/v1/chat/completions", {
            "model": "marker-model", "stream": True,
            "messages": [{"role": "user", "content": prompt}]}
        if api == "codec":
            body["stream_format"] = "msgpack"
    try:
        async with client.stream("POST", url + path, json=body) as r:
            s.status = r.status_code
            if r.status_code != 200:
                s.error = json.loads(await r.aread())
                return s
            buf, dec = bytearray(), FrameDecoder()
            async for data in r.aiter_bytes():
                if api != "codec":
                    for name, payload in _sse_events(buf, data):
                        _on_sse(s, name, payload)
                    continue
                for frame in dec.feed(data):
                    if s.terminals:
                        s.after_terminal += 1
                    elif frame.done:
                        s.terminals.append("failed" if frame.finish_reason == "error"
                                           else "complete")
                    elif frame.ids:
                        s.ids.extend(frame.ids)
                    else:
                        s.keepalives += not s.ids
    except httpx.HTTPError as exc:
        s.cut = type(exc).__name__
    return s


async def _wave(url: str, n: int, prefix: str, *, on_all_sent=None) -> list[Seen]:
    # Several small pools: httpcore's pool scans every connection on each request.
    clients = [httpx.AsyncClient(timeout=httpx.Timeout(60.0),
                                 limits=httpx.Limits(max_connections=16)) for _ in range(8)]
    try:
        tasks = [asyncio.create_task(_client(clients[i % 8], url, APIS[i % 3],
                                             f"{prefix}{i:03d}")) for i in range(n)]
        if on_all_sent is not None:
            await on_all_sent()
        return list(await asyncio.gather(*tasks))
    finally:
        for c in clients:
            await c.aclose()


def _text(s: Seen, detok: Detokenizer) -> str:
    return detok.decode(s.ids) if s.api == "codec" else s.text


def _expected(marker: str, tokens: int) -> str:
    return "".join(chunk_text(marker, i) for i in range(tokens))


async def _until_in_flight(url: str, n: int) -> None:
    """Wait until the gateway holds all ``n`` requests (running + queued): the shutdown then
    meets every one of them mid-flight."""
    async with httpx.AsyncClient() as c:
        for _ in range(600):
            health = (await c.get(url + "/health")).json()
            if health["running"] + health["queued"] >= n:
                return
            await asyncio.sleep(0.05)
    raise AssertionError("the clients never were all in flight")


# -- the tests --------------------------------------------------------------------------------


def test_every_queued_client_gets_exactly_its_own_answer(gateways, smollm2_map) -> None:
    tokens = 8
    gw = _start(smollm2_map, tokens=tokens, pace_s=0.01, drain_grace_s=5, heartbeat_s=0.2)
    gateways.append(gw)
    seen = asyncio.run(_wave(gw.url, CLIENTS, "q"))
    detok = Detokenizer(smollm2_map)
    for s in seen:
        assert (s.status, s.cut, s.after_terminal) == (200, None, 0), s
        assert s.terminals == ["complete"], s
        assert _text(s, detok) == _expected(s.marker, tokens), s
    # One upstream request per client: nothing lost, nothing replayed.
    assert gw.upstream.served == Counter({s.marker: 1 for s in seen})
    # 120 clients through 4 slots: the last ones waited many heartbeat periods, and were
    # kept alive meanwhile (SSE comments on Chat, empty frames on Codec).
    for api in ("chat", "codec"):
        assert max(s.keepalives for s in seen if s.api == api) >= 1
    assert gw.state.admission.counts() == (0, 0)


def test_graceful_shutdown_finishes_or_cleanly_fails_every_stream(gateways, smollm2_map) -> None:
    tokens = 40  # ~2 s a stream: far more work than the grace period holds
    gw = _start(smollm2_map, tokens=tokens, pace_s=0.05, drain_grace_s=0.5, heartbeat_s=0.2)
    gateways.append(gw)

    async def shut_down_once_all_in_flight() -> None:
        await _until_in_flight(gw.url, CLIENTS)
        gw.server.begin_shutdown()

    seen = asyncio.run(_wave(gw.url, CLIENTS, "s", on_all_sent=shut_down_once_all_in_flight))
    gw.thread.join(30)
    assert not gw.thread.is_alive(), "the gateway did not exit"
    detok = Detokenizer(smollm2_map)
    outcomes = Counter()
    for s in seen:
        assert s.cut is None, s  # nothing cut
        text, want = _text(s, detok), _expected(s.marker, tokens)
        if s.terminals == ["complete"] and s.after_terminal == 0:
            assert text == want, s
            outcomes["complete"] += 1
        else:  # a clean failure: what was sent before it is this client's, in order
            assert s.clean_failure and want.startswith(text), s
            outcomes["failed"] += 1
    assert gw.server.aborted
    assert outcomes["failed"] >= 1
    assert all(n <= 1 for n in gw.upstream.served.values())  # aborted, never replayed


def test_a_second_stop_request_skips_the_rest_of_the_grace_period(gateways,
                                                                   smollm2_map) -> None:
    tokens = 2000  # ~100 s a stream, and a grace period longer still: only the skip ends it
    gw = _start(smollm2_map, tokens=tokens, pace_s=0.05, drain_grace_s=600, heartbeat_s=0.2)
    gateways.append(gw)

    async def stop_twice() -> None:
        await _until_in_flight(gw.url, 6)
        gw.server.begin_shutdown()
        gw.server.begin_shutdown()  # an operator's second Ctrl+C

    seen = asyncio.run(_wave(gw.url, 6, "t", on_all_sent=stop_twice))
    gw.thread.join(60)
    assert not gw.thread.is_alive() and gw.server.aborted
    assert all(s.cut is None and s.clean_failure for s in seen), seen


def test_drain_gate_refuses_inference_with_retry_after() -> None:
    calls: list[str] = []

    async def app(scope, receive, send) -> None:
        calls.append(scope["path"])

    gate = DrainGate(app)

    async def call(method: str, path: str) -> list[dict]:
        sent: list[dict] = []

        async def send(message) -> None:
            sent.append(message)

        async def receive() -> dict:
            return {"type": "http.request", "body": b""}

        await gate({"type": "http", "method": method, "path": path}, receive, send)
        return sent

    assert asyncio.run(call("POST", "/v1/responses")) == []  # not draining: passes
    gate.draining = True
    start, body = asyncio.run(call("POST", "/v1/chat/completions"))
    headers = dict(start["headers"])
    assert start["status"] == 503 and headers[b"retry-after"] == b"1"
    assert json.loads(body["body"])["error"]["code"] == "server_shutting_down"
    start, body = asyncio.run(call("POST", "/v1/messages"))
    assert json.loads(body["body"])["type"] == "error"  # Anthropic's shape on Messages
    assert asyncio.run(call("GET", "/health")) == []  # health still answers
    assert calls == ["/v1/responses", "/health"] and gate.refused == 2
