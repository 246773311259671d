"""Added time to first token with a long prompt: direct vs one or more tokenwire trees.

An agent's request carries its whole context. What the gateway does with the prompt before
the upstream request goes out (decode the body, build and encode the upstream's, count the
prompt) is on the way to the first token. One chat of ``--words`` random words (30,000:
~190 KB) through the scripted upstream of :mod:`bench.bench_upstreams`, sequentially,
direct and through each tree in turn; the median time to the first content delta.

    PYTHONPATH=src .venv/bin/python -m bench.bench_long_prompt --tree /tmp/before/src --tree src

The scripted upstream answers at once and has no chat template for the prompt count, so
this shows the request's own path, not the count (BENCHMARKS.md "Session of 2026-12-04
(2)", change 6).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time

import httpx

from bench import ab_gateway as ab
from bench import bench_upstreams as bu

WORDS = ("alpha", "beta", "gamma", "def", "return", "self", "value", "import", "tokenwire",
         "gateway", "stream", "token")


def body(words: int) -> dict:
    rng = random.Random(1)
    prompt = " ".join(rng.choice(WORDS) for _ in range(words))
    return {"model": bu.MODEL, "stream": True, "max_tokens": 4,
            "messages": [{"role": "user", "content": prompt}]}


async def ttft_ms(url: str, request: dict, streams: int, warm: int = 3) -> float:
    """The median time to the first content delta over ``streams`` sequential streams."""
    seen = []
    async with httpx.AsyncClient(timeout=60) as client:
        for i in range(warm + streams):
            t0, first = time.perf_counter(), None
            async with client.stream("POST", url, json=request) as resp:
                async for line in resp.aiter_lines():
                    if first is None and line.startswith("data: {"):
                        choices = json.loads(line[6:]).get("choices") or [{}]
                        if choices[0].get("delta", {}).get("content"):
                            first = time.perf_counter() - t0
            if i >= warm and first is not None:
                seen.append(first * 1000)
    return statistics.median(seen)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[], help="a tree holding tokenwire/")
    parser.add_argument("--words", type=int, default=30000)
    parser.add_argument("--streams", type=int, default=15)
    args = parser.parse_args()
    request = body(args.words)
    procs: list = []
    try:
        _, up_port = bu.start_upstream(procs, 4)
        direct = asyncio.run(ttft_ms(f"http://127.0.0.1:{up_port}/v1/chat/completions",
                                     request, args.streams))
        print(json.dumps({"prompt_chars": len(request["messages"][0]["content"]),
                          "target": "direct", "ttft_p50_ms": round(direct, 2)}))
        for tree in args.tree:
            port = bu._free_port()
            gateway = ab._start(tree, up_port, port, [])
            try:
                ttft = asyncio.run(ttft_ms(f"http://127.0.0.1:{port}/v1/chat/completions",
                                           request, args.streams))
            finally:
                gateway.terminate()
                gateway.wait(10)
            print(json.dumps({"target": tree, "ttft_p50_ms": round(ttft, 2),
                              "added_ttft_p50_ms": round(ttft - direct, 2)}))
    finally:
        bu.stop_all(procs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
