"""A/B: two source trees of tokenwire, taking turns in front of one scripted upstream.

``bench_upstreams`` measures one tree against its peers; a change to the hot path needs the
tree before and after it in the same run, because this machine's load moves absolute CPU
figures by 2x between runs (BENCHMARKS.md). Each round starts ``tokenwire serve`` from
tree A, measures it, stops it, then the same for tree B (same upstream, same clients, the
phases and ratios of :mod:`bench.bench_upstreams`), so both see the same load.

    PYTHONPATH=src .venv/bin/python -m bench.ab_gateway --a /tmp/before/src --b src --rounds 3

Prints one JSON row per (round, tree, format, concurrency) and the medians of
``cpu_x_upstream`` per tree at the end. To get a tree of an older commit:
``git archive <commit> src | tar -x -C /tmp/before``. ``--a-args`` / ``--b-args`` add
``tokenwire serve`` flags to one side, so one tree can be measured against itself with a
setting changed (the event loop, BENCHMARKS.md "uvloop as the event loop")::

    python -m bench.ab_gateway --a src --b src --a-args="--loop asyncio" --b-args="--loop uvloop"
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import httpx

from bench import bench_upstreams as bu

FORMATS = ((None, {}, "chat SSE"), ("msgpack", {"Codec-Client-Version": "0.5"}, "Codec msgpack"))


def _start(tree: str, up_port: int, port: int, extra: list[str]) -> subprocess.Popen:
    if not (Path(tree) / "tokenwire").is_dir():  # else the installed package runs, silently
        raise SystemExit(f"{tree} holds no tokenwire/ package")
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
    most = str(max(c for c, _ in bu.LOADS))
    argv = [sys.executable, "-m", "tokenwire.cli.main", "serve", "--upstream",
            f"http://127.0.0.1:{up_port}/v1", "--upstream-max-concurrent", most,
            "--max-concurrent", most, "--port", str(port), "--log-level", "warning", *extra]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    bu._wait_http(f"http://127.0.0.1:{port}/health", proc, 60)
    return proc


def add_tree_arguments(parser: argparse.ArgumentParser) -> None:
    """The two sides of an A/B: ``--a`` / ``--b`` (trees holding tokenwire/) and
    ``--a-args`` / ``--b-args`` (more ``tokenwire serve`` flags for one side)."""
    parser.add_argument("--a", required=True, help="the 'before' tree (holds tokenwire/)")
    parser.add_argument("--b", required=True, help="the 'after' tree")
    parser.add_argument("--a-args", default="", help="more `tokenwire serve` flags for A")
    parser.add_argument("--b-args", default="", help="more `tokenwire serve` flags for B")


def sides_of(args: argparse.Namespace) -> tuple[tuple[str, str, list[str]], ...]:
    """``(name, tree, serve flags)`` for A and B, from :func:`add_tree_arguments`' values."""
    return (("A", args.a, shlex.split(args.a_args)), ("B", args.b, shlex.split(args.b_args)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tree_arguments(parser)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sides = sides_of(args)
    procs: list[subprocess.Popen] = []
    ratios: dict[tuple[str, str, int], list[float]] = {}
    try:
        up, up_port = bu.start_upstream(procs)
        for rnd in range(args.rounds):
            for name, tree, extra in sides:
                port = bu._free_port()
                tw = _start(tree, up_port, port, extra)
                try:
                    for fmt, headers, label in FORMATS:
                        try:
                            rows = bu._measure(f"{name} ({label})", f"http://127.0.0.1:{port}",
                                               tw.pid, fmt, headers, up.pid)
                        except httpx.HTTPError as exc:  # a lost phase, not a lost run
                            print(json.dumps({"round": rnd, "target": name, "format": label,
                                              "failed": f"{type(exc).__name__}: {exc}",
                                              "alive": tw.poll() is None}), flush=True)
                            continue
                        for row in rows:
                            row.update(round=rnd, load=round(os.getloadavg()[0], 1))
                            print(json.dumps(row), flush=True)
                            key = (name, label, row["concurrency"])
                            ratios.setdefault(key, []).append(row["cpu_x_upstream"])
                finally:
                    bu.stop_all([tw])
    finally:
        bu.stop_all(procs)
    for (name, label, conc), values in sorted(ratios.items()):
        print(f"{name} {label:14} {conc:3} streams: cpu_x_upstream median "
              f"{statistics.median(values):.2f} of {values}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
