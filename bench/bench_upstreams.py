"""Gateway overhead in front of an upstream: tokenwire vs LiteLLM's proxy vs Portkey vs direct.

What is measured (issue 4, "A benchmark"): added latency to the first token, and CPU time
per streamed token of the gateway process, for chat streams at 1 and 64 concurrent streams.

* Upstream: a scripted OpenAI-compatible SSE server (pure ASGI on uvicorn, in its own
  process) that streams ``TOKENS`` one-word chunks at a fixed ``PACE_S``, then the finish
  chunk, a usage chunk and ``[DONE]``; so the gateway, not a model, is what is measured.
* Targets, each a separate process in front of the same upstream: none (``direct``);
  ``tokenwire serve --upstream URL --upstream-max-concurrent 64`` (the real CLI: models
  discovered, the SmolLM2 map found by the HF alias), read as Chat JSON-SSE and as Codec
  msgpack frames (ids retokenized by the gateway), with the default 150 ms coalescing
  window and with ``--coalesce-ms 0``; Codec msgpack again in front of the same upstream
  answering as vLLM does (``owned_by: "vllm"``, ``token_ids`` on each chunk when asked
  with ``return_token_ids``), so the ids come from the upstream and nothing waits for the
  next chunk; LiteLLM's proxy (``litellm --config``), installed in its
  own venv ``.bench-venv-litellm`` (created here if missing: ~50 s, ~750 MB); Portkey's
  open-source gateway (the npm package ``@portkey-ai/gateway``, a bundled Node server run as
  ``node build/start-server.js --headless``), installed with npm into ``.bench-peers/portkey``
  (created here if missing: ~15 s, ~60 MB), pointed at the upstream by its
  ``x-portkey-provider: openai`` and ``x-portkey-custom-host`` headers; its
  ``@hono/node-server`` is overridden to ``PORTKEY_NODE_SERVER`` (why: at that constant).
* TTFT: request sent -> first chunk with content (first frame with ids for msgpack) at the
  client (httpx in this process). Added TTFT = a target's median minus direct's median. At
  1 stream both medians come from a phase of their own in which direct and the target take
  turns, two streams each per round (30 rounds), and the second of each two is the one
  measured: a client streaming through one path, as in a phase of its own, without the
  drift between phases (direct's median moved by up to 0.4 ms between phases a few seconds
  apart on this shared machine, 1.2 vs 1.63 ms in one run). Why the second: a gateway's
  stream right after one of direct's took 0.26-0.28 ms longer than right after one of its
  own, while direct's did not care what came before it (BENCHMARKS.md, "Session of
  2026-12-05 (5)"), so one stream each in turn charged the gateway for the switch. The
  first streams give ``added_ttft_cross_p50_ms``: each measured right after the other's.
* CPU per token: the gateway's process tree's utime+stime from ``/proc/<pid>/stat`` before
  and after a phase, divided by the content chunks the clients received. The upstream's own
  CPU is read the same way in the same phase, so ``cpu_x_upstream`` (gateway CPU / upstream
  CPU for the same streams) is a ratio within one phase, whatever the machine's load.
* Throughput: content chunks per second of wall time over a phase; ``x_direct`` divides it
  by direct's at the same concurrency.
* Then short non-streamed chats per second at saturation, the same targets in front of an
  unpaced upstream: :mod:`bench.bench_rps` (``--no-rps`` skips it).

The machine is small and shared, so numbers are indicative; one run, no retries.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
LITELLM_VENV = ROOT / ".bench-venv-litellm"
#: Peers installed from npm (ignored by git, like the LiteLLM venv).
PEERS_DIR = ROOT / ".bench-peers"
#: Pinned so a rerun measures the same gateway (the latest release when this was written).
PORTKEY_VERSION = "1.15.2"
#: Portkey's HTTP server, pinned over the 1.19.x its ``^1.3.3`` range resolves to (npm
#: ``overrides``). From 1.14.2 on, the 1.x line's ``new Response(stream, fetchedResponse)``
#: keeps the fetched response's immutable ``Headers``; Portkey answers a stream with such a
#: Response (a non-streamed answer is rebuilt on the way) and its ``updateHeaders`` throws
#: on the first ``append``: HTTP 500 on every streamed chat (Portkey issue #1389). 2.x
#: copies the headers (node-server PR #382). Portkey itself is unmodified.
PORTKEY_NODE_SERVER = "2.1.11"
PORTKEY_LABEL = f"portkey gateway {PORTKEY_VERSION} (@hono/node-server {PORTKEY_NODE_SERVER})"
MODEL = "HuggingFaceTB/SmolLM2-135M"  # an HF alias, so tokenwire finds the bundled map
TOKENS = 64
PACE_S = 0.005
#: (concurrency, rounds): sequential streams at 1, waves of concurrent streams at 64.
LOADS = ((1, 30), (64, 3))
MASTER_KEY = "sk-bench-master-key-0001"
_CLK_TCK = os.sysconf("SC_CLK_TCK")

NOTES = """
How to read it. Each target is its own process in front of the same scripted upstream
(asyncio + h11, `json.dumps` per chunk); the client is httpx in the bench's process. Read
**ratios within one phase**: `cpu_x_upstream` is the target's CPU over the upstream's CPU for
the same streams (issue 15 aims at <= 1.5 at 1 and 64 streams), `x_direct` is throughput
over direct's at the same concurrency (aim >= 0.95 at 64), `added_ttft_p50_ms` the median
time to first content minus direct's (aim <= 1 ms at 1 stream; there direct and the target
take turns, two streams each, in a phase of their own, and the second of each two counts:
`direct_ttft_p50_ms` and `ttft_p50_ms`; `added_ttft_cross_p50_ms` is the same from the
first of each two, so each right after the other's stream).
The Codec rows over a text-only upstream wait for each word's end before its ids are final
(one chunk, 5 ms here); the row "ids from the upstream" is the same Codec stream when the
upstream sends ids, as vLLM does. At 64 streams the client, the upstream and the target
share 2 cores, so added TTFT there is mostly queueing for the CPU. A row with `failed` is a
peer that could not stream here, with its answer. "The hot path (issue 15)" below says
what the profile showed and what changed.

The `rps` table: short non-streamed chats (4 words) at saturation, 64 connections from one
lean client process, three rounds of a 5 s window per target in turn (`requests_per_s` the
median window, `x_direct` the median of each round's ratio), every answer checked (status,
content, usage); `errors` counts the rest, `error_detail` says what they were. The upstream
there is not paced and answers a non-streamed request as JSON; tokenwire asks it for a
stream (it always does), so `upstream_cpu_us_per_request` differs by target.
`machine_idle_pct` near 0 means the 2 cores were saturated (other engineers' work included).
"""


# -- the scripted upstream (own process: ``--serve-upstream PORT TOKENS PACE_S [ids]``) -----


def upstream_app(tokens: int = TOKENS, pace_s: float = PACE_S,
                 word_ids: list[list[int]] | None = None):
    """A pure-ASGI OpenAI chat server: ``tokens`` word chunks, ``pace_s`` apart; or, to a
    request that does not ask for a stream, the same words at once as one chat.completion.
    With ``word_ids`` (each word's token ids) it answers as vLLM: ``owned_by: "vllm"``, and
    ``token_ids`` on each chunk of a request with ``return_token_ids``."""
    models = json.dumps({"object": "list", "data": [
        {"id": MODEL, "object": "model",
         "owned_by": "scripted" if word_ids is None else "vllm"}]}).encode()
    usage = {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": tokens + 5}

    def chunk(delta: dict, finish: str | None, model: str,
              ids: list[int] | None = None) -> bytes:
        choice: dict = {"index": 0, "delta": delta, "finish_reason": finish}
        if ids is not None:
            choice["token_ids"] = ids
        return b"data: " + json.dumps({
            "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0,
            "model": model, "choices": [choice]}).encode() + b"\n\n"

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        if scope["method"] == "GET":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": models})
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        request = json.loads(body)
        model = request.get("model", MODEL)
        if not request.get("stream"):
            await send_completion(send, model)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        with_ids = word_ids is not None and request.get("return_token_ids") is True
        out = [chunk({"role": "assistant", "content": ""}, None, model,
                     [] if with_ids else None)]
        for i in range(tokens):
            out.append(chunk({"content": f" word{i % 10}"}, None, model,
                             word_ids[i % 10] if with_ids else None))  # type: ignore[index]
            await send({"type": "http.response.body", "body": b"".join(out),
                        "more_body": True})
            out = []
            await asyncio.sleep(pace_s)
        tail = chunk({}, "stop", model) + b"data: " + json.dumps({
            "id": "chatcmpl-1", "object": "chat.completion.chunk", "model": model,
            "choices": [], "usage": usage}).encode()
        await send({"type": "http.response.body",
                    "body": tail + b"\n\ndata: [DONE]\n\n", "more_body": False})

    async def send_completion(send, model: str) -> None:
        # No pacing: a non-streamed answer is the whole text at once, as a server that has
        # finished generating sends it.
        body = json.dumps({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {
                "role": "assistant", "content": answer_text(tokens)}}],
            "usage": usage}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return app


def _word_ids() -> list[list[int]]:
    """SmolLM2's ids of " word0" ... " word9" (the bundled map, as the gateway has it)."""
    from tokenwire.codec.maps import bundled_map_path, load_map_file
    from tokenwire.gateway.retokenize import tokenizer_for

    tokenizer = tokenizer_for(load_map_file(bundled_map_path("huggingfacetb/smollm2")))
    return [list(tokenizer.encode(f" word{i}")) for i in range(10)]


def answer_text(tokens: int) -> str:
    """The text of a whole answer of ``tokens`` words, streamed or not."""
    return "".join(f" word{i % 10}" for i in range(tokens))


# -- processes -------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, timeout: float, headers=None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:3]} exited with {proc.returncode}")
        try:
            if httpx.get(url, headers=headers, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not come up in {timeout:.0f} s")


def start_upstream(procs: list[subprocess.Popen], tokens: int = TOKENS,
                   pace_s: float = PACE_S, *, ids: bool = False,
                   ) -> tuple[subprocess.Popen, int]:
    """This module's scripted upstream, streaming ``tokens`` chunks per answer ``pace_s``
    apart, in its own process on a free port (appended to ``procs``), once it answers
    ``/v1/models``: the process and its port. ``ids``: it answers as vLLM, with ids."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve-upstream", str(port),
                             str(tokens), str(pace_s), *(["ids"] if ids else [])])
    procs.append(proc)
    _wait_http(f"http://127.0.0.1:{port}/v1/models", proc, 30)
    return proc, port


def stop_all(procs: list[subprocess.Popen]) -> None:
    """Stop what a bench started: SIGTERM to each still running, newest first, then SIGKILL
    to any that has not exited 15 s later."""
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()


def _cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and its descendants (threads are counted in the process)."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2:].split()
        stats[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _CLK_TCK)
    tree, total, frontier = {pid}, 0.0, [pid]
    while frontier:
        parent = frontier.pop()
        for child, (ppid, _) in stats.items():
            if ppid == parent and child not in tree:
                tree.add(child)
                frontier.append(child)
    for p in tree:
        total += stats.get(p, (0, 0.0))[1]
    return total


def ensure_litellm() -> Path:
    """The ``litellm`` executable in its own venv (never the project's .venv)."""
    exe = LITELLM_VENV / "bin" / "litellm"
    if not exe.exists():
        subprocess.run(["python3", "-m", "venv",
                        str(LITELLM_VENV)], check=True)
        subprocess.run([str(LITELLM_VENV / "bin" / "pip"), "install", "-q", "litellm[proxy]"],
                       check=True)
    return exe


def _start_litellm(up_port: int, port: int, workdir: Path) -> subprocess.Popen:
    cfg = workdir / "litellm.yaml"
    cfg.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: http://127.0.0.1:{up_port}/v1\n"
        "      api_key: sk-upstream\n"
        "general_settings:\n"
        f"  master_key: {MASTER_KEY}\n")
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
    return subprocess.Popen([str(ensure_litellm()), "--config", str(cfg), "--host",
                             "127.0.0.1", "--port", str(port)], env=env, cwd=workdir,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def ensure_portkey() -> Path:
    """Portkey's ``start-server.js``, installed with npm into ``.bench-peers/portkey``, its
    ``@hono/node-server`` overridden to ``PORTKEY_NODE_SERVER``."""
    prefix = PEERS_DIR / "portkey"
    script = prefix / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"
    stamp = prefix / f".installed-{PORTKEY_VERSION}-{PORTKEY_NODE_SERVER}"
    if not (script.exists() and stamp.exists()):
        prefix.mkdir(parents=True, exist_ok=True)
        # npm reads overrides only from the root package.json, so the folder gets one.
        (prefix / "package.json").write_text(json.dumps({
            "name": "bench-portkey", "private": True,
            "dependencies": {"@portkey-ai/gateway": PORTKEY_VERSION},
            "overrides": {"@hono/node-server": PORTKEY_NODE_SERVER}}, indent=2) + "\n")
        subprocess.run(["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
                        "--loglevel=error"], check=True)
        for old in prefix.glob(".installed-*"):
            old.unlink()
        stamp.touch()
    return script


def _start_portkey(port: int) -> subprocess.Popen:
    # --headless: no console UI; NODE_ENV=production as deployed (no dev-only logging).
    env = {**os.environ, "NODE_ENV": "production"}
    return subprocess.Popen(["node", str(ensure_portkey()), f"--port={port}", "--headless"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _portkey_headers(up_port: int) -> dict[str, str]:
    """Portkey routes by headers: OpenAI's provider at our upstream (127.0.0.1 is among
    its default trusted custom hosts), the upstream's key as the bearer token."""
    return {"x-portkey-provider": "openai",
            "x-portkey-custom-host": f"http://127.0.0.1:{up_port}/v1",
            "Authorization": "Bearer sk-upstream"}


# -- the client ------------------------------------------------------------------------------


async def _one_stream(client: httpx.AsyncClient, url: str, fmt: str | None,
                      headers: dict[str, str]) -> tuple[float, int]:
    """(seconds to the first content, content chunks or frames with ids)."""
    body: dict = {"model": MODEL, "stream": True, "max_tokens": TOKENS,
                  "messages": [{"role": "user", "content": "Say words."}]}
    if fmt is not None:
        body["stream_format"] = fmt
    t0 = time.perf_counter()
    first, count = None, 0
    async with client.stream("POST", url, json=body, headers=headers) as r:
        if r.status_code >= 400:
            await r.aread()  # so the failure row can quote the body
        r.raise_for_status()
        if fmt == "msgpack":
            from tokenwire.codec.frames_msgpack import FrameDecoder

            dec = FrameDecoder()
            async for data in r.aiter_bytes():
                for f in dec.feed(data):
                    if f.ids:
                        first = first or time.perf_counter()
                        count += 1
        else:
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                choices = json.loads(line[6:]).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):
                    first = first or time.perf_counter()
                    count += 1
    return (first or time.perf_counter()) - t0, count


async def _phase(url: str, fmt: str | None, headers: dict[str, str], concurrency: int,
                 rounds: int) -> tuple[list[float], int]:
    # Idle connections expire before the targets' keep-alive timeout (uvicorn's 5 s, which
    # is also httpx's default expiry): reusing one the server is closing at that moment
    # fails the request with a ReadError, a race of the client, not of the target.
    limits = httpx.Limits(max_connections=concurrency + 4, keepalive_expiry=2.0)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        ttfts, tokens = [], 0
        for _ in range(rounds):
            results = await asyncio.gather(*(_one_stream(client, url, fmt, headers)
                                             for _ in range(concurrency)))
            ttfts += [t for t, _ in results]
            tokens += sum(n for _, n in results)
    return ttfts, tokens


async def _in_turns(direct: str, url: str, fmt: str | None, headers: dict[str, str],
                    rounds: int) -> dict[str, list[float]]:
    """One stream at a time, two of direct's then two of the target's, ``rounds`` times:
    times to first content of each kind's second stream (``direct``, ``target``: each after
    one of its own kind) and first (``direct_cross``, ``target_cross``: each right after
    the other's; the first round's direct one after nothing, so it is left out)."""
    limits = httpx.Limits(max_connections=4, keepalive_expiry=2.0)  # see _phase
    out: dict[str, list[float]] = {"direct": [], "target": [], "direct_cross": [],
                                   "target_cross": []}
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        for i in range(rounds):
            first = (await _one_stream(client, direct, None, {}))[0]
            if i:
                out["direct_cross"].append(first)
            out["direct"].append((await _one_stream(client, direct, None, {}))[0])
            out["target_cross"].append((await _one_stream(client, url, fmt, headers))[0])
            out["target"].append((await _one_stream(client, url, fmt, headers))[0])
    return out


def _measure(target: str, base: str, pid: int | None, fmt: str | None,
             headers: dict[str, str], up_pid: int, direct: str | None = None) -> list[dict]:
    """A target's rows; ``direct`` (the upstream's base URL): at 1 stream the TTFT columns
    come from :func:`_in_turns` with direct's streams (``direct_ttft_p50_ms``), the CPU and
    throughput from the target's own phase."""
    rows = []
    url = base + "/v1/chat/completions"
    asyncio.run(_phase(url, fmt, headers, 1, 3))  # warm-up (connections, imports, caches)
    for concurrency, rounds in LOADS:
        turns = None
        if direct is not None and concurrency == 1:
            turns = asyncio.run(_in_turns(direct + "/v1/chat/completions", url, fmt, headers,
                                          rounds))
        cpu0 = _cpu_seconds(pid) if pid else 0.0
        up0 = _cpu_seconds(up_pid)
        t0 = time.perf_counter()
        ttfts, tokens = asyncio.run(_phase(url, fmt, headers, concurrency, rounds))
        wall = time.perf_counter() - t0
        cpu = (_cpu_seconds(pid) - cpu0) if pid else None
        up_cpu = _cpu_seconds(up_pid) - up0
        rows.append({
            "bench": "upstreams", "target": target, "concurrency": concurrency,
            "streams": len(ttfts), "ttft_p50_ms": round(statistics.median(ttfts) * 1e3, 2),
            "ttft_p90_ms": round(sorted(ttfts)[int(0.9 * (len(ttfts) - 1))] * 1e3, 2),
            "tokens": tokens, "tokens_per_s": round(tokens / wall, 1),
            "gateway_cpu_us_per_token": round(cpu / tokens * 1e6, 1) if cpu is not None
            else None,
            "upstream_cpu_us_per_token": round(up_cpu / tokens * 1e6, 1),
            "cpu_x_upstream": round(cpu / up_cpu, 2) if cpu is not None and up_cpu > 0
            else None,
        })
        # (columns of every row: one table)
        rows[-1].update(direct_ttft_p50_ms=None, added_ttft_cross_p50_ms=None)
        if turns is not None:  # the TTFT columns from the turns, not the phase above
            during = turns["target"]
            rows[-1].update(
                ttft_p50_ms=round(statistics.median(during) * 1e3, 2),
                ttft_p90_ms=round(sorted(during)[int(0.9 * (len(during) - 1))] * 1e3, 2),
                direct_ttft_p50_ms=round(statistics.median(turns["direct"]) * 1e3, 2),
                added_ttft_cross_p50_ms=round((statistics.median(turns["target_cross"])
                                               - statistics.median(turns["direct_cross"]))
                                              * 1e3, 2))
    return rows


def _added(rows: list[dict]) -> None:
    direct = {r["concurrency"]: r for r in rows if r["target"] == "direct"}
    for r in rows:
        if "failed" in r:
            continue
        base = direct[r["concurrency"]]
        r["added_ttft_p50_ms"] = round(
            r["ttft_p50_ms"] - (r.get("direct_ttft_p50_ms") or base["ttft_p50_ms"]), 2)
        r["x_direct"] = round(r["tokens_per_s"] / base["tokens_per_s"], 2)


def run(*, with_litellm: bool = True, with_portkey: bool = True,
        with_rps: bool = True) -> list[dict]:
    """Start the upstream, tokenwire, LiteLLM and Portkey; measure each; stop them all.
    Then (``with_rps``) short non-streamed requests per second, :mod:`bench.bench_rps`."""
    procs: list[subprocess.Popen] = []
    tw_port = _free_port()
    try:
        up, up_port = start_upstream(procs)
        direct = f"http://127.0.0.1:{up_port}"
        rows = _measure("direct", direct, None, None, {}, up.pid)
        codec = {"Codec-Client-Version": "0.5"}
        for label, window_ms in (("", None), (", --coalesce-ms 0", 0)):
            tw = _start_tokenwire(up_port, tw_port, window_ms)
            procs.append(tw)
            tw_base = f"http://127.0.0.1:{tw_port}"
            rows += _measure(f"tokenwire (chat SSE{label})", tw_base, tw.pid, None, {},
                             up.pid, direct)
            rows += _measure(f"tokenwire (Codec msgpack{label})", tw_base, tw.pid, "msgpack",
                             codec, up.pid, direct)
            tw.terminate()
            tw.wait(15)
        # The same Codec stream when the upstream sends the ids (vLLM's return_token_ids).
        ids_up, ids_port = start_upstream(procs, ids=True)
        tw = _start_tokenwire(ids_port, tw_port, None)
        procs.append(tw)
        rows += _measure("tokenwire (Codec msgpack, ids from the upstream)",
                         f"http://127.0.0.1:{tw_port}", tw.pid, "msgpack", codec, ids_up.pid,
                         f"http://127.0.0.1:{ids_port}")
        for proc in (tw, ids_up):
            proc.terminate()
            proc.wait(15)
        if with_litellm:
            rows += _litellm_rows(up_port, up.pid, procs)
        if with_portkey:
            rows += _portkey_rows(up_port, up.pid, procs)
        _added(rows)
    finally:
        stop_all(procs)
    if with_rps:
        from bench import bench_rps  # imported here: it imports this module for its helpers

        rows += bench_rps.run(with_litellm=with_litellm, with_portkey=with_portkey)
    return rows


def _start_tokenwire(up_port: int, port: int, window_ms: float | None,
                     most: int = max(c for c, _ in LOADS)) -> subprocess.Popen:
    # The gateway's and the upstream's concurrency limits are raised to the load (``most``
    # requests at once): the gateway is measured, not its queue (the default of 4 in flight
    # would serialise 64 streams into 16 waves). The request log (one JSON line each) stays
    # on, as deployed.
    argv = [sys.executable, "-m", "tokenwire.cli.main", "serve", "--upstream",
            f"http://127.0.0.1:{up_port}/v1", "--upstream-max-concurrent", str(most),
            "--max-concurrent", str(most), "--port", str(port), "--log-level", "warning"]
    if window_ms is not None:
        argv += ["--coalesce-ms", str(window_ms)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_http(f"http://127.0.0.1:{port}/health", proc, 60)
    return proc


def _litellm_rows(up_port: int, up_pid: int, procs: list[subprocess.Popen]) -> list[dict]:
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        proc = _start_litellm(up_port, port, Path(tmp))
        procs.append(proc)
        auth = {"Authorization": f"Bearer {MASTER_KEY}"}
        _wait_http(f"http://127.0.0.1:{port}/v1/models", proc, 180, headers=auth)
        return _measure("litellm proxy", f"http://127.0.0.1:{port}", proc.pid, None, auth,
                        up_pid, f"http://127.0.0.1:{up_port}")


def _portkey_rows(up_port: int, up_pid: int, procs: list[subprocess.Popen]) -> list[dict]:
    port = _free_port()
    proc = _start_portkey(port)
    procs.append(proc)
    _wait_http(f"http://127.0.0.1:{port}/", proc, 60)
    target = PORTKEY_LABEL
    try:
        return _measure(target, f"http://127.0.0.1:{port}", proc.pid, None,
                        _portkey_headers(up_port), up_pid, f"http://127.0.0.1:{up_port}")
    except httpx.HTTPStatusError as exc:
        # A peer that cannot stream here is a finding, recorded as such (not a crash of
        # the whole run): its status and body say why.
        return [{"bench": "upstreams", "target": target, "failed": f"HTTP "
                 f"{exc.response.status_code}: {exc.response.text[:120]}"}]


def _serve_upstream(port: int, tokens: int, pace_s: float, ids: bool = False) -> None:
    import uvicorn

    # The reference stays what the aims were set against: asyncio's loop and h11, whatever
    # is installed (uvicorn's "auto" would pick uvloop/httptools and move the baseline).
    uvicorn.run(upstream_app(tokens, pace_s, _word_ids() if ids else None), host="127.0.0.1",
                port=port, log_level="warning",
                lifespan="off", access_log=False, loop="asyncio", http="h11")


if __name__ == "__main__":
    if len(sys.argv) in (5, 6) and sys.argv[1] == "--serve-upstream":
        _serve_upstream(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]),
                        ids=sys.argv[5:] == ["ids"])
    else:
        for row in run(with_litellm="--no-litellm" not in sys.argv,
                       with_portkey="--no-portkey" not in sys.argv,
                       with_rps="--no-rps" not in sys.argv):
            print(json.dumps(row))
