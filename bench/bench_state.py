"""Shared state on Redis against none: added TTFT, gateway CPU per token, Redis round trips.

What is measured (issue 16, "Measured in bench/"), in one run, side by side:

* Upstream: bench_upstreams' scripted OpenAI-compatible Chat server in its own process
  (``TOKENS`` word chunks ``PACE_S`` apart), so the gateway, not a model, is measured.
* Two ``tokenwire serve --upstream URL`` processes in front of it, alive at the same time:
  ``state off`` (no ``[state]``: the SQLite response store in the process) and ``state on``
  (``--state-url`` naming a real ``redis-server`` started here, no persistence: the Redis
  round trip, not the disk, is measured).
* Workloads, sequential, the two gateways **interleaved request by request** so that both
  see the same machine load: a Chat stream; a Responses stream with ``store: true``; its
  continuation (``previous_response_id`` of the one just stored, on the same gateway).
* TTFT: request sent -> first content delta at the client (httpx, this process); added TTFT
  is ``state on``'s median minus ``state off``'s for the same workload.
* CPU per token: each gateway's utime+stime (``/proc``) over the whole run, divided by the
  content chunks its clients received.
* Round trips: for one request of each workload on ``state on`` with nothing else running,
  the delta of the gateway's ``tokenwire_state_calls_total`` (round trips it sent) and of
  Redis's ``INFO commandstats`` (commands Redis ran; a pipeline or script is one round trip
  and several commands).

Run: ``PYTHONPATH=src .venv/bin/python -m bench.bench_state [--rounds N]`` (about a minute).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.bench_upstreams import (
    MODEL,
    TOKENS,
    _cpu_seconds,
    _free_port,
    _wait_http,
    start_upstream,
    stop_all,
)

ROUNDS = 40
WORKLOADS = ("chat", "responses+store", "continuation")


def _start_redis(tmp: Path) -> tuple[subprocess.Popen, int]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is missing: scripts/system-packages.sh installs it")
    port = _free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp), "--daemonize", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    import redis

    while True:
        try:
            redis.Redis(port=port).ping()
            return proc, port
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _start_gateway(up_port: int, state_url: str | None) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    argv = [sys.executable, "-m", "tokenwire.cli.main", "serve", "--upstream",
            f"http://127.0.0.1:{up_port}/v1", "--port", str(port), "--log-level", "warning"]
    if state_url:
        argv += ["--state-url", state_url]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    _wait_http(base + "/health", proc, 120)
    return proc, base


def _request(client: httpx.Client, base: str, workload: str, previous: str | None
             ) -> tuple[float, int, str | None]:
    """One streamed request: (TTFT in s, content chunks, the response id if stored)."""
    if workload == "chat":
        path, body = "/v1/chat/completions", {"model": MODEL, "stream": True, "messages": [
            {"role": "user", "content": "hi"}]}
    else:
        path, body = "/v1/responses", {"model": MODEL, "stream": True, "store": True,
                                       "input": "hi"}
        if workload == "continuation":
            body["previous_response_id"] = previous
    t0, ttft, chunks, rid = time.perf_counter(), None, 0, None
    with client.stream("POST", base + path, json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data:") or line[5:].strip() in ("", "[DONE]"):
                continue
            event = json.loads(line[5:])
            if _is_content(event):
                chunks += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
            if event.get("type") == "response.completed":
                rid = event["response"]["id"]
    assert ttft is not None and chunks, f"{workload}: no content"
    return ttft, chunks, rid


def _is_content(event: dict) -> bool:
    if event.get("type") == "response.output_text.delta":
        return True
    choices = event.get("choices") or []
    return bool(choices and choices[0].get("delta", {}).get("content"))


def _state_calls(client: httpx.Client, base: str) -> float:
    text = client.get(base + "/metrics").text
    return sum(float(m.group(1)) for m in
               re.finditer(r'^tokenwire_state_calls_total\{[^}]*\} (\S+)$', text, re.M))


def _commandstats(port: int) -> dict[str, int]:
    import redis

    info = redis.Redis(port=port).info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()}


def _round_trips(client: httpx.Client, base: str, redis_port: int) -> list[dict]:
    rows, previous = [], None
    for workload in WORKLOADS:
        calls0, cmds0 = _state_calls(client, base), _commandstats(redis_port)
        _, _, rid = _request(client, base, workload, previous)
        previous = rid or previous
        calls1, cmds1 = _state_calls(client, base), _commandstats(redis_port)
        delta = {k: v - cmds0.get(k, 0) for k, v in cmds1.items() if v != cmds0.get(k, 0)}
        for own in ("info", "hello"):  # this bench's own INFO connection
            delta.pop(own, None)
        rows.append({"bench": "state", "workload": workload,
                     "redis_round_trips": int(calls1 - calls0), "redis_commands": delta})
    return rows


def run(rounds: int = ROUNDS) -> list[dict]:
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            _, up_port = start_upstream(procs)
            redis_proc, redis_port = _start_redis(Path(tmp))
            procs.append(redis_proc)
            gateways = {}
            for label, url in (("state off", None),
                               ("state on", f"redis://127.0.0.1:{redis_port}/0")):
                proc, base = _start_gateway(up_port, url)
                procs.append(proc)
                gateways[label] = (proc, base)
            return _measure(gateways, redis_port, rounds)
        finally:
            stop_all(procs)


def _measure(gateways: dict, redis_port: int, rounds: int) -> list[dict]:
    ttfts = {(g, w): [] for g in gateways for w in WORKLOADS}
    chunks = dict.fromkeys(gateways, 0)
    previous = dict.fromkeys(gateways)
    with httpx.Client(timeout=120) as client:
        for label, (_, base) in gateways.items():  # warm-up: connections, maps, caches
            for workload in WORKLOADS:
                _, _, rid = _request(client, base, workload, previous[label])
                previous[label] = rid or previous[label]
        cpu0 = {g: _cpu_seconds(p.pid) for g, (p, _) in gateways.items()}
        load = os.getloadavg()[0]
        for _ in range(rounds):
            for workload in WORKLOADS:
                for label, (_, base) in gateways.items():
                    ttft, n, rid = _request(client, base, workload, previous[label])
                    ttfts[(label, workload)].append(ttft)
                    chunks[label] += n
                    previous[label] = rid or previous[label]
        cpu1 = {g: _cpu_seconds(p.pid) for g, (p, _) in gateways.items()}
        rows = []
        for workload in WORKLOADS:
            off = statistics.median(ttfts[("state off", workload)])
            on = statistics.median(ttfts[("state on", workload)])
            p90 = {g: statistics.quantiles(ttfts[(g, workload)], n=10)[-1] for g in gateways}
            rows.append({"bench": "state", "workload": workload, "rounds": rounds,
                         "ttft_p50_ms_off": round(off * 1000, 2),
                         "ttft_p50_ms_on": round(on * 1000, 2),
                         "added_ttft_p50_ms": round((on - off) * 1000, 2),
                         "ttft_p90_ms_off": round(p90["state off"] * 1000, 2),
                         "ttft_p90_ms_on": round(p90["state on"] * 1000, 2)})
        rows.append({"bench": "state", "workload": "all (CPU)", "tokens_per_request": TOKENS,
                     **{f"cpu_us_per_token_{g.split()[1]}": round(
                         (cpu1[g] - cpu0[g]) / chunks[g] * 1e6, 1) for g in gateways},
                     "load_avg_1m_at_start": round(load, 1)})
        rows += _round_trips(client, gateways["state on"][1], redis_port)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    for row in run(parser.parse_args().rounds):
        print(json.dumps(row))
