"""Short non-streamed chats per second at saturation: direct vs tokenwire vs LiteLLM vs Portkey.

Issue 15 asks for requests per second beside the streamed figures of
:mod:`bench.bench_upstreams`, whose processes this reuses: the scripted upstream (here in a
process of its own that answers ``ANSWER_TOKENS`` words with no pacing), ``tokenwire serve
--upstream``, LiteLLM's proxy and Portkey's gateway, each in front of that one upstream.

* Load: ``CONCURRENCY`` keep-alive connections, each sending one non-streamed Chat
  Completions request at a time, for a window of ``SECONDS`` after a warm-up; only answers
  that complete inside it are counted. All targets run at once and take their windows in
  turn, ``ROUNDS`` times, so a change in the shared machine's load falls on all alike.
* Client: the same for every target, a lean HTTP/1.1 client on raw asyncio streams (uvloop
  when installed), in ``CLIENTS`` processes of its own, so the bench's process does not
  compete and httpx's per-request cost (several times this client's) does not cap the
  rate. Its CPU per request is reported, so whether the client or the target limits a row
  can be read from the row.
* Every answer is checked, not only parsed: status 200, the upstream's words as the
  message's content, the upstream's ``usage`` numbers. Anything else is an error, counted
  by kind with the first example; errors are never dropped from the row.
* CPU per request: process-tree utime+stime from ``/proc`` over the window, for the gateway,
  the upstream and the client; ``machine_idle_pct`` is the whole machine's idle share in
  the window (other engineers' work included), so a saturated row reads ~0.

    PYTHONPATH=src .venv/bin/python -m bench.bench_rps [--sweep] [--no-litellm] [--no-portkey]

``--sweep`` measures direct alone at several concurrencies with one and two client
processes: the figures behind ``CONCURRENCY`` and ``CLIENTS``.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import bench_upstreams as bu

ANSWER_TOKENS = 4
#: Connections held open by the client. Direct's requests/s is already flat from 8 to 128
#: (``--sweep``: its upstream's one core is the limit); 64, as in the streamed phases, keeps
#: a slower gateway's queue full too.
CONCURRENCY = 64
#: Client processes: one, since a second one did not raise direct's rate (``--sweep``).
CLIENTS = 1
#: One window per target per round, the targets in turn (see ``run``).
SECONDS = 5.0
ROUNDS = 3
#: Time between starting the clients and the window: their start-up and a warm-up.
LEAD_S = 4.0
#: How long an answer may still take after the window before it counts as an error.
GRACE_S = 10.0
EXPECTED_TEXT = bu.answer_text(ANSWER_TOKENS)
EXPECTED_USAGE = {"prompt_tokens": 5, "completion_tokens": ANSWER_TOKENS,
                  "total_tokens": ANSWER_TOKENS + 5}
BODY = json.dumps({"model": bu.MODEL, "stream": False, "max_tokens": ANSWER_TOKENS,
                   "messages": [{"role": "user", "content": "Say words."}]}).encode()


# -- the client (``--client SPEC``, one process; SPEC is a JSON object) -----------------------


def _request_bytes(host: str, port: int, path: str, headers: dict[str, str]) -> bytes:
    """The one request every connection sends, built once: nothing in it varies."""
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}",
             "Content-Type: application/json", f"Content-Length: {len(BODY)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + BODY


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """(status, body, server will close): Content-Length, chunked, or read-to-close."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head[:-4].split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length, chunked, close = None, False, False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"connection":
            close = b"close" in value.lower()
    if chunked:
        parts = []
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            parts.append((await reader.readexactly(size + 2))[:-2])
        while await reader.readuntil(b"\r\n") != b"\r\n":
            pass  # trailer fields, none expected
        return status, b"".join(parts), close
    if length is None:
        return status, await reader.read(), True
    return status, await reader.readexactly(length), close


def check_answer(status: int, body: bytes) -> str | None:
    """None when the answer is the upstream's, intact; else what is wrong with it."""
    if status != 200:
        return f"HTTP {status}"
    try:
        doc = json.loads(body)
        message = doc["choices"][0]["message"]
        usage = doc["usage"]
    except (ValueError, KeyError, IndexError, TypeError):
        return "not a chat.completion"
    if message.get("content") != EXPECTED_TEXT:
        return "content differs"
    if {k: usage.get(k) for k in EXPECTED_USAGE} != EXPECTED_USAGE:
        return "usage differs"
    return None


class _Tally:
    """What one client process saw inside the window."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.ready_at: float | None = None  # when the first answer (warm-up included) came
        self.errors: dict[str, int] = {}
        self.examples: dict[str, str] = {}

    def error(self, kind: str, example: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        self.examples.setdefault(kind, example[:160])


async def _connection(spec: dict, request: bytes, tally: _Tally) -> None:
    """One keep-alive connection: a request, its answer checked, the next, until the window
    ends; a broken connection is an error and is opened again."""
    start_at, end_at = spec["start_at"], spec["end_at"]
    reader = writer = None
    while time.time() < end_at:
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection(spec["host"], spec["port"])
            t0 = time.perf_counter()
            writer.write(request)
            status, body, close = await _read_response(reader)
            took = time.perf_counter() - t0
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ValueError) as exc:
            if time.time() >= start_at:
                tally.error(f"connection: {type(exc).__name__}", str(exc))
            if writer is not None:
                writer.close()
            reader = writer = None
            await asyncio.sleep(0.01)  # a refused connect must not spin the loop
            continue
        if close:
            writer.close()
            reader = writer = None
        done = time.time()
        tally.ready_at = tally.ready_at or done
        if not start_at <= done <= end_at:
            continue  # warm-up, or finished after the window
        if (wrong := check_answer(status, body)) is None:
            tally.latencies.append(took)
        else:
            tally.error(wrong, body.decode("utf-8", "replace"))
    if writer is not None:
        writer.close()


async def _client(spec: dict) -> dict:
    tally = _Tally()
    request = _request_bytes(spec["host"], spec["port"], spec["path"], spec["headers"])
    tasks = [asyncio.ensure_future(_connection(spec, request, tally))
             for _ in range(spec["connections"])]
    _, stuck = await asyncio.wait(tasks, timeout=spec["end_at"] + GRACE_S - time.time())
    for task in stuck:
        task.cancel()
    if stuck:
        tally.errors["no answer"] = len(stuck)
        tally.examples["no answer"] = f"unanswered {GRACE_S:.0f} s after the window"
    # A client that had no answer before the window opened was still starting or warming
    # up: its figures would not be for the whole window.
    late = tally.ready_at is None or tally.ready_at > spec["start_at"]
    return {"latencies": tally.latencies, "errors": tally.errors,
            "examples": tally.examples, "late": late}


def _client_main(spec_json: str) -> None:
    try:
        import uvloop
        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        print(json.dumps(runner.run(_client(json.loads(spec_json)))))


# -- one window, and the rows -----------------------------------------------------------------


@dataclass
class Target:
    name: str
    port: int
    headers: dict[str, str]
    pid: int | None  # the gateway's process; None for direct


def _idle_ticks() -> tuple[int, int]:
    """(idle, total) jiffies of the whole machine, from the first line of /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return fields[3] + fields[4], sum(fields[:8])


def window(target: Target, up_pid: int, concurrency: int = CONCURRENCY,
           clients: int = CLIENTS) -> dict:
    """Run the clients against ``target`` for one window: what they saw, and the CPU
    seconds of the gateway, the upstream and the clients in it."""
    start_at = time.time() + LEAD_S
    end_at = start_at + SECONDS
    procs = []
    for i in range(clients):
        share = concurrency // clients + (i < concurrency % clients)
        spec = {"host": "127.0.0.1", "port": target.port, "path": "/v1/chat/completions",
                "headers": target.headers, "connections": share, "start_at": start_at,
                "end_at": end_at}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "bench.bench_rps", "--client", json.dumps(spec)],
            cwd=bu.ROOT, stdout=subprocess.PIPE, text=True))
    time.sleep(max(0.0, start_at - time.time()))
    pids = [target.pid, up_pid] + [p.pid for p in procs]
    cpu0 = [bu._cpu_seconds(pid) if pid else 0.0 for pid in pids]
    idle0 = _idle_ticks()
    time.sleep(max(0.0, end_at - time.time()))
    cpu = [bu._cpu_seconds(pid) - c if pid else 0.0 for pid, c in zip(pids, cpu0, strict=True)]
    idle1 = _idle_ticks()
    results = [json.loads(p.communicate()[0]) for p in procs]
    if any(r["late"] for r in results):
        raise RuntimeError(f"{target.name}: a client was not running when the window opened")
    errors, examples = _merge_errors(results)
    return {"latencies": [t for r in results for t in r["latencies"]], "errors": errors,
            "examples": examples, "gateway_cpu": cpu[0], "upstream_cpu": cpu[1],
            "client_cpu": sum(cpu[2:]), "idle": (idle1[0] - idle0[0], idle1[1] - idle0[1]),
            "concurrency": concurrency, "clients": clients}


def _merge_errors(parts: list[dict]) -> tuple[dict[str, int], dict[str, str]]:
    """Error counts by kind summed over ``parts`` (clients, or windows), with the first
    example of each kind."""
    errors: dict[str, int] = {}
    examples: dict[str, str] = {}
    for part in parts:
        for kind, n in part["errors"].items():
            errors[kind] = errors.get(kind, 0) + n
            examples.setdefault(kind, part["examples"][kind])
    return errors, examples


def row(name: str, windows: list[dict], has_gateway: bool) -> dict:
    """One target's row over its windows: requests/s as the median window's, latency
    percentiles and CPU per request over all of them, every error counted."""
    latencies = sorted(t for w in windows for t in w["latencies"])
    ok = len(latencies)
    errors, examples = _merge_errors(windows)
    rates = [len(w["latencies"]) / SECONDS for w in windows]

    def per_request(key: str) -> float | None:
        return round(sum(w[key] for w in windows) / ok * 1e6, 1) if ok else None

    idle = sum(w["idle"][0] for w in windows) / max(1, sum(w["idle"][1] for w in windows))
    return {
        "bench": "rps", "target": name, "concurrency": windows[0]["concurrency"],
        "clients": windows[0]["clients"], "windows": f"{len(windows)} x {SECONDS:g} s",
        "ok": ok, "errors": sum(errors.values()),
        "requests_per_s": round(statistics.median(rates), 1),
        "each_window": " / ".join(f"{r:.0f}" for r in rates),
        "p50_ms": round(latencies[ok // 2] * 1e3, 2) if ok else None,
        "p99_ms": round(latencies[min(ok - 1, int(ok * 0.99))] * 1e3, 2) if ok else None,
        "gateway_cpu_us_per_request": per_request("gateway_cpu") if has_gateway else None,
        "upstream_cpu_us_per_request": per_request("upstream_cpu"),
        "client_cpu_us_per_request": per_request("client_cpu"),
        "machine_idle_pct": round(100 * idle, 1),
        "error_detail": "; ".join(f"{k} x{n}: {examples[k]}" for k, n in errors.items()),
    }


# -- the targets ------------------------------------------------------------------------------


def _tokenwire(up_port: int, procs: list[subprocess.Popen]) -> Target:
    port = bu._free_port()
    # Its concurrency limits above the load, as in the streamed phases: the gateway is
    # measured, not its queue. Twice the connections, not equal to them: an answered
    # request keeps its admission ticket until the app returns, and a saturated gateway
    # gets there late, so a connection's next request finds it still held (/health showed
    # 96 in flight from 64 connections; at a limit of 64 plus the queue of 32, 0.3-0.8 % of
    # requests got 429: BENCHMARKS.md, 2026-12-04).
    proc = bu._start_tokenwire(up_port, port, None, most=2 * CONCURRENCY)
    procs.append(proc)
    return Target("tokenwire (chat)", port, {}, proc.pid)


def _litellm(up_port: int, procs: list[subprocess.Popen], workdir: Path) -> Target:
    port = bu._free_port()
    proc = bu._start_litellm(up_port, port, workdir)
    procs.append(proc)
    auth = {"Authorization": f"Bearer {bu.MASTER_KEY}"}
    bu._wait_http(f"http://127.0.0.1:{port}/v1/models", proc, 180, headers=auth)
    return Target("litellm proxy", port, auth, proc.pid)


def _portkey(up_port: int, procs: list[subprocess.Popen]) -> Target:
    port = bu._free_port()
    proc = bu._start_portkey(port)
    procs.append(proc)
    bu._wait_http(f"http://127.0.0.1:{port}/", proc, 60)
    return Target(bu.PORTKEY_LABEL, port, bu._portkey_headers(up_port), proc.pid)


def run(*, with_litellm: bool = True, with_portkey: bool = True) -> list[dict]:
    """The upstream and every target in front of it at once, then ``ROUNDS`` rounds of one
    window per target: a change in the machine's load (it is shared) falls on every
    target alike, and ``x_direct`` is the median of each round's own ratio."""
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            up, up_port = bu.start_upstream(procs, ANSWER_TOKENS, 0.0)
            targets = [Target("direct", up_port, {}, None), _tokenwire(up_port, procs)]
            if with_litellm:
                targets.append(_litellm(up_port, procs, Path(tmp)))
            if with_portkey:
                targets.append(_portkey(up_port, procs))
            seen: dict[str, list[dict]] = {t.name: [] for t in targets}
            for _ in range(ROUNDS):
                for target in targets:
                    seen[target.name].append(window(target, up.pid))
        finally:
            bu.stop_all(procs)
    rows = [row(t.name, seen[t.name], t.pid is not None) for t in targets]
    direct = seen["direct"]
    for r in rows:
        ratios = [len(w["latencies"]) / max(1, len(d["latencies"]))
                  for w, d in zip(seen[r["target"]], direct, strict=True)]
        r["x_direct"] = round(statistics.median(ratios), 2)
    return rows


def sweep() -> list[dict]:
    """Direct alone at rising concurrency, with one and with two client processes."""
    procs: list[subprocess.Popen] = []
    try:
        up, up_port = bu.start_upstream(procs, ANSWER_TOKENS, 0.0)
        direct = Target("direct", up_port, {}, None)
        return [row("direct", [window(direct, up.pid, concurrency, clients)], False)
                for clients in (1, 2) for concurrency in (8, 16, 32, 64, 128)]
    finally:
        bu.stop_all(procs)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--client":
        _client_main(sys.argv[2])
    else:
        print(f"load average before: {os.getloadavg()}", file=sys.stderr)
        found = sweep() if "--sweep" in sys.argv else run(
            with_litellm="--no-litellm" not in sys.argv,
            with_portkey="--no-portkey" not in sys.argv)
        for row in found:
            print(json.dumps(row))
        print(f"load average after: {os.getloadavg()}", file=sys.stderr)
