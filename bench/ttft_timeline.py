"""Where the time to the first token goes, across processes: client, gateway, upstream.

``bench_upstreams`` says how much tokenwire adds to the first token; this says where. One
client (httpx, as in ``bench_upstreams``) alternates four targets in front of the same
scripted upstream: the upstream directly, a byte relay (the least any extra process can
add on this machine), a Python floor (the least a Python gateway does: parse the request,
send its own, parse the SSE answer and render it again, in callbacks; ``_floor``), and
``tokenwire serve``. Every process stamps the same clock
(``time.perf_counter``, the system's monotonic clock), so the marks line up:

* the client: request sent (t0), response head returned, first content line;
* the upstream (its ASGI app wrapped): app called, head sent, first body sent;
* tokenwire (a few functions wrapped, nothing else changed): request bytes arrived, the
  upstream request written (start, end), the upstream's head arrived, the client's head
  and first body handed to the server (start, end).

Printed: each mark's median, in ms after t0, per target. Used in BENCHMARKS.md "Session of
2026-12-05 (2)", where it showed a write of the gateway waiting while the process it woke
ran on the gateway's own core, and "(3)", where ``--cpus`` pinned the gateway apart from
the other processes, and all of them on one core.

With ``--layers`` the gateway also marks each layer the first token crosses
(``_mark_layers``); with ``--calls N`` it counts its calls per function instead
(``sys.setprofile``, ``_Calls``: its marks are then slowed) and prints the N most called
of each span. Used in "Session of 2026-12-05 (7)".

The client marks its two writes of each request too (httpx writes the head, then the
body), and the gateway the read that brought the body when it came apart from the head;
the CPU each side ran on is noted (``sched_getcpu``). After the medians, ``_split``
prints the gateway's requests in two groups, body read with its head or apart, with their
medians: the two differ by ~0.6 ms on this machine ("Session of 2026-12-05 (9)").
``--raw FILE`` writes every request's marks (JSON lines) for any other cut, with its t0
on the monotonic clock (an ftrace ``trace_clock`` of ``mono`` lines up with it);
``--gateway-policy batch`` runs the gateway under ``SCHED_BATCH`` (its wake-ups then never
preempt the running process), a diagnosis, not a setting to serve with. ``--tree-b SRC``
serves another tree (a git worktree's ``src``) from a second gateway, the target
``tokenwire B``, in the same rounds (the two gateways' turns swapped every other round)
and prints B's medians against tokenwire's: the A/B of a change on one machine state.
Two processes of the same tree differ by up to ~0.4 ms here (``--tree-b src``), so one
run is a sample: repeat it ("Session of 2026-12-06 (10)"). ``--python-b PYTHON`` runs
that second gateway on another interpreter (a venv with the same packages), this tree
unless ``--tree-b`` names another: the A/B of an interpreter's build ("Session of
2026-12-06 (11)").

    PYTHONPATH=src .venv/bin/python -m bench.ttft_timeline [--rounds 80] [--tokens 64]
        [--pace 0.005] [--cpus 0,1] [--layers | --calls 40] [--serve-args "--coalesce-ms 0"]
        [--raw FILE] [--gateway-policy batch] [--tree-b /tmp/change/src]
        [--python-b /tmp/venv/bin/python]
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import ctypes
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench import bench_upstreams as bu

_pc = time.perf_counter
#: The CPU the calling thread runs on (glibc's ``sched_getcpu``; Python has no binding).
_cpu = ctypes.CDLL(None, use_errno=True).sched_getcpu
#: Marks named so are not times after t0 (a CPU number, the client's t0 itself on the
#: shared clock, to line a request up with a kernel trace): left out of times and medians.
INFO = "info: "
CPU_MARK = f"{INFO}cpu "
#: The gateway's mark of a body that arrived in a read of its own, apart from its head.
BODY_APART = "gateway: request body bytes arrived"
#: The second gateway's target (``--tree-b``).
TARGET_B = "tokenwire B"


class _Marks:
    """One row of first-occurrence marks per request, dumped as JSON on SIGUSR2; each row
    begins with the CPU the process ``who`` was on."""

    def __init__(self, out: str, who: str) -> None:
        self.rows: list[dict[str, float]] = []
        self._out = out
        self._cpu_mark = f"{CPU_MARK}{who}"
        signal.signal(signal.SIGUSR2, lambda *_: self._dump())

    def _dump(self) -> None:
        """Written whole, then renamed: the reader never sees half a file."""
        Path(self._out + ".part").write_text(json.dumps(self.rows))
        os.replace(self._out + ".part", self._out)

    def begin(self, name: str) -> None:
        self.rows.append({name: _pc(), self._cpu_mark: float(_cpu())})

    def mark(self, name: str) -> None:
        if self.rows and name not in self.rows[-1]:
            self.rows[-1][name] = _pc()


class _Calls:
    """Calls counted per function (``sys.setprofile``) in two spans of every request: from
    the request's bytes to the upstream write, and from the upstream's head to the client's
    first body; dumped beside the marks (``--calls``). A coroutine resumed counts as a call
    again (``sys.setprofile`` reports it so): a chain of awaits that waits pays it per frame."""

    def __init__(self, out: str) -> None:
        self.counts: dict[str, dict[str, int]] = {"request": {}, "response": {}, "spans": {}}
        self._span: dict[str, int] | None = None
        previous = signal.getsignal(signal.SIGUSR2)

        def dump(*args: Any) -> None:
            Path(out).write_text(json.dumps(self.counts))
            if callable(previous):
                previous(*args)

        signal.signal(signal.SIGUSR2, dump)

    def start(self, span: str) -> None:
        self._span = self.counts[span]
        spans = self.counts["spans"]
        spans[span] = spans.get(span, 0) + 1
        sys.setprofile(self._count)

    def stop(self) -> None:
        sys.setprofile(None)
        self._span = None

    def _count(self, frame: Any, event: str, arg: Any) -> None:
        if self._span is None:
            return
        if event == "call":
            code = frame.f_code
            key = f"{code.co_filename.rsplit('/site-packages/', 1)[-1]}:{code.co_name}"
        elif event == "c_call":
            key = f"C {getattr(arg, '__qualname__', arg)}"
        else:
            return
        self._span[key] = self._span.get(key, 0) + 1


# -- the instrumented processes (each run as ``python -m bench.ttft_timeline --serve-...``) --


def _stamped(data_received: Any, prefix: bytes, stamp: Any, otherwise: Any = None) -> Any:
    """A protocol's ``data_received`` that calls ``stamp()`` first when ``data`` starts so,
    else ``otherwise()`` when given."""

    def stamped(self: Any, data: bytes) -> None:
        if data.startswith(prefix):
            stamp()
        elif otherwise is not None:
            otherwise()
        data_received(self, data)

    return stamped


def _serve_gateway(out: str, argv: list[str]) -> None:
    from uvicorn.protocols.http import httptools_impl

    from tokenwire.cli.main import main
    from tokenwire.gateway.http import connections
    from tokenwire.gateway.upstreams import http_transport

    if os.environ.get("TTFT_POLICY") == "batch":
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    marks = _Marks(out, "gateway")
    calls = _Calls(out + ".calls") if os.environ.get("TTFT_CALLS") else None
    write = http_transport._Connection.write

    async def upstream_write(self: Any, data: bytes, timeout: float | None) -> None:
        if calls is not None:
            calls.stop()
        marks.mark("gateway: upstream request write")
        await write(self, data, timeout)
        marks.mark("gateway: upstream request written")

    send = httptools_impl.RequestResponseCycle.send

    async def client_send(self: Any, message: Any) -> None:
        kind = "head" if message["type"] == "http.response.start" else "first body"
        marks.mark(f"gateway: client {kind} send")
        if calls is not None and kind == "first body":
            calls.stop()
        await send(self, message)
        marks.mark(f"gateway: client {kind} sent")

    def request_bytes() -> None:
        marks.begin("gateway: request bytes arrived")
        if calls is not None:
            calls.start("request")

    def body_apart() -> None:  # a read that is not a request's start: its body, alone
        marks.mark(BODY_APART)

    def upstream_head() -> None:
        marks.mark("gateway: upstream head arrived")
        if calls is not None and marks.rows and \
                "gateway: client first body send" not in marks.rows[-1]:  # not start-up's
            calls.start("response")

    client_conn, upstream_conn = connections.GuardedHttpToolsProtocol, http_transport._Connection
    client_conn.data_received = _stamped(  # type: ignore[method-assign]
        client_conn.data_received, b"POST ", request_bytes, body_apart)
    upstream_conn.data_received = _stamped(  # type: ignore[method-assign]
        upstream_conn.data_received, b"HTTP/1.1 ", upstream_head)
    upstream_conn.write = upstream_write  # type: ignore[method-assign]
    httptools_impl.RequestResponseCycle.send = client_send  # type: ignore
    if os.environ.get("TTFT_LAYERS"):
        _mark_layers(marks)
    sys.argv = ["tokenwire", *argv]
    main()


def _mark_layers(marks: _Marks) -> None:
    """A mark at each layer the first token crosses (``--layers``, each ~1 µs): a class's
    method or a module's function wrapped, marked when it is called or, ``after``, when it
    returns. Names are numbered in the order a request meets them."""
    from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

    from tokenwire.gateway.http import app, dispatch, streaming
    from tokenwire.gateway.http import requests as http_requests
    from tokenwire.gateway.http.admission import AdmissionMiddleware
    from tokenwire.gateway.http.limits import KeyLimitsMiddleware
    from tokenwire.gateway.http.security import SecurityMiddleware
    from tokenwire.gateway.http.state import GatewayState
    from tokenwire.gateway.supervision.supervisor import SupervisedStream
    from tokenwire.gateway.upstreams import http_transport, openai_compat, sse_http

    def wrap(owner: Any, name: str, mark: str, *, after: bool = False) -> None:
        inner = getattr(owner, name, None)
        if inner is None:  # a tree without this layer (``--tree-b``): no mark for it
            return

        def returned(out: Any) -> Any:
            if after:
                marks.mark(mark)
            return out

        if asyncio.iscoroutinefunction(inner):
            async def wrapped(*a: Any, **kw: Any) -> Any:
                if not after:
                    marks.mark(mark)
                return returned(await inner(*a, **kw))
        else:
            def wrapped(*a: Any, **kw: Any) -> Any:  # type: ignore[misc]
                if not after:
                    marks.mark(mark)
                return returned(inner(*a, **kw))
        setattr(owner, name, wrapped)

    # (Not the DrainGate: uvicorn reads the app's signature and a wrapped one reads as ASGI2.)
    for owner, name, mark, after in (
            (HttpToolsProtocol, "on_headers_complete", "00 head parsed", False),
            (RequestResponseCycle, "run_asgi", "01 app task runs", False),
            (ProxyHeadersMiddleware, "__call__", "02 proxy headers", False),
            (SecurityMiddleware, "__call__", "03 security", False),
            (KeyLimitsMiddleware, "__call__", "04 key limits", False),
            (AdmissionMiddleware, "__call__", "05 admission", False),
            (dispatch.GatewayApp, "_endpoint", "06 endpoint", False),
            (http_requests, "read_body", "07 body read starts", False),
            (app, "decode_json", "08 body read and decoded", True),
            (app, "parse_chat_request", "09 parsed", True),
            (GatewayState, "supervise", "10 supervised", True),
            (app, "start_generation", "11 response made", True),
            (streaming.EventResponse, "__call__", "12 response called", False),
            (SupervisedStream, "_run", "13 supervisor task runs", False),
            (SupervisedStream, "_attempt", "14 attempt", False),
            (sse_http.SSEUpstreamStream, "_open", "15 open task runs", False),
            (http_transport, "_read_head", "16 upstream head read", True),
            (sse_http.SSEUpstreamStream, "_feed", "17 first feed", False),
            (openai_compat.ChunkParser, "on_sse", "18 first chunk parsed", True),
            (SupervisedStream, "_push", "19 first event pushed", False),
            (streaming.EventResponse, "_next", "20 writer has it", True)):
        wrap(owner, name, f"gateway: {mark}", after=after)


def _serve_upstream(out: str, port: int, tokens: int, pace: float) -> None:
    import uvicorn

    marks = _Marks(out, "upstream")
    inner = bu.upstream_app(tokens, pace)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await inner(scope, receive, send)
            return
        marks.begin("upstream: app called")

        async def timed_send(message: Any) -> None:
            kind = "head" if message["type"] == "http.response.start" else "first body"
            marks.mark(f"upstream: {kind} send")
            await send(message)

        await inner(scope, receive, timed_send)

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
                access_log=False, loop="asyncio", http="h11")


def _relay(up_port: int, port: int) -> None:
    """Bytes both ways, nothing parsed (uvloop): the floor of one more process in the way."""
    import uvloop

    class Upstream(asyncio.Protocol):
        def __init__(self, client: Client) -> None:
            self.client = client

        def connection_made(self, transport: Any) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.client.transport.write(data)

        def connection_lost(self, exc: Exception | None) -> None:
            self.client.transport.close()

    class Client(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport, self.upstream = transport, None
            self.early: list[bytes] = []  # what came before the upstream connection
            asyncio.get_running_loop().create_task(self.connect())

        async def connect(self) -> None:
            _, self.upstream = await asyncio.get_running_loop().create_connection(
                lambda: Upstream(self), "127.0.0.1", up_port)
            for data in self.early:
                self.upstream.transport.write(data)

        def data_received(self, data: bytes) -> None:
            if self.upstream is None:
                self.early.append(data)
            else:
                self.upstream.transport.write(data)

        def connection_lost(self, exc: Exception | None) -> None:
            if self.upstream is not None:
                self.upstream.transport.close()

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(Client, "127.0.0.1", port)
        await server.serve_forever()

    uvloop.run(serve())


def _floor(up_port: int, port: int) -> None:
    """The least a Python gateway does for a streamed chat (uvloop, callbacks only, not one
    task): parse the request (httptools, msgspec), write a request of its own on a pooled
    upstream connection, parse the SSE answer and render every chunk again. What it leaves
    out (checks, limits, supervision, records, compression...) is what tokenwire's extra
    time over it buys."""
    import httptools
    import msgspec
    import uvloop

    decode, encode = msgspec.json.decode, msgspec.json.encode
    idle: list[Upstream] = []

    class Upstream(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            self.client: Client | None = None
            self.parser: Any = None
            self.pending = b""

        def send(self, client: Client, data: bytes) -> None:
            self.client, self.pending = client, b""
            self.parser = httptools.HttpResponseParser(self)
            self.transport.write(data)

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_body(self, body: bytes) -> None:  # llhttp took the chunked framing off
            assert self.client is not None
            events = (self.pending + body).split(b"\n\n")
            self.pending = events.pop()
            for event in events:
                for line in event.split(b"\n"):
                    if not line.startswith(b"data: "):
                        continue
                    if line == b"data: [DONE]":
                        self.client.send(line + b"\n\n")
                        continue
                    chunk = decode(line[6:])
                    self.client.send(b"data: " + encode({
                        "id": chunk.get("id"), "object": "chat.completion.chunk",
                        "created": chunk.get("created"), "model": chunk.get("model"),
                        "choices": chunk.get("choices"), "usage": chunk.get("usage")}) +
                        b"\n\n")

        def on_message_complete(self) -> None:
            assert self.client is not None
            self.client.transport.write(b"0\r\n\r\n")
            self.client = None
            idle.append(self)

        def connection_lost(self, exc: Exception | None) -> None:  # its keep-alive ran out
            if self in idle:
                idle.remove(self)

    class Client(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            self.parser = httptools.HttpRequestParser(self)
            self.body: list[bytes] = []
            self.headed = False

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_message_begin(self) -> None:
            self.body, self.headed = [], False

        def on_body(self, body: bytes) -> None:
            self.body.append(body)

        def on_message_complete(self) -> None:
            request = decode(b"".join(self.body))
            body = encode({"model": request["model"], "messages": request["messages"],
                           "stream": True, "max_tokens": request.get("max_tokens"),
                           "stream_options": {"include_usage": True}})
            data = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(body), body))
            if idle:
                idle.pop().send(self, data)
            else:  # none pooled (never on the way of a measured stream after the warm-up)
                asyncio.get_running_loop().create_task(self._send_fresh(data))

        async def _send_fresh(self, data: bytes) -> None:
            loop = asyncio.get_running_loop()
            (await loop.create_connection(Upstream, "127.0.0.1", up_port))[1].send(self, data)

        def send(self, data: bytes) -> None:
            frame = b"%x\r\n%s\r\n" % (len(data), data)
            if not self.headed:
                self.headed = True
                frame = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n" + frame)
            self.transport.write(frame)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Client, "127.0.0.1", port)
        await server.serve_forever()

    uvloop.run(serve())


# -- the client ------------------------------------------------------------------------------


#: The marks of the request the client is sending (its task's context).
_client_marks: contextvars.ContextVar[dict[str, float]] = contextvars.ContextVar("marks")


def _mark_client_writes() -> None:
    """httpcore writes a request's head and its body apart (one ``_send_event`` each, and an
    empty one for its end): each write's start and return are marked, with the CPU the
    head was written on."""
    from httpcore._async.http11 import AsyncHTTP11Connection

    inner = AsyncHTTP11Connection._send_event
    names = {"Request": "head", "Data": "body"}

    async def send_event(self: Any, event: Any, timeout: float | None = None) -> None:
        name, marks = names.get(type(event).__name__), _client_marks.get(None)
        if name is None or marks is None:
            await inner(self, event, timeout)
            return
        marks[f"client: {name} write"] = _pc()
        if name == "head":
            marks[f"{CPU_MARK}client"] = float(_cpu())
        await inner(self, event, timeout)
        marks[f"client: {name} written"] = _pc()

    AsyncHTTP11Connection._send_event = send_event  # type: ignore[method-assign]


async def _one(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    body = {"model": bu.MODEL, "stream": True, "max_tokens": bu.TOKENS,
            "messages": [{"role": "user", "content": "Say words."}]}
    marks = {"client: request sent": _pc()}
    _client_marks.set(marks)
    async with client.stream("POST", url, json=body) as r:
        marks["client: head returned"] = _pc()
        async for line in r.aiter_lines():  # the whole stream, as bench_upstreams reads it
            if "client: first content" in marks or not line.startswith("data: {"):
                continue
            if ((json.loads(line[6:]).get("choices") or [{}])[0].get("delta") or {}).get(
                    "content"):
                marks["client: first content"] = _pc()
    return marks


def _child(args: list[str], python: str = sys.executable, **kw: Any) -> subprocess.Popen:
    return subprocess.Popen([python, "-m", "bench.ttft_timeline", *args], **kw)


def run(rounds: int, tokens: int, pace: float, cpus: tuple[int, int] | None = None,
        calls: dict[str, Any] | None = None, layers: bool = False,
        serve_args: tuple[str, ...] = (), policy: str | None = None,
        tree_b: str | None = None, python_b: str | None = None
        ) -> list[tuple[str, dict[str, float]]]:
    """Every request's marks in ms after the client's t0 (``_merged``), with its target;
    ``cpus`` (others, gateway): the client, upstream and relay pinned to one CPU, the
    gateway to another (or the same one); ``calls``, when given, is filled with the
    gateway's call counts (its marks are then not worth reading: the profiler slows every
    call); ``layers``: a mark at each layer of the gateway too (each costs ~1 µs);
    ``serve_args``: more arguments for ``tokenwire serve``; ``policy`` ``"batch"``: the
    gateway runs under ``SCHED_BATCH``; ``tree_b``: another tree's ``src``, served by a
    second gateway (:data:`TARGET_B`, marked alike) in the same rounds, the two gateways'
    turns swapped every other round (``_drive``); ``python_b``: that second gateway's
    interpreter (with this tree unless ``tree_b`` is given too)."""
    procs: list[subprocess.Popen] = []
    pin_gateway = None
    if cpus is not None:
        os.sched_setaffinity(0, {cpus[0]})  # this process (the client), inherited by the rest

        def pin_gateway() -> None:
            os.sched_setaffinity(0, {cpus[1]})
    with tempfile.TemporaryDirectory() as tmp:
        up_out, gw_out = f"{tmp}/upstream.json", f"{tmp}/gateway.json"
        try:
            up_port, relay_port, gw_port = bu._free_port(), bu._free_port(), bu._free_port()
            up = _child(["--serve-upstream", up_out, str(up_port), str(tokens), str(pace)])
            procs.append(up)
            bu._wait_http(f"http://127.0.0.1:{up_port}/v1/models", up, 60)
            procs.append(_child(["--relay", str(up_port), str(relay_port)]))
            floor_port = bu._free_port()
            procs.append(_child(["--floor", str(up_port), str(floor_port)]))
            marked = {**({"TTFT_LAYERS": "1"} if layers else {}),
                      **({"TTFT_POLICY": policy} if policy else {})}

            def gateway(out: str, port: int, env: dict[str, str],
                        python: str = sys.executable) -> subprocess.Popen:
                proc = _child(["--serve-gateway", out, "serve", "--upstream",
                               f"http://127.0.0.1:{up_port}/v1", "--port", str(port),
                               "--log-level", "warning", *serve_args],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              python=python, preexec_fn=pin_gateway,
                              env={**os.environ, **marked, **env})
                procs.append(proc)
                return proc

            gw = gateway(gw_out, gw_port, {"TTFT_CALLS": "1"} if calls is not None else {})
            gateways = [(gw, gw_out)]
            with_b = tree_b is not None or python_b is not None
            if with_b:  # (the calls are counted in tokenwire's gateway only)
                gwb_port, gwb_out = bu._free_port(), f"{tmp}/gateway_b.json"
                path = os.pathsep.join(p for p in (tree_b, os.environ.get("PYTHONPATH")) if p)
                gwb = gateway(gwb_out, gwb_port, {"PYTHONPATH": path},
                              python_b or sys.executable)
                gateways.append((gwb, gwb_out))
                bu._wait_http(f"http://127.0.0.1:{gwb_port}/health", gwb, 60)
            bu._wait_http(f"http://127.0.0.1:{gw_port}/health", gw, 60)
            bu._wait_http(f"http://127.0.0.1:{relay_port}/v1/models", up, 60)
            _wait_port(floor_port)
            targets = {name: f"http://127.0.0.1:{port}/v1/chat/completions" for name, port in
                       (("direct", up_port), ("relay", relay_port), ("python floor", floor_port),
                        ("tokenwire", gw_port))}
            if with_b:
                targets[TARGET_B] = f"http://127.0.0.1:{gwb_port}/v1/chat/completions"
            seen = asyncio.run(_drive(targets, rounds, alternate=with_b))
            for proc in (up, *(g for g, _ in gateways)):
                proc.send_signal(signal.SIGUSR2)
            outs = [up_out, *(o for _, o in gateways)]
            deadline = time.monotonic() + 30
            while not all(Path(o).exists() for o in outs):
                assert time.monotonic() < deadline, "the marks were never written"
                time.sleep(0.1)
            server_rows = [row for o in outs for row in json.loads(Path(o).read_text())]
            if calls is not None:
                calls.update(json.loads(Path(gw_out + ".calls").read_text()))
        finally:
            bu.stop_all(procs)
    return _merged(seen, server_rows)


def _wait_port(port: int, timeout: float = 30.0) -> None:
    """Until something listens on ``port`` (the floor serves no GET to poll)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on {port}"
            time.sleep(0.1)


async def _drive(targets: dict[str, str], rounds: int, alternate: bool = False,
                 ) -> list[tuple[str, dict[str, float]]]:
    """Each target once per round, in turn; ``alternate``: the last two (two gateways) swap
    places every other round, so each follows the other as often as it follows the target
    before them, and neither ever follows itself (a gateway's stream right after one of its
    own starts ~0.25 ms sooner: a reversed order every other round gave the gateway last in
    line that, and the same tree 0.24 ms "faster" than itself)."""
    seen = []
    _mark_client_writes()
    async with httpx.AsyncClient(timeout=60) as client:
        for i in range(rounds + 5):  # the first 5 rounds warm every target up
            order = list(targets.items())
            if alternate and i % 2:
                order[-2:] = order[:-3:-1]
            for name, url in order:
                marks = await _one(client, url)
                if i >= 5:
                    seen.append((name, marks))
    return seen


def _merged(seen: list[tuple[str, dict[str, float]]], server_rows: list[dict[str, float]],
            ) -> list[tuple[str, dict[str, float]]]:
    """Each request's marks with the server rows whose first mark falls in its client
    window, as ms after the client's t0 (``INFO`` marks kept as they are, t0 among them in
    seconds of ``time.perf_counter``, the system's monotonic clock)."""
    out = []
    for name, marks in seen:
        t0, end = marks["client: request sent"], marks["client: first content"]
        merged = dict(marks)
        for row in server_rows:
            if t0 <= min(v for k, v in row.items() if not k.startswith(INFO)) <= end:
                merged.update(row)
        out.append((name, {f"{INFO}t0": t0, **{k: v if k.startswith(INFO) else (v - t0) * 1e3
                                                for k, v in merged.items()}}))
    return out


def _medians(rows: list[tuple[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Each mark's median per target, in the order they come."""
    found: dict[str, dict[str, list[float]]] = {}
    for name, marks in rows:
        for mark, ms in marks.items():
            if not mark.startswith(INFO):
                found.setdefault(name, {}).setdefault(mark, []).append(ms)
    return {name: {mark: round(statistics.median(v), 3) for mark, v in sorted(
        marks.items(), key=lambda kv: statistics.median(kv[1]))}
        for name, marks in found.items()}


def _split(rows: list[tuple[str, dict[str, float]]], target: str = "tokenwire") -> list[str]:
    """The gateway's requests whose body came in the head's read against those whose body
    came apart: how many, the first content's median added to direct's, the client's head
    write (it returns late when the woken gateway took the client's CPU), and how many of
    them the gateway read on the CPU the client wrote on."""
    direct = statistics.median(m["client: first content"] for n, m in rows if n == "direct")
    lines = []
    ours = [m for n, m in rows if n == target]
    for label, group in (("body with its head", [m for m in ours if BODY_APART not in m]),
                         ("body apart", [m for m in ours if BODY_APART in m])):
        if not group:
            lines.append(f"{label}: none")
            continue
        first = statistics.median(m["client: first content"] for m in group) - direct
        head = statistics.median(m["client: head written"] - m["client: head write"]
                                 for m in group)
        same = sum(m.get(f"{CPU_MARK}client", -1.0) == m.get(f"{CPU_MARK}gateway", -2.0)
                   for m in group)
        lines.append(f"{label}: {len(group)} of {len(ours)}, added {first:+.3f} ms, the "
                     f"client's head write {head:.3f} ms, read on the client's CPU {same}")
    return lines


def main() -> None:
    if sys.argv[1:2] in (["--serve-gateway"], ["--serve-upstream"], ["--relay"], ["--floor"]):
        mode, rest = sys.argv[1], sys.argv[2:]
        if mode == "--serve-gateway":
            _serve_gateway(rest[0], rest[1:])
        elif mode == "--serve-upstream":
            _serve_upstream(rest[0], int(rest[1]), int(rest[2]), float(rest[3]))
        elif mode == "--relay":
            _relay(int(rest[0]), int(rest[1]))
        else:
            _floor(int(rest[0]), int(rest[1]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=80)
    parser.add_argument("--tokens", type=int, default=bu.TOKENS)
    parser.add_argument("--pace", type=float, default=bu.PACE_S)
    parser.add_argument("--cpus", metavar="OTHERS,GATEWAY",
                        help="pin the client, upstream and relay to CPU OTHERS and the gateway "
                             "to CPU GATEWAY (0,1: apart; 0,0: all on one core)")
    parser.add_argument("--calls", type=int, metavar="N", default=0,
                        help="count the gateway's calls instead (sys.setprofile) and print "
                             "the N most called functions of each span")
    parser.add_argument("--serve-args", default="", metavar="ARGS",
                        help="more arguments for tokenwire serve, e.g. '--coalesce-ms 0'")
    parser.add_argument("--layers", action="store_true",
                        help="mark the gateway's layers too (_mark_layers)")
    parser.add_argument("--raw", metavar="FILE",
                        help="write every request's marks there, one JSON object a line")
    parser.add_argument("--tree-b", metavar="SRC",
                        help="another tree's src (a git worktree's), served by a second "
                             "gateway in the same rounds: an A/B of a change")
    parser.add_argument("--python-b", metavar="PYTHON",
                        help="the second gateway's interpreter (a venv's python with the "
                             "same packages): an A/B of the interpreter's build")
    parser.add_argument("--gateway-policy", choices=("batch",),
                        help="run the gateway under SCHED_BATCH (a diagnosis: its wake-ups "
                             "then never preempt the process running)")
    args = parser.parse_args()
    cpus = None
    if args.cpus:
        others, _, gateway = args.cpus.partition(",")
        cpus = (int(others), int(gateway))
    calls: dict[str, Any] | None = {} if args.calls else None
    rows = run(args.rounds, args.tokens, args.pace, cpus, calls, args.layers,
               tuple(args.serve_args.split()), args.gateway_policy, args.tree_b,
               args.python_b)
    if args.raw:
        Path(args.raw).write_text("".join(json.dumps({"target": name, **marks}) + "\n"
                                          for name, marks in rows))
    if calls is not None:
        _print_calls(calls, args.calls)
        return
    for name, marks in _medians(rows).items():
        print(f"{name} (ms after the request was sent, medians of {args.rounds})")
        for mark, ms in marks.items():
            print(f"  {ms:8.3f}  {mark}")
    with_b = bool(args.tree_b or args.python_b)
    for target in ("tokenwire", *((TARGET_B,) if with_b else ())):
        print(f"{target}'s requests by how their body arrived:")
        for line in _split(rows, target):
            print(f"  {line}")
    if with_b:
        print(_compared(rows))


#: The gateway's own time on the way in, for a request whose body came with its head: from
#: its bytes to the upstream request's write, in one turn on the CPU.
_WAY_IN = ("gateway: request bytes arrived", "gateway: upstream request write")


def _compared(rows: list[tuple[str, dict[str, float]]]) -> str:
    """``--tree-b``'s answer: B's medians minus tokenwire's, for the first content (all
    requests) and the way in (bodies read with their head)."""
    def median(target: str, value: Any) -> float:
        found = [value(m) for n, m in rows if n == target]
        found = [v for v in found if v is not None]
        return statistics.median(found) if found else math.nan

    def way_in(m: dict[str, float]) -> float | None:
        return None if BODY_APART in m or not all(k in m for k in _WAY_IN) \
            else m[_WAY_IN[1]] - m[_WAY_IN[0]]

    first = median(TARGET_B, lambda m: m["client: first content"]) - \
        median("tokenwire", lambda m: m["client: first content"])
    inner = median(TARGET_B, way_in) - median("tokenwire", way_in)
    return (f"B - tokenwire: first content {first:+.3f} ms, the way in with the body in the "
            f"head's read {inner * 1e3:+.0f} µs")


def _print_calls(calls: dict[str, Any], top: int) -> None:
    for span, label in (("request", "request bytes -> upstream write"),
                        ("response", "upstream head -> client first body")):
        n = calls["spans"].get(span, 0) or 1
        counts = calls[span]
        python = sum(v for k, v in counts.items() if not k.startswith("C "))
        print(f"{label}: {sum(counts.values()) / n:.0f} calls per request, "
              f"{python / n:.0f} of them Python ({n} requests)")
        for key, v in sorted(counts.items(), key=lambda kv: -kv[1])[:top]:
            print(f"  {v / n:6.1f}  {key}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
