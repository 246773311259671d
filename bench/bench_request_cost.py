"""Gateway cost split into a fixed part per request and a marginal part per token.

The issue-15 ratio (gateway CPU per token / the scripted upstream's) mixes the two: at 64
tokens per stream, a request's fixed cost is spread over only 64 tokens. This bench runs the
scripted upstream of :mod:`bench.bench_upstreams` with 8, 64 and 256 tokens per stream, 64
Chat SSE streams at a time through ``tokenwire serve --upstream`` from ``--tree``, reads
both processes' CPU (utime + stime) per request, and fits ``cost = fixed + n * per_token``
on the 8- and 256-token runs (the 64-token run checks the line).

    PYTHONPATH=src .venv/bin/python -m bench.bench_request_cost [--tree src]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess

from bench import ab_gateway as ab
from bench import bench_upstreams as bu

RUNS = ((8, 40), (64, 8), (256, 2))  # (tokens per stream, waves of 64 streams)
CONCURRENCY = 64


def _per_request(tree: str, tokens: int, waves: int) -> tuple[float, float]:
    """Median over three phases of (gateway, upstream) CPU µs per request."""
    procs: list[subprocess.Popen] = []
    try:
        up, port = bu.start_upstream(procs, tokens)
        gw_port = bu._free_port()
        tw = ab._start(tree, port, gw_port, [])
        procs.append(tw)
        url = f"http://127.0.0.1:{gw_port}/v1/chat/completions"
        asyncio.run(bu._phase(url, None, {}, 1, 3))  # warm-up
        gw, ups = [], []
        for _ in range(3):
            g0, u0 = bu._cpu_seconds(tw.pid), bu._cpu_seconds(up.pid)
            asyncio.run(bu._phase(url, None, {}, CONCURRENCY, waves))
            requests = CONCURRENCY * waves
            gw.append((bu._cpu_seconds(tw.pid) - g0) / requests * 1e6)
            ups.append((bu._cpu_seconds(up.pid) - u0) / requests * 1e6)
        return statistics.median(gw), statistics.median(ups)
    finally:
        bu.stop_all(procs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default="src", help="the tree that holds tokenwire/")
    args = parser.parse_args()
    cost = {}
    for tokens, waves in RUNS:
        cost[tokens] = _per_request(args.tree, tokens, waves)
        print(f"{tokens:4d} tokens/stream: gateway {cost[tokens][0]:7.0f} us/request, "
              f"upstream {cost[tokens][1]:7.0f} us/request (load {os.getloadavg()[0]:.1f})",
              flush=True)
    lo, hi = RUNS[0][0], RUNS[-1][0]
    for side, name in ((0, "gateway"), (1, "upstream")):
        per_token = (cost[hi][side] - cost[lo][side]) / (hi - lo)
        fixed = cost[lo][side] - lo * per_token
        print(f"{name:8s}: fixed {fixed:6.0f} us/request, marginal {per_token:5.1f} us/token")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
