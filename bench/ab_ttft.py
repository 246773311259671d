"""A/B of the first token: trees of tokenwire side by side, each in fresh processes per epoch.

``bench_upstreams`` measures one gateway process per row. The same code in another process
starts its first tokens up to ~0.3 ms apart on this machine (BENCHMARKS.md, "Session of
2026-12-05 (6)": the request path runs cold, and how cold depends on the process), so a
change of a few tens of µs needs many processes per tree. Here each epoch starts one
``tokenwire serve`` per tree in front of the same scripted upstream (answering as vLLM,
with ``token_ids``), and the client takes turns, one stream at a time: two of direct's
(SSE), then two of each tree's Chat SSE and Codec msgpack (the ids the upstream sent);
the second of each two is measured, and every other round runs the turns in reverse
order. Printed per epoch, then over all epochs: the median time to the first content
(ms) and its difference from direct's. ``--identity`` adds each tree's Codec stream with
``Accept-Encoding: identity`` (what the gzip costs the first token).

    PYTHONPATH=src .venv/bin/python -m bench.ab_ttft --trees /tmp/before/src,src \\
        --epochs 6 --rounds 15
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from collections.abc import Awaitable, Callable

import httpx

from bench import ab_gateway as ab
from bench import bench_upstreams as bu

Stream = Callable[[httpx.AsyncClient, str, dict[str, str]], Awaitable[float]]


def _first(fmt: str | None) -> Stream:
    """Seconds to the first content of a stream read to its end, as ``bench_upstreams``
    reads it: a Chat SSE content delta, or (``msgpack``) the first Codec frame with ids."""
    async def stream(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> float:
        seconds, count = await bu._one_stream(client, url, fmt, headers)
        assert count, "no content in the stream"
        return seconds

    return stream


_SSE, _CODEC = _first(None), _first("msgpack")


async def _turns(targets: dict[str, tuple[Stream, str, dict[str, str]]],
                 rounds: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {name: [] for name in targets}
    limits = httpx.Limits(max_connections=8, keepalive_expiry=2.0)  # see bu._phase
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        names = list(targets)
        for i in range(rounds + 3):  # three rounds warm every target up
            for name in names if i % 2 == 0 else names[::-1]:
                stream, url, headers = targets[name]
                await stream(client, url, headers)
                second = await stream(client, url, headers)
                if i >= 3:
                    out[name].append(second)
    return out


def _report(label: str, seen: dict[str, list[float]]) -> None:
    direct = statistics.median(seen["direct"]) * 1e3
    cells = [f"direct {direct:.3f}"] + [
        f"{name} {statistics.median(v) * 1e3 - direct:+.3f}"
        for name, v in seen.items() if name != "direct"]
    print(f"{label}: " + ", ".join(cells), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", required=True, help="comma-separated trees (hold tokenwire/)")
    parser.add_argument("--epochs", type=int, default=6, help="fresh gateway processes each")
    parser.add_argument("--rounds", type=int, default=15, help="measured rounds per epoch")
    parser.add_argument("--identity", action="store_true",
                        help="also each tree's Codec stream with Accept-Encoding: identity")
    args = parser.parse_args()
    trees = args.trees.split(",")
    codec = {"Codec-Client-Version": "0.5"}
    procs: list = []
    seen: dict[str, list[float]] = {}
    try:
        _, up_port = bu.start_upstream(procs, ids=True)
        for epoch in range(args.epochs):
            gateways = []
            targets: dict[str, tuple[Stream, str, dict[str, str]]] = {
                "direct": (_SSE, f"http://127.0.0.1:{up_port}/v1/chat/completions", {})}
            order = list(enumerate(trees))
            for k, tree in order if epoch % 2 == 0 else order[::-1]:  # start order too
                port = bu._free_port()
                gateways.append(ab._start(tree, up_port, port, []))
                url = f"http://127.0.0.1:{port}/v1/chat/completions"
                targets[f"{k} chat"] = (_SSE, url, {})
                targets[f"{k} codec"] = (_CODEC, url, codec)
                if args.identity:
                    targets[f"{k} codec identity"] = (_CODEC, url,
                                                      {**codec, "Accept-Encoding": "identity"})
            try:
                epoch_seen = asyncio.run(_turns(dict(sorted(targets.items())), args.rounds))
            finally:
                bu.stop_all(gateways)
            _report(f"epoch {epoch}", epoch_seen)
            for name, values in epoch_seen.items():
                seen.setdefault(name, []).extend(values)
    finally:
        bu.stop_all(procs)
    print("trees: " + ", ".join(f"{k} = {tree}" for k, tree in enumerate(trees)))
    _report("all epochs, added to the first token (ms)", seen)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
