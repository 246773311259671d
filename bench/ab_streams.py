"""A/B at one load: two source trees of tokenwire taking turns, N streams of T tokens each.

:mod:`bench.ab_gateway` runs the two loads of :mod:`bench.bench_upstreams` (1 and 64
streams of 64 tokens, a few waves each). A change worth a few per cent of a token's CPU
needs more waves at one load, and both orders: here each round starts ``tokenwire serve``
from each tree in turn (B first in odd rounds, so neither side always follows the other),
in front of one scripted upstream streaming ``--tokens`` chunks per answer, runs
``--waves`` waves of ``--streams`` concurrent Chat SSE streams (``--format msgpack``:
Codec frames) after two warm-up waves, and reads both processes' CPU. It prints the
gateway's CPU per request, its ratio to the upstream's and the median time to first
content per round, then the medians per tree.
Short streams (``--tokens 8``) weigh the per-request path; long ones the per-token path.

    PYTHONPATH=src .venv/bin/python -m bench.ab_streams --a /tmp/before --b src \\
        --tokens 64 --waves 10 --rounds 8
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics

from bench import ab_gateway as ab
from bench import bench_upstreams as bu


def _measure(tree: str, extra: list[str], up, up_port: int, streams: int, waves: int,
             fmt: str | None) -> tuple[float, float, float]:
    """(gateway CPU µs per request, gateway CPU / upstream CPU, median TTFT ms)."""
    port = bu._free_port()
    tw = ab._start(tree, up_port, port, extra)
    headers = {"Codec-Client-Version": "0.5"} if fmt else {}
    try:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        asyncio.run(bu._phase(url, fmt, headers, streams, 2))  # warm-up
        gw0, up0 = bu._cpu_seconds(tw.pid), bu._cpu_seconds(up.pid)
        ttfts, _ = asyncio.run(bu._phase(url, fmt, headers, streams, waves))
        gw, upstream = bu._cpu_seconds(tw.pid) - gw0, bu._cpu_seconds(up.pid) - up0
    finally:
        bu.stop_all([tw])
    return (gw / (streams * waves) * 1e6, gw / upstream if upstream else float("nan"),
            statistics.median(ttfts) * 1e3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ab.add_tree_arguments(parser)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=bu.TOKENS, help="chunks per answer")
    parser.add_argument("--waves", type=int, default=10, help="measured waves per turn")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--format", choices=("chat", "msgpack"), default="chat",
                        help="Chat SSE, or Codec msgpack frames (ids retokenized)")
    args = parser.parse_args()
    fmt = None if args.format == "chat" else args.format
    sides = (("A", args.a, shlex.split(args.a_args)), ("B", args.b, shlex.split(args.b_args)))
    results: dict[str, list[tuple[float, float, float]]] = {"A": [], "B": []}
    procs = []
    try:
        up, up_port = bu.start_upstream(procs, args.tokens)
        for rnd in range(args.rounds):
            for name, tree, extra in (sides if rnd % 2 == 0 else sides[::-1]):
                row = _measure(tree, extra, up, up_port, args.streams, args.waves, fmt)
                results[name].append(row)
                print(f"round {rnd} {name}: gateway {row[0]:.0f} µs/request, "
                      f"x upstream {row[1]:.2f}, TTFT p50 {row[2]:.2f} ms", flush=True)
    finally:
        bu.stop_all(procs)
    for name, rows in results.items():
        per_req, ratio, ttft = ([r[i] for r in rows] for i in range(3))
        print(f"{name} median: gateway {statistics.median(per_req):.0f} µs/request "
              f"{sorted(round(v) for v in per_req)}, x upstream {statistics.median(ratio):.2f} "
              f"{sorted(round(v, 2) for v in ratio)}, TTFT p50 {statistics.median(ttft):.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
