"""The Responses API over one WebSocket against HTTP, for the same Codex-shaped conversation.

    PYTHONPATH=src .venv/bin/python -m bench.bench_responses_ws

tokenwire is served as ``tokenwire serve`` serves it (``serve_gateway``: hardening, uvicorn,
wsproto with permessage-deflate) over an in-process upstream that answers every turn at once
with the same short text, so what differs is the transport. A conversation of
:data:`TURNS` turns is played the way Codex plays it:

* **HTTP**: one keep-alive connection (httpx, as Codex's reqwest pool), ``POST
  /v1/responses`` with ``stream: true``, ``store: false`` and the *whole* input each turn
  (a ~20 kB developer message, as Codex's base instructions, then every earlier turn).
* **WebSocket**: one socket (the ``websockets`` client with permessage-deflate, as Codex's
  tungstenite), one ``response.create`` per turn with ``previous_response_id`` and only the
  new items, ``store: false`` (the socket remembers).

Time to first token is from the turn's request leaving the client to its first
``response.output_text.delta``; bytes on the wire are counted by a TCP relay between client
and server (everything: request heads, frames, compression), both directions, per turn.
Turn 1 includes the connection set-up; turns 2..N are what the socket is for. Figures, not
pass/fail: read them side by side (the machine is shared).

    PYTHONPATH=src .venv/bin/python -m bench.bench_responses_ws --hop

The hop to a Responses upstream (``upstreams/responses_socket.py``): the same conversation,
always on the client's WebSocket, through a gateway whose ``responses`` upstream is another
``tokenwire serve`` (over the same instant model), once with ``websocket = true`` (one upstream
socket for the client socket, continued by id) and once without (each turn translated to the
upstream's HTTP API, the whole input every turn), alternating. TTFT is at the client; bytes
are counted by a relay on the hop between the two gateways.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from websockets.asyncio.client import connect

from tokenwire.gateway import server as server_mod
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.ir import Event, Finish, FinishKind, IdsSource, TokenDelta, Usage
from tokenwire.gateway.routing.router import Router, ServedModel
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.upstreams.base import ModelRoute, UpstreamConfig
from tokenwire.gateway.upstreams.responses_upstream import ResponsesUpstream

TURNS = 10
REPEATS = 5
#: The hop's TTFT difference is a few ms on loopback, inside a loaded machine's noise: more
#: alternating repeats for its medians.
HOP_REPEATS = 15
KEY = "tw-bench-ws-key-0123456789"
_WORDS = ("the file command output test build error line function return value path run "
          "agent tool patch diff check module import class config shell exit code user "
          "request answer change read write step plan result commit branch review").split()


def _text(n: int, seed: int) -> str:
    """``n`` characters of seeded word salad: compresses like prose (~3x with deflate), not
    like a repeated phrase (which would flatter permessage-deflate)."""
    rng = random.Random(seed)
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < n:
        word = rng.choice(_WORDS)
        words.append(word + (f"_{rng.randrange(1000)}" if rng.random() < 0.3 else ""))
    return " ".join(words)[:n]


#: Codex's base instructions are ~20 kB; each later turn adds a user message (~1 kB, like an
#: environment context or a tool output) and the assistant's answer.
INSTRUCTIONS = _text(20_000, 0)
ANSWER = ["I ", "will ", "look ", "at ", "that ", "now."]


class _Instant:
    """An upstream that answers every request at once with :data:`ANSWER`."""

    model_id = "bench"

    def submit(self, request: Any) -> _Play:
        return _Play()


class _Play:
    def __init__(self) -> None:
        self._events: list[Event] = [*(TokenDelta(text=p) for p in ANSWER),
                                     Usage(prompt_tokens=100, completion_tokens=len(ANSWER)),
                                     Finish(reason=FinishKind.EOS)]

    async def next_event(self) -> Event:
        await asyncio.sleep(0)
        return self._events.pop(0)

    def cancel(self) -> None:
        pass


@dataclass
class Relay:
    """A TCP relay that counts the bytes each way (reset per turn by the driver)."""

    target: int
    up: int = 0
    down: int = 0
    port: int = 0
    _server: Any = field(default=None)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        r2, w2 = await asyncio.open_connection("127.0.0.1", self.target)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, up: bool) -> None:
            try:
                while data := await src.read(65536):
                    if up:
                        self.up += len(data)
                    else:
                        self.down += len(data)
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, w2, True), pipe(r2, writer, False))

    def reset(self) -> tuple[int, int]:
        out = (self.up, self.down)
        self.up = self.down = 0
        return out


def _serve(router: Router | None = None) -> tuple[int, Any]:
    settings = ServerSettings(api_keys=(KEY,), auth="keys")
    router = router or Router([ServedModel(name="bench", upstream=_Instant(),  # type: ignore[arg-type]
                                           ids_source=IdsSource.NONE, upstream_name="bench")])
    state = GatewayState(settings=settings, router=router)

    async def fake_build(cfg: Any, settings: ServerSettings) -> server_mod.Gateway:
        return server_mod.Gateway(state=state, adapters=(), probes=())

    server_mod.build_gateway = fake_build  # type: ignore[assignment]
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    ready: dict[str, Any] = {}
    threading.Thread(target=lambda: asyncio.run(server_mod.serve_gateway(
        None, settings, log_level="error", sockets=[sock],  # type: ignore[arg-type]
        on_ready=lambda gw, srv: ready.update(server=srv))), daemon=True).start()
    while not (ready.get("server") and ready["server"].started):
        time.sleep(0.02)
    return sock.getsockname()[1], ready["server"]


def _message(role: str, text: str) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def _body(items: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "bench", "stream": True, "store": False, "input": items, **extra}


async def _http_turns(relay: Relay) -> list[tuple[float, int, int]]:
    history = [_message("developer", INSTRUCTIONS)]
    out = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{relay.port}", timeout=60,
                                 headers={"authorization": f"Bearer {KEY}"}) as client:
        for turn in range(TURNS):
            history.append(_message("user", _text(1_000, turn + 1)))
            relay.reset()
            start, ttft = time.perf_counter(), None
            async with client.stream("POST", "/v1/responses", json=_body(history)) as resp:
                async for line in resp.aiter_lines():
                    if ttft is None and line.startswith("data:") and \
                            '"response.output_text.delta"' in line:
                        ttft = time.perf_counter() - start
            history.append(_message("assistant", "".join(ANSWER)))
            out.append((ttft or 0.0, *relay.reset()))
    return out


async def _ws_turns(relay: Relay, port: int | None = None) -> list[tuple[float, int, int]]:
    """The conversation on one client socket to ``port`` (default: through ``relay``);
    ``relay`` counts each turn's bytes wherever it sits."""
    out = []
    previous: str | None = None
    first = True
    relay.reset()
    start = time.perf_counter()
    async with connect(f"ws://127.0.0.1:{port or relay.port}/v1/responses", proxy=None,
                       additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        for turn in range(TURNS):
            new = [_message("user", _text(1_000, turn + 1))]
            if first:
                new.insert(0, _message("developer", INSTRUCTIONS))
            extra = {"previous_response_id": previous} if previous else {}
            if not first:
                relay.reset()
                start = time.perf_counter()
            await ws.send(json.dumps({"type": "response.create", **_body(new, **extra)}))
            ttft = None
            while True:
                msg = json.loads(await ws.recv())
                if ttft is None and msg["type"] == "response.output_text.delta":
                    ttft = time.perf_counter() - start
                if msg["type"] in ("response.completed", "response.failed", "error"):
                    break
            assert msg["type"] == "response.completed", msg
            previous, first = msg["response"]["id"], False
            await asyncio.sleep(0.01)  # the relay forwards the last frame before the count
            out.append((ttft or 0.0, *relay.reset()))
    return out


async def _measure(port: int) -> dict[str, list[list[tuple[float, int, int]]]]:
    relay = Relay(target=port)
    await relay.start()
    runs: dict[str, list[list[tuple[float, int, int]]]] = {"http": [], "ws": []}
    for _ in range(REPEATS):  # alternate, so load changes hit both alike
        runs["http"].append(await _http_turns(relay))
        runs["ws"].append(await _ws_turns(relay))
    return runs


def run() -> list[dict]:
    port, server = _serve()
    try:
        runs = asyncio.run(_measure(port))
    finally:
        server.should_exit = True
    rows = []
    for turn in range(TURNS):
        row: dict[str, Any] = {"turn": turn + 1}
        for name in ("http", "ws"):
            ttfts = [r[turn][0] * 1000 for r in runs[name]]
            row[f"{name} TTFT ms (median)"] = statistics.median(ttfts)
            row[f"{name} bytes up"] = runs[name][0][turn][1]
            row[f"{name} bytes down"] = runs[name][0][turn][2]
        rows.append(row)
    later = rows[1:]
    rows.append({"turn": "2..N median", **{
        k: statistics.median(r[k] for r in later) for k in later[0] if k != "turn"}})
    return rows


def _hop_gateway(relay_port: int, *, websocket: bool) -> tuple[int, Any]:
    """A gateway whose one model is a ``responses`` upstream behind ``relay_port``."""
    os.environ[_HOP_KEY_ENV] = KEY
    cfg = UpstreamConfig(name="hop", kind="responses", base_url=f"http://127.0.0.1:"
                         f"{relay_port}/v1", api_key_env=_HOP_KEY_ENV,
                         options={"websocket": websocket}, models=(ModelRoute(name="bench"),))
    up = ResponsesUpstream.from_config(cfg)
    return _serve(Router([ServedModel(name="bench", upstream=up, ids_source=IdsSource.NONE,
                                      upstream_name="hop")]))


_HOP_KEY_ENV = "TW_BENCH_HOP_KEY"


def run_hop() -> list[dict]:
    upstream_port, upstream = _serve()
    servers = [upstream]

    async def measure() -> dict[str, list[list[tuple[float, int, int]]]]:
        relay = Relay(target=upstream_port)
        await relay.start()
        ports = {}
        for name, on in (("socket", True), ("http", False)):
            port, server = await asyncio.to_thread(_hop_gateway, relay.port, websocket=on)
            ports[name] = port
            servers.append(server)
        runs: dict[str, list[list[tuple[float, int, int]]]] = {"socket": [], "http": []}
        for _ in range(HOP_REPEATS):  # alternate, so load changes hit both alike
            for name in ("socket", "http"):
                runs[name].append(await _ws_turns(relay, ports[name]))
        return runs

    try:
        runs = asyncio.run(measure())
    finally:
        for server in servers:
            server.should_exit = True
    rows = []
    for turn in range(TURNS):
        row: dict[str, Any] = {"turn": turn + 1}
        for name in ("socket", "http"):
            row[f"hop {name}: TTFT ms (median)"] = statistics.median(
                r[turn][0] * 1000 for r in runs[name])
            row[f"hop {name}: bytes up"] = runs[name][0][turn][1]
            row[f"hop {name}: bytes down"] = runs[name][0][turn][2]
        rows.append(row)
    later = rows[1:]
    summary = {k: statistics.median(r[k] for r in later) for k in later[0] if k != "turn"}
    rows.append({"turn": "2..N median", **summary})
    rows.append({"turn": "2..N http / socket", **{
        k.replace("socket", "ratio"): summary[k.replace("socket", "http")] / summary[k]
        for k in summary if "socket" in k}})
    return rows


def main() -> None:
    from bench.run import table

    print(table(run_hop() if "--hop" in sys.argv[1:] else run()))


if __name__ == "__main__":
    main()
