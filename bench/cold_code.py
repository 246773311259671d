"""How much slower the gateway's code runs after a pause than run again at once, on this machine.

A request at one stream comes after milliseconds of idleness, and every step on its way
to the first token runs once: the CPU's caches and branch predictors hold none of it
by then. This times one step of that path, the Chat request's checks
(``parse_chat_request`` on ``bench_upstreams``' body, warm ~8 µs), once after each pause,
the pause either slept (the vCPU halts) or spun in Python (it stays busy, with a tiny
footprint), against no pause (the step again at once after the last one). The ratio is
what any code on the first token's path costs here; "Session of 2026-12-05 (9)" in
BENCHMARKS.md compares it with the per-step times of ``bench.ttft_timeline --layers``.

    PYTHONPATH=src .venv/bin/python -m bench.cold_code [--calls 100]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import msgspec

from bench import bench_upstreams as bu
from tokenwire.gateway.apis.chat import parse_chat_request

PAUSES_S = (0.0003, 0.001, 0.003, 0.01)


def _timed(step: Callable[[], object], pauses: dict[str, Callable[[], None]],
           rounds: int) -> dict[str, float]:
    """Median µs of ``step`` run once after each pause, the pauses taken in turns round
    after round (the machine's drift then touches them all alike)."""
    times: dict[str, list[float]] = {name: [] for name in pauses}
    for _ in range(rounds):
        for name, pause in pauses.items():
            pause()
            t = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(v) * 1e6 for name, v in times.items()}


def _spin(seconds: float) -> Callable[[], None]:
    def spin() -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
    return spin


def _sleep(seconds: float) -> Callable[[], None]:
    return lambda: time.sleep(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=100, help="timed calls per pause")
    args = parser.parse_args()
    body = msgspec.json.decode(msgspec.json.encode({
        "model": bu.MODEL, "stream": True, "max_tokens": bu.TOKENS,
        "messages": [{"role": "user", "content": "Say words."}]}))

    def step() -> object:
        return parse_chat_request(body, request_id="chatcmpl-bench")

    for _ in range(1000):
        step()
    pauses: dict[str, Callable[[], None]] = {"no pause": lambda: None}
    for pause_s in PAUSES_S:
        pauses[f"spun {pause_s * 1e3:g} ms"] = _spin(pause_s)
        pauses[f"slept {pause_s * 1e3:g} ms"] = _sleep(pause_s)
    medians = _timed(step, pauses, args.calls)
    warm = medians["no pause"]
    print(f"parse_chat_request, median of {args.calls} calls after each pause (in turns)")
    for name, us in medians.items():
        print(f"  {name:<18}{us:8.1f} µs  {us / warm:.1f}x")


if __name__ == "__main__":
    main()
