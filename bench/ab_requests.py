"""A/B: two source trees of tokenwire, short non-streamed chats at 64 connections, in turn.

What :mod:`bench.bench_rps` measures for one tree against its peers (the same request, the
same check of every answer: status, the upstream's words, its usage), for two trees (or
one tree with a flag changed) taking turns in front of one scripted upstream, so both see
the same machine load: the gateway's CPU per request and the rate, per round, then the
medians. BENCHMARKS.md "Session of 2026-12-04 (2)" quotes it (the request path without
httpx's objects; the request log's cost, with ``--b-args="--request-log off"``).

    PYTHONPATH=src .venv/bin/python -m bench.ab_requests --a /tmp/before/src --b src
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

from bench import ab_gateway as ab
from bench import bench_rps as br
from bench import bench_upstreams as bu

CONNECTIONS = 64


async def load(port: int, total: int) -> int:
    """``total`` requests over :data:`CONNECTIONS` keep-alive connections; the wrong answers."""
    request = br._request_bytes("127.0.0.1", port, "/v1/chat/completions", {})
    left, wrong = [total], [0]

    async def connection() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while left[0] > 0:
            left[0] -= 1
            writer.write(request)
            status, body, _ = await br._read_response(reader)
            wrong[0] += br.check_answer(status, body) is not None
        writer.close()

    await asyncio.gather(*(connection() for _ in range(CONNECTIONS)))
    return wrong[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ab.add_tree_arguments(parser)
    parser.add_argument("--requests", type=int, default=4000, help="measured, per round")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    sides = ab.sides_of(args)
    seen: dict[str, list[tuple[float, float]]] = {"A": [], "B": []}
    procs: list = []
    try:
        upstream, up_port = bu.start_upstream(procs, br.ANSWER_TOKENS, 0.0)
        for r in range(args.rounds):
            for name, tree, extra in (sides if r % 2 == 0 else sides[::-1]):
                port = bu._free_port()
                gateway = ab._start(tree, up_port, port, extra)
                try:
                    asyncio.run(load(port, 600))  # warm-up: connections, caches, the pool
                    g0, u0 = bu._cpu_seconds(gateway.pid), bu._cpu_seconds(upstream.pid)
                    t0 = time.perf_counter()
                    wrong = asyncio.run(load(port, args.requests))
                    rate = args.requests / (time.perf_counter() - t0)
                    cpu = (bu._cpu_seconds(gateway.pid) - g0) / args.requests * 1e6
                    up = (bu._cpu_seconds(upstream.pid) - u0) / args.requests * 1e6
                    seen[name].append((cpu, rate))
                    print(f"round {r} {name}: gateway {cpu:.0f} µs/request, upstream {up:.0f}, "
                          f"{rate:.0f} requests/s, wrong answers {wrong}", flush=True)
                finally:
                    gateway.terminate()
                    gateway.wait(10)
        for name in seen:
            print(f"{name} median: gateway {statistics.median(c for c, _ in seen[name]):.0f} "
                  f"µs/request, {statistics.median(r for _, r in seen[name]):.0f} requests/s")
    finally:
        bu.stop_all(procs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
