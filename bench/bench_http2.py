"""HTTP/2 vs HTTP/1.1: the gateway's CPU per streamed token and time to first token (issue 15).

Measured exactly as ``bench_upstreams`` measures the gateway (same scripted upstream in its
own process, ``TOKENS`` chunks ``PACE_S`` apart; same clients; the gateway process tree's
utime+stime from ``/proc`` divided by the content chunks received), at 1 and 64 concurrent
streams, Chat SSE and Codec msgpack, for:

* ``http/1.1``: ``tokenwire serve --upstream`` as shipped (uvicorn, the guarded httptools
  protocol since 2026-12-04, h11 before); httpx with a pool of one connection per stream;
* ``h2c``: the same server, httpx with ``http2=True`` and prior knowledge: every stream on
  one connection (``gateway/http/http2.py``);
* ``http/1.1 httptools (unguarded)``: uvicorn's own httptools protocol, *without* the
  connection guard: what the guard itself costs (before 2026-12-04, when the guard was an
  h11 subclass, this row priced the parser alone). Needs ``httptools`` (a dependency now).
* ``hypercorn ... (unguarded)``: the same app (``harden(create_app())`` over the same built
  gateway) served by hypercorn (h11 + h2) instead, HTTP/1.1 and h2c: the alternative
  server, priced without the guard it lacks. Needs ``hypercorn`` (skipped if not).

Run: ``PYTHONPATH=src .venv/bin/python -m bench.bench_http2`` (prints JSON rows).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
from importlib.util import find_spec

import httpx

from bench.bench_upstreams import (
    LOADS,
    TOKENS,
    _cpu_seconds,
    _free_port,
    _one_stream,
    _wait_http,
    start_upstream,
    stop_all,
)

#: Below uvicorn's ``timeout_keep_alive`` (5 s), so the client never reuses a connection
#: the server is closing.
KEEPALIVE_EXPIRY_S = 3.0


async def _phase(url: str, fmt: str | None, headers: dict[str, str], concurrency: int,
                 rounds: int, http2: bool) -> tuple[list[float], int]:
    # Idle connections are dropped by the client before the server's 5 s keep-alive: at
    # httpx's default (also 5 s) a round that starts just as the server closes a
    # connection sends on a dying socket (an httpx.ReadError seen here under load).
    limits = httpx.Limits(max_connections=1 if http2 else concurrency + 4,
                          keepalive_expiry=KEEPALIVE_EXPIRY_S)
    async with httpx.AsyncClient(timeout=120, limits=limits, http1=not http2,
                                 http2=http2) as client:
        ttfts, tokens = [], 0
        for _ in range(rounds):
            results = await asyncio.gather(*(_one_stream(client, url, fmt, headers)
                                             for _ in range(concurrency)))
            ttfts += [t for t, _ in results]
            tokens += sum(n for _, n in results)
    return ttfts, tokens


def _measure(target: str, base: str, pid: int, fmt: str | None, headers: dict[str, str],
             http2: bool) -> list[dict]:
    rows = []
    url = base + "/v1/chat/completions"
    asyncio.run(_phase(url, fmt, headers, 1, 3, http2))  # warm-up
    for concurrency, rounds in LOADS:
        cpu0, t0 = _cpu_seconds(pid), time.perf_counter()
        ttfts, tokens = asyncio.run(_phase(url, fmt, headers, concurrency, rounds, http2))
        wall, cpu = time.perf_counter() - t0, _cpu_seconds(pid) - cpu0
        rows.append(row := {
            "bench": "http2", "target": target, "stream": fmt or "chat SSE",
            "concurrency": concurrency, "streams": len(ttfts),
            "ttft_p50_ms": round(statistics.median(ttfts) * 1e3, 2),
            "tokens": tokens, "tokens_per_s": round(tokens / wall, 1),
            "gateway_cpu_us_per_token": round(cpu / tokens * 1e6, 1),
        })
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def _start(up_port: int, port: int, variant: str) -> subprocess.Popen:
    most = str(max(c for c, _ in LOADS))
    argv = ["serve", "--upstream", f"http://127.0.0.1:{up_port}/v1", "--upstream-max-concurrent",
            most, "--max-concurrent", most, "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen([sys.executable, "-m", "bench.bench_http2", "--serve", variant,
                             *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_http(f"http://127.0.0.1:{port}/health", proc, 60)
    return proc


def _serve(variant: str, argv: list[str]) -> None:
    """``tokenwire serve`` as shipped, or with uvicorn's httptools protocol (unguarded)."""
    from tokenwire.cli.main import main
    from tokenwire.gateway import server

    if variant == "httptools":
        product = server.uvicorn_limits
        server.uvicorn_limits = lambda state: {**product(state), "http": "httptools"}
    elif variant == "hypercorn":
        server.run_gateway = _hypercorn_gateway
    sys.exit(main(argv))


def _hypercorn_gateway(cfg, settings, *, log_level: str = "warning", on_ready=None) -> None:
    import hypercorn.asyncio
    import hypercorn.config

    from tokenwire.gateway import server
    from tokenwire.gateway.http.app import create_app
    from tokenwire.gateway.http.security import harden

    async def serve() -> None:
        gw = await server.build_gateway(cfg, settings)
        config = hypercorn.config.Config()
        config.bind = [f"{settings.host}:{settings.port}"]
        config.loglevel, config.accesslog = "WARNING", None
        try:
            await hypercorn.asyncio.serve(harden(create_app(gw.state), settings), config,
                                          mode="asgi")
        finally:
            await gw.aclose()
    asyncio.run(serve())


def run() -> list[dict]:
    procs: list[subprocess.Popen] = []
    rows: list[dict] = []
    variants = [("http/1.1", "product", False), ("h2c", "product", True)]
    if find_spec("httptools") is not None:
        variants.append(("http/1.1 httptools (unguarded)", "httptools", False))
    if find_spec("hypercorn") is not None:
        variants += [("hypercorn http/1.1 (unguarded)", "hypercorn", False),
                     ("hypercorn h2c (unguarded)", "hypercorn", True)]
    try:
        _, up_port = start_upstream(procs)
        for target, variant, http2 in variants:
            port = _free_port()
            gw = _start(up_port, port, variant)
            procs.append(gw)
            base = f"http://127.0.0.1:{port}"
            rows += _measure(target, base, gw.pid, None, {}, http2)
            rows += _measure(target, base, gw.pid, "msgpack", {"Codec-Client-Version": "0.5"},
                             http2)
            gw.terminate()
            gw.wait(15)
        return rows
    finally:
        stop_all(procs)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        _serve(sys.argv[2], sys.argv[3:])
    else:
        print(f"# {TOKENS} tokens a stream; loads {LOADS}", file=sys.stderr)
        for row in run():
            print(json.dumps(row))
