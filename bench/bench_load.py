"""Load: 500 concurrent streaming clients through the capacity queue, and a graceful shutdown.

What is shown (issue 6, "How it must be shown", last bullet), on loopback, in one run:

* Upstream: a scripted OpenAI-compatible Chat server (pure ASGI on uvicorn, own process)
  that streams ``TOKENS`` chunks ``PACE_S`` apart, each chunk naming the request's marker
  (read from the prompt), and counts the requests it served per marker (``GET /stats``):
  a slow model, so the gateway's queue, not the model, is what is exercised.
* Gateway: the real ``tokenwire serve`` stack (``build_gateway`` over ``--upstream``,
  ``harden(create_app())``, uvicorn with ``uvicorn_limits(state)``) in its own process, served by
  :mod:`tokenwire.gateway.http.shutdown` (graceful shutdown). Capacity ``MAX_CONCURRENT``
  upstream requests and a queue of ``QUEUE_SIZE``; ``heartbeat_s`` shortened from 15 s to
  ``HEARTBEAT_S`` so queued clients see many heartbeats in a bounded run; the connection
  limits are the product's (``gateway/http/connections.py``) except the per-client cap,
  raised to ``PER_CLIENT`` because every client of this bench is one loopback address, so
  the 800-client phase meets the gateway's own 429.
* Clients: one process, httpx in pools of 16 connections (one pool for 500 streams stalls
  its own loop in httpcore's connection scan); a third each of Chat Completions SSE,
  Responses SSE and Codec msgpack frames (Chat with ``stream_format: msgpack``, ids
  retokenized by the gateway, decoded here with the SmolLM2 map). Every client has a unique
  marker; it must get exactly one terminal and, for a complete answer, exactly the text the
  upstream sent for *its* marker (so a lost, duplicated or crossed event fails it).
* Phases: ``WAVES`` waves of ``CLIENTS``; one wave of ``OVER_CLIENTS`` (over capacity: 429 +
  ``Retry-After`` honoured, every client completes); one wave during which the gateway gets
  SIGTERM ``SIGTERM_AFTER_S`` in, with a ``DRAIN_GRACE_S`` drain: every client must end
  complete or with a clean terminal failure, none cut.
* Heartbeats: per client, the time to the response head and the longest silence after it
  before the first output (queued clients live on heartbeats), against ``HEARTBEAT_S``.
* Memory: after each wave, the gateway's RSS (``/proc/<pid>/status``), its live Python
  objects after a full collection, and its RSS once freed memory is returned (see NOTES).

Run: ``.venv/bin/python -m bench.run --only bench_load`` (about 2 minutes on 2 cores); or
``.venv/bin/python -m bench.bench_load [--clients N] [--waves N] [--over N]`` to print rows
without writing BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import itertools
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.bench_upstreams import _free_port, _wait_http, stop_all

#: How to read the tables (printed under them in BENCHMARKS.md by ``bench/run.py``).
NOTES = """
How to read it. **Correctness**: every client has its own marker. *complete* = exactly one
successful terminal and exactly the text the upstream streamed for that marker (Codec ids decoded
with the SmolLM2 map); *clean failure* = exactly one terminal failure after a prefix of its own
text (`response.failed`, an SSE `error` event then `[DONE]`, a Codec frame with `finish_reason:
"error"`), or a 503 body before any byte; *cut* = a stream that ended without its terminal; *not
served* = refused or closed before any response. The 30 clients started 50 ms after the SIGTERM
get the drain's 503 with `Retry-After` on a connection that was still open, or a refused
connection once the listener has closed (which of the two varies from run to run). *upstream
requests != 1* compares with the upstream's own count per marker: 0 means nothing was lost or
replayed. Clients honour 429 + `Retry-After` and retry; the shutdown wave does not retry.
**Time**: *first byte* = request sent to response head with its first event; a queued Chat or
Codec request's head goes out with its first heartbeat, `heartbeat_s` after the gateway has parsed
it, and a burst of 500 requests takes the gateway 1-2 s to parse here. *keep-alive gap* = the
longest silence a client saw after the head and before its first output: `heartbeat_s` + the 150
ms coalescing window + how late the event loops ran (*loop stall* = how late a 50 ms timer fired,
in the gateway and in the client process: the three processes share 2 cores). **Memory**: RSS as
each wave left it, the live Python objects after a full collection, and RSS once glibc has been
asked to hand freed memory back (`malloc_trim`; the gateway does both on SIGUSR2 in this bench).
Per-stream compressor state (gzip ~0.1 MB from the moment a request is accepted, queued ones
included; brotli ~0.4 MB once it has compressed), outside the Python heap, is freed at the end of
each stream but stays in the process until trimmed, so untrimmed RSS creeps toward the peak; with
`Accept-Encoding: identity` untrimmed RSS stayed within 0.3 MiB over five waves (measured
separately). Exit code -15: uvicorn re-raises the SIGTERM once the graceful shutdown is done.
"""

MODEL = "HuggingFaceTB/SmolLM2-135M"  # an HF alias, so the gateway finds the bundled map
TOKENS = 24
PACE_S = 0.06
MAX_CONCURRENT = 64
QUEUE_SIZE = 512
#: Connections the one loopback address of every bench client may hold (the product's cap,
#: 256, is per client address; this bench is 2,000 clients behind one).
PER_CLIENT = 4096
HEARTBEAT_S = 1.0
DRAIN_GRACE_S = 4.0
CLIENTS = 500
WAVES = 4
OVER_CLIENTS = 800
SIGTERM_AFTER_S = 3.0
APIS = ("chat", "responses", "codec")
_MARKER = re.compile(rb"marker (\w+)")


def chunk_text(marker: str, i: int) -> str:
    """What the upstream streams as chunk ``i`` for ``marker`` (and what a client expects)."""
    return f" {marker}x{i}"


def expected_text(marker: str, tokens: int = TOKENS) -> str:
    return "".join(chunk_text(marker, i) for i in range(tokens))


# -- the scripted upstream (``--serve-upstream PORT``) -----------------------------------------


def upstream_app(tokens: int = TOKENS, pace_s: float = PACE_S):
    """OpenAI Chat SSE echoing the prompt's ``marker X`` in every chunk; ``GET /stats``."""
    served: Counter[str] = Counter()
    models = json.dumps({"object": "list", "data": [
        {"id": MODEL, "object": "model", "owned_by": "scripted"}]}).encode()

    def chunk(delta: dict, finish: str | None) -> bytes:
        return b"data: " + json.dumps({
            "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0,
            "model": MODEL, "choices": [{"index": 0, "delta": delta,
                                         "finish_reason": finish}]}).encode() + b"\n\n"

    async def reply(send, body: bytes) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        if scope["method"] == "GET":
            stats = scope["path"].endswith("/stats")
            await reply(send, json.dumps(dict(served)).encode() if stats else models)
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        found = _MARKER.search(body)
        marker = found.group(1).decode() if found else "none"
        served[marker] += 1
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        head = chunk({"role": "assistant", "content": ""}, None)
        for i in range(tokens):
            await send({"type": "http.response.body", "more_body": True,
                        "body": head + chunk({"content": chunk_text(marker, i)}, None)})
            head = b""
            await asyncio.sleep(pace_s)
        await send({"type": "http.response.body", "more_body": False,
                    "body": chunk({}, "stop") + b"data: [DONE]\n\n"})

    return app


def _serve_upstream(port: int) -> None:
    import uvicorn

    uvicorn.run(upstream_app(), host="127.0.0.1", port=port, log_level="warning",
                lifespan="off", access_log=False, backlog=4096)


# -- the gateway (``--serve-gateway UPSTREAM_PORT PORT``) ---------------------------------------


async def _serve_gateway(up_port: int, port: int) -> None:
    """What ``tokenwire serve --upstream`` runs, with this bench's capacity and clocks, served
    with graceful shutdown."""
    import uvicorn

    from tokenwire.gateway.config import config_from_urls
    from tokenwire.gateway.http.app import create_app
    from tokenwire.gateway.http.security import harden
    from tokenwire.gateway.http.shutdown import serve_with_graceful_shutdown
    from tokenwire.gateway.server import build_gateway, uvicorn_limits
    from tokenwire.gateway.settings import ServerSettings

    cfg = config_from_urls([f"http://127.0.0.1:{up_port}/v1"], max_concurrent=MAX_CONCURRENT,
                           env=os.environ)
    settings = ServerSettings(port=port, max_concurrent=MAX_CONCURRENT, queue_size=QUEUE_SIZE,
                              heartbeat_s=HEARTBEAT_S, max_connections_per_client=PER_CLIENT)
    gw = await build_gateway(cfg, settings)
    loop = asyncio.get_running_loop()
    lag = loop.create_task(_report_loop_lag())
    loop.add_signal_handler(signal.SIGUSR2, _report_objects)
    try:
        limits = uvicorn_limits(gw.state)
        config = uvicorn.Config(harden(create_app(gw.state), settings), host="127.0.0.1",
                                port=port, log_level="warning", lifespan="off",
                                timeout_graceful_shutdown=5, backlog=4096,
                                **limits)
        await serve_with_graceful_shutdown(config, gw.state, drain_grace_s=DRAIN_GRACE_S)
    finally:
        lag.cancel()
        await gw.aclose()


def _report_objects() -> None:
    """Live objects after a full collection (a leak of Python objects shows here first), then
    glibc's ``malloc_trim``: freed C buffers (zlib and brotli state, ~0.1-0.4 MB a stream) stay
    in the process until trimmed, so RSS alone cannot tell retention from a leak."""
    gc.collect()
    objects = len(gc.get_objects())
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: report RSS as it is
        pass
    print(f"gc-objects {objects}", file=sys.stderr, flush=True)


async def _report_loop_lag(tick: float = 0.05) -> None:
    """Prints every stall of the gateway's event loop over 0.25 s: a stalled loop sends no
    heartbeat, so it explains a late one."""
    loop = asyncio.get_running_loop()
    while True:
        t = loop.time()
        await asyncio.sleep(tick)
        late = loop.time() - t - tick
        if late > 0.25:
            print(f"loop-lag {late:.2f} s at {time.time():.2f}", file=sys.stderr, flush=True)


# -- one client ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one client saw. ``terminals`` counts terminal events (must be exactly 1 unless
    the request was refused before its stream started)."""

    api: str
    marker: str
    status: int | None = None
    attempts: int = 0
    retry_after_ok: bool = True  # every 429 carried Retry-After, and we waited it
    http_429: int = 0
    http_503: int = 0
    unanswered: int = 0  # connections closed before any response, retried
    unanswered_why: str | None = None
    refused: bool = False  # connection refused (the gateway had stopped listening)
    cut: str | None = None  # the transport error that ended the stream without a terminal
    text: str = ""
    ids: list[int] = field(default_factory=list)
    terminals: list[str] = field(default_factory=list)  # "complete" / "failed"
    after_terminal: int = 0  # events after the terminal (must be 0)
    keepalives: int = 0
    arrivals: list[float] = field(default_factory=list)
    first_output_at: float | None = None
    sent_at: float = 0.0


class _Sse:
    """Incremental SSE: bytes in, ``(event_name, data)`` or ``(":", comment)`` out."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[tuple[str, str]]:
        self._buf += data
        out = []
        while b"\n\n" in self._buf:
            block, self._buf = self._buf.split(b"\n\n", 1)
            name, datas = "message", []
            for line in block.decode().split("\n"):
                if line.startswith(":"):
                    out.append((":", line))
                elif line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("data:"):
                    datas.append(line[5:].lstrip())
            if datas:
                out.append((name, "\n".join(datas)))
        return out


def _terminal(o: Outcome, kind: str) -> None:
    o.terminals.append(kind)


def _output(o: Outcome, now: float) -> None:
    if o.first_output_at is None:
        o.first_output_at = now


def _on_chat(o: Outcome, name: str, data: str, now: float) -> None:
    if name == ":":
        o.keepalives += o.first_output_at is None
        return
    if data == "[DONE]":
        return
    if o.terminals:
        o.after_terminal += 1
        return
    obj = json.loads(data)
    if "error" in obj:
        _terminal(o, "failed")
        return
    choice = (obj.get("choices") or [{}])[0]
    content = choice.get("delta", {}).get("content")
    if content:
        _output(o, now)
        o.text += content
    if choice.get("finish_reason"):
        _terminal(o, "complete" if choice["finish_reason"] == "stop" else "failed")


def _on_responses(o: Outcome, name: str, data: str, now: float) -> None:
    if name == ":":
        return
    if o.terminals:
        o.after_terminal += 1
        return
    if name in ("response.in_progress", "response.created"):
        o.keepalives += o.first_output_at is None
    elif name == "response.output_text.delta":
        _output(o, now)
        o.text += json.loads(data)["delta"]
    elif name == "response.completed":
        _terminal(o, "complete")
    elif name in ("response.failed", "response.incomplete", "error"):
        _terminal(o, "failed")


def _on_frame(o: Outcome, frame, now: float) -> None:
    if o.terminals:
        o.after_terminal += 1
        return
    if frame.ids:
        _output(o, now)
        o.ids.extend(frame.ids)
    elif not frame.done:
        o.keepalives += o.first_output_at is None
    if frame.done:
        _terminal(o, "failed" if frame.finish_reason == "error" else "complete")


def _request(api: str, marker: str, tokens: int) -> tuple[str, dict, dict[str, str]]:
    prompt = f"Please answer: marker {marker}"
    if api == "responses":
        return "/v1/responses", {"model": MODEL, "input": prompt, "stream": True,
                                 "store": False, "max_output_tokens": tokens + 8}, {}
    body: dict = {"model": MODEL, "stream": True, "max_tokens": tokens + 8,
                  "messages": [{"role": "user", "content": prompt}]}
    if api == "codec":
        body["stream_format"] = "msgpack"
        return "/v1/chat/completions", body, {"Codec-Client-Version": "0.5"}
    return "/v1/chat/completions", body, {}


async def run_client(client: httpx.AsyncClient, base: str, api: str, marker: str, *,
                     tokens: int = TOKENS, retry: bool = True, max_attempts: int = 200,
                     ) -> Outcome:
    """One streaming request; on 429 (and, when ``retry``, a 503) it waits ``Retry-After``
    and tries again. When ``retry``, a connection closed before any response (a pooled
    keep-alive connection the server timed out just as it was reused) is retried too, as
    the SDKs do. Never raises: transport errors are recorded in the outcome."""
    from tokenwire.codec.frames_msgpack import FrameDecoder

    o = Outcome(api=api, marker=marker)
    path, body, headers = _request(api, marker, tokens)
    loop = asyncio.get_running_loop()
    while o.attempts < max_attempts:
        o.attempts += 1
        o.sent_at = loop.time()
        o.arrivals = []
        o.status = None
        try:
            async with client.stream("POST", base + path, json=body, headers=headers) as r:
                o.status = r.status_code
                if r.status_code in (429, 503):
                    await r.aread()
                    retry_after = r.headers.get("retry-after")
                    if r.status_code == 429:
                        o.http_429 += 1
                        o.retry_after_ok &= retry_after is not None
                    else:
                        o.http_503 += 1
                        if not retry:
                            return o
                    await asyncio.sleep(float(retry_after or 1))
                    continue
                if r.status_code != 200:
                    await r.aread()
                    return o
                sse, dec = _Sse(), FrameDecoder()
                async for data in r.aiter_bytes():
                    now = loop.time()
                    o.arrivals.append(now)
                    if api == "codec":
                        for frame in dec.feed(data):
                            _on_frame(o, frame, now)
                    else:
                        handler = _on_chat if api == "chat" else _on_responses
                        for name, payload in sse.feed(data):
                            handler(o, name, payload, now)
                return o
        except httpx.ConnectError:
            o.refused = True
            return o
        except httpx.HTTPError as exc:  # the stream ended without its terminal
            if o.status is None and retry:
                o.unanswered += 1
                o.unanswered_why = f"{type(exc).__name__}: {exc}"
                continue
            o.cut = f"{type(exc).__name__}: {exc}"
            return o
    return o


_DETOK = None


def _decode_ids(ids: list[int]) -> str:
    global _DETOK
    if _DETOK is None:
        from tokenwire.codec.detokenizer import Detokenizer
        from tokenwire.codec.maps import bundled_map_path, load_map_file

        _DETOK = Detokenizer(load_map_file(bundled_map_path("huggingfacetb/smollm2")))
    return _DETOK.decode(ids)


def classify(o: Outcome, tokens: int = TOKENS) -> str:
    """``complete`` (exactly one successful terminal, exactly this marker's text);
    ``failed`` (exactly one terminal failure after a prefix of this marker's text, or an HTTP
    error before any stream); ``unserved`` (refused, or closed before a response: nothing
    started); ``cut`` (a stream ended without its terminal); ``wrong`` (a second terminal,
    events after it, or text that is not exactly this client's)."""
    if o.refused or (o.status is None and o.cut is not None):
        return "unserved"
    if o.status is not None and o.status != 200 and not o.terminals and o.cut is None:
        return "failed"
    if o.after_terminal or len(o.terminals) > 1:
        return "wrong"
    if not o.terminals:
        return "cut"
    text = _decode_ids(o.ids) if o.api == "codec" else o.text
    want = expected_text(o.marker, tokens)
    if o.terminals[0] == "failed":
        return "failed" if want.startswith(text) else "wrong"
    return "complete" if text == want else "wrong"


def first_byte_s(o: Outcome) -> float | None:
    """Request sent -> the response head with its first event (a keep-alive when queued)."""
    return o.arrivals[0] - o.sent_at if o.arrivals else None


def queued_gap_s(o: Outcome) -> float | None:
    """The longest silence between received bytes after the head, before the first output:
    the heartbeat cadence a queued client sees."""
    if not o.arrivals:
        return None
    end = o.first_output_at if o.first_output_at is not None else o.arrivals[-1]
    times = [t for t in o.arrivals if t <= end]
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


# -- measuring ----------------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def gc_objects(pid: int, log: Path, timeout: float = 10.0) -> int | None:
    """Live Python objects in the gateway after a full collection, which then returns freed
    memory to the system (SIGUSR2 asks it; see ``_report_objects``)."""
    before = log.read_text(errors="replace").count("gc-objects ")
    os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.findall(r"gc-objects (\d+)", log.read_text(errors="replace"))
        if len(found) > before:
            return int(found[-1])
        time.sleep(0.1)
    return None


def _memory(pid: int, log: Path) -> dict:
    """RSS as the wave left it; live objects; RSS once freed memory is handed back."""
    rss = rss_mib(pid)
    objects = gc_objects(pid, log)
    return {"rss": rss, "objects": objects, "trimmed": rss_mib(pid)}


def gateway_lag_s(log: Path, start: float, end: float) -> float:
    """The gateway's longest event-loop stall (over 0.25 s) between two wall-clock times."""
    lags = [float(m.group(1)) for m in re.finditer(r"loop-lag ([\d.]+) s at ([\d.]+)",
                                                    log.read_text(errors="replace"))
            if start <= float(m.group(2)) <= end]
    return max(lags, default=0.0)


@dataclass
class Wave:
    outcomes: list[Outcome]
    wall_s: float
    peak_queued: int
    upstream_counts: dict[str, int]
    started: float  # time.time() at the start and the end: for the gateway's log
    ended: float
    client_lag_s: float  # this process's longest event-loop stall
    signalled_at: float | None = None  # perf_counter() of the SIGTERM


async def _watch(base: str, peak: list[float], stop: asyncio.Event) -> None:
    """The gateway's peak queue (``/health``) and this loop's longest stall."""
    loop = asyncio.get_running_loop()
    async with httpx.AsyncClient(timeout=5) as c:
        while not stop.is_set():
            try:
                peak[0] = max(peak[0], (await c.get(base + "/health")).json().get("queued", 0))
            except (httpx.HTTPError, ValueError):
                pass
            for _ in range(10):
                t = loop.time()
                await asyncio.sleep(0.05)
                peak[1] = max(peak[1], loop.time() - t - 0.05)
                if stop.is_set():
                    return


#: Connections per httpx client. httpcore's pool scans every connection on every request
#: and response (``_assign_requests_to_connections``): one client holding 500 streams spent
#: half its CPU there and stalled its loop for seconds, which read as late heartbeats.
_SHARD = 16


async def wave(base: str, up_base: str, prefix: str, n: int, *, tokens: int = TOKENS,
               sigterm: tuple[int, float] | None = None, late: int = 0) -> Wave:
    """``n`` concurrent clients (APIs in turn). ``sigterm=(pid, after_s)`` signals the gateway
    mid-wave; ``late`` more clients are started just after the signal."""
    ssl_ctx = ssl.create_default_context()  # built once: each client would load the CA file
    timeout = httpx.Timeout(60.0, connect=30.0)
    limits = httpx.Limits(max_connections=_SHARD, max_keepalive_connections=_SHARD)
    shards = [httpx.AsyncClient(timeout=timeout, limits=limits, verify=ssl_ctx)
              for _ in range((n + late) // _SHARD + 1)]
    peak, stop = [0.0, 0.0], asyncio.Event()

    def start(i: int, marker: str, retry: bool) -> asyncio.Task[Outcome]:
        return asyncio.create_task(run_client(shards[i % len(shards)], base, APIS[i % 3],
                                              marker, tokens=tokens, retry=retry))

    started = time.time()
    try:
        watcher = asyncio.create_task(_watch(base, peak, stop))
        t0 = time.perf_counter()
        tasks = [start(i, f"{prefix}{i:04d}", sigterm is None) for i in range(n)]
        signalled_at = None
        if sigterm is not None:
            await asyncio.sleep(sigterm[1])
            os.kill(sigterm[0], signal.SIGTERM)
            signalled_at = time.perf_counter()
            await asyncio.sleep(0.05)
            tasks += [start(n + i, f"{prefix}late{i:03d}", False) for i in range(late)]
        outcomes = await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
        stop.set()
        await watcher
    finally:
        for c in shards:
            await c.aclose()
    counts = httpx.get(up_base + "/stats", timeout=10).json()
    return Wave(list(outcomes), wall, int(peak[0]), counts, started, time.time(), peak[1],
                signalled_at)


def _pct(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return round(xs[int(q * (len(xs) - 1))], 2) if xs else None


def correctness_row(name: str, w: Wave, tokens: int = TOKENS) -> dict:
    """Did every client get exactly its own answer, or a clean failure?"""
    kinds = Counter(classify(o, tokens) for o in w.outcomes)
    honoured = "yes" if all(o.retry_after_ok for o in w.outcomes) else "NO"
    mine = {o.marker for o in w.outcomes}
    served = {m: c for m, c in w.upstream_counts.items() if m in mine}
    return {
        "phase": name, "clients": len(w.outcomes), "complete": kinds["complete"],
        "clean failure": kinds["failed"], "cut (no terminal)": kinds["cut"],
        "wrong or duplicated": kinds["wrong"], "not served": kinds["unserved"],
        "upstream requests != 1 per complete": sum(
            1 for o in w.outcomes if classify(o, tokens) == "complete"
            and served.get(o.marker) != 1),
        "429s (all with Retry-After)": f"{sum(o.http_429 for o in w.outcomes)} ({honoured})",
        "503s": sum(o.http_503 for o in w.outcomes),
        "closed unanswered, retried": sum(o.unanswered for o in w.outcomes),
        "wall s": round(w.wall_s, 1),
    }


def timing_row(name: str, w: Wave, log: Path, *, rss: float | None = None,
               objects: int | None = None, trimmed: float | None = None) -> dict:
    """Heartbeats while queued, loop stalls on both sides, and the gateway's memory."""
    firsts = [x for o in w.outcomes if (x := first_byte_s(o)) is not None]
    gaps = [x for o in w.outcomes if (x := queued_gap_s(o)) is not None]
    return {
        "phase": name, "peak queued": w.peak_queued,
        "first byte p50 / max s": f"{_pct(firsts, 0.5)} / {_pct(firsts, 1.0)}",
        "keep-alive gap while queued p99 / max s": f"{_pct(gaps, 0.99)} / {_pct(gaps, 1.0)}",
        "keep-alives before output, max": max((o.keepalives for o in w.outcomes), default=0),
        "gateway loop stall max s": round(gateway_lag_s(log, w.started, w.ended), 2),
        "client loop stall max s": round(w.client_lag_s, 2),
        "gateway RSS MiB": round(rss, 1) if rss is not None else "-",
        "live objects after gc": objects if objects is not None else "-",
        "RSS after gc + malloc_trim": round(trimmed, 1) if trimmed is not None else "-",
    }


# -- the run ------------------------------------------------------------------------------------


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    with log.open("ab") as f:
        return subprocess.Popen([sys.executable, "-m", "bench.bench_load", *argv], stdout=f,
                                stderr=subprocess.STDOUT, cwd=Path(__file__).parent.parent)


def _start_gateway(up_port: int, log: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = _start(["--serve-gateway", str(up_port), str(port)], log)
    base = f"http://127.0.0.1:{port}"
    _wait_http(base + "/health", proc, 60)
    return proc, base


def _settings_rows(clients: int) -> list[dict]:
    return [
        {"setting": "upstream", "value": f"{TOKENS} chunks, {PACE_S * 1e3:g} ms apart "
                                         f"(~{TOKENS * PACE_S:.1f} s a stream)"},
        {"setting": "gateway capacity", "value": f"max_concurrent {MAX_CONCURRENT} (upstream "
                                                 f"limit {MAX_CONCURRENT}), queue_size "
                                                 f"{QUEUE_SIZE}"},
        {"setting": "heartbeat_s", "value": f"{HEARTBEAT_S:g} (15 in production; shortened "
                                            "for a bounded run), coalescing window 150 ms"},
        {"setting": "shutdown", "value": f"SIGTERM {SIGTERM_AFTER_S:g} s into a wave of "
                                         f"{clients}, drain_grace_s {DRAIN_GRACE_S:g}, then "
                                         "server_shutting_down to the rest"},
        {"setting": "connections", "value": "the product's limits, per-client cap "
                                            f"{PER_CLIENT} (one loopback address)"},
        {"setting": "clients", "value": "one process, httpx in pools of 16 connections; Chat "
                                        "SSE, Responses SSE, Codec msgpack in turn"},
    ]


def run(*, clients: int = CLIENTS, waves: int = WAVES, over: int = OVER_CLIENTS) -> list[dict]:
    """Start the upstream and the gateway; the waves, the over-capacity wave, the shutdown."""
    procs: list[subprocess.Popen] = []
    settings = _settings_rows(clients)
    checks: list[dict] = []
    timings: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "servers.log"
        try:
            up_port = _free_port()
            up = _start(["--serve-upstream", str(up_port)], log)
            procs.append(up)
            up_base = f"http://127.0.0.1:{up_port}"
            _wait_http(up_base + "/v1/models", up, 30)
            gw, base = _start_gateway(up_port, log)
            procs.append(gw)
            w = asyncio.run(wave(base, up_base, "warm", 30))
            checks.append(correctness_row("warm-up", w))
            timings.append(timing_row("warm-up", w, log, **_memory(gw.pid, log)))
            for k in range(waves):
                w = asyncio.run(wave(base, up_base, f"w{k}c", clients))
                name = f"wave {k + 1} of {waves}"
                checks.append(correctness_row(name, w))
                timings.append(timing_row(name, w, log, **_memory(gw.pid, log)))
            w = asyncio.run(wave(base, up_base, "over", over))
            name = f"over capacity: {over} > {MAX_CONCURRENT} + {QUEUE_SIZE}"
            checks.append(correctness_row(name, w))
            timings.append(timing_row(name, w, log, **_memory(gw.pid, log)))
            exited: list[float] = []
            waiter = threading.Thread(target=lambda: (gw.wait(), exited.append(
                time.perf_counter())), daemon=True)
            waiter.start()
            late = 30
            w = asyncio.run(wave(base, up_base, "stop", clients,
                                 sigterm=(gw.pid, SIGTERM_AFTER_S), late=late))
            waiter.join(60)
            name = f"SIGTERM mid-wave: {clients} + {late} late"
            checks.append(correctness_row(name, w))
            timings.append(timing_row(name, w, log))
            shutdown = [_shutdown_row(w, gw.returncode, exited, log, late)]
            return settings + checks + timings + shutdown
        finally:
            stop_all(procs)


def _shutdown_row(w: Wave, code: int | None, exited: list[float], log: Path,
                  late: int) -> dict:
    lines = [ln.split("shutting down: ", 1)[1] for ln in log.read_text(errors="replace")
             .splitlines() if "shutting down: " in ln]
    tail = w.outcomes[-late:]
    signalled = w.signalled_at or 0.0
    return {
        "shutdown": "SIGTERM",
        "to exit s": round(exited[0] - signalled, 1) if exited else "did not exit",
        "exit code": code,
        "late clients: refused / closed unanswered / 503": (
            f"{sum(o.refused for o in tail)} / "
            f"{sum(o.status is None and o.cut is not None for o in tail)} / "
            f"{sum(o.http_503 > 0 for o in tail)}"),
        "gateway log": "; ".join(lines) or "(nothing logged)",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve-upstream", type=int, metavar="PORT")
    parser.add_argument("--serve-gateway", nargs=2, type=int, metavar=("UPSTREAM_PORT", "PORT"))
    parser.add_argument("--clients", type=int, default=CLIENTS)
    parser.add_argument("--waves", type=int, default=WAVES)
    parser.add_argument("--over", type=int, default=OVER_CLIENTS)
    args = parser.parse_args()
    if args.serve_upstream:
        _serve_upstream(args.serve_upstream)
    elif args.serve_gateway:
        asyncio.run(_serve_gateway(*args.serve_gateway))
    else:
        for row in run(clients=args.clients, waves=args.waves, over=args.over):
            print(json.dumps(row))


if __name__ == "__main__":
    main()
