"""Prefix-cache affinity (issue 13): time to first token of multi-turn conversations against
three real llama.cpp replicas, routed by affinity, round-robin and at random, in one run.

* Replicas: three ``python -m llama_cpp.server`` (``.venv-peers``), SmolLM2-135M, one thread
  each, configured as a user chasing prefix-cache hits would, the same for every mode
  (:data:`REPLICA_FLAGS`): the server keeps one context and reuses the longest common
  prefix of the last prompt it evaluated (``Llama.generate``: "prefix-match hit"); with
  several conversations per replica that prefix is usually another conversation's, so
  ``--cache True --cache_type ram --cache_size`` :data:`CACHE_BYTES` keeps every saved
  prompt state in RAM (``LlamaRAMCache``: after each completion the state of prompt +
  completion is saved; a new prompt reloads the saved state with the longest common prefix
  when it beats the context's own) — room for every conversation of a mode, so no mode
  loses a state to eviction. ``--logits_all False``: the server's default ``True`` computes
  a logit row for every prompt token and the cache copies those rows (196 KB a token,
  uncounted by ``cache_size``) with every saved state; nothing here asks for logprobs.
  ``--interrupt_requests False``: requests queue at a replica instead of cutting each other
  off. **Every mode starts three fresh replicas** (empty caches), so no mode inherits
  another's states, and each replica answers one throwaway request first (:func:`_warm`).
* Workload (the issue's): ``CONVERSATIONS`` (8) conversations of ``TURNS`` (6) turns, all
  open at once, each turn after the previous answer, with at most ``CONCURRENCY`` requests
  in flight (default: one per replica). Every conversation opens with its own long document
  (about ``DOC_TOKENS`` tokens, the prefix every later turn shares), so a turn is cheap only
  on a replica that holds that conversation's state.
* Why the cap: each replica generates one request at a time, so with every conversation in
  flight at once (8 on 3 replicas) the time to first token is mostly the wait in a
  replica's own queue, and the prefill the cache saves is lost in it (the first runs in
  BENCHMARKS.md: 1.03x). ``BENCH_AFFINITY_CONCURRENCY=0`` restores the uncapped run.
* Modes: ``affinity``: one ``tokenwire serve`` pool over the three, each conversation sending
  its ``session-id`` (rendezvous hashing with bounded loads, the default
  ``affinity_load_factor`` and ``affinity_load_slack``); ``affinity-no-slack``: the same
  with ``affinity_load_slack = 0`` (the bound alone); ``affinity-unbounded``: the same with
  ``affinity_load_factor = false`` (plain rendezvous); ``least-loaded``: the pool without
  a key (power of two choices); ``round-robin`` and ``random``: the client spreads turns
  over the replicas' URLs directly (what a gateway without affinity does).
* TTFT: request sent -> first content chunk, streamed Chat, at the client (from when the
  request left the client's cap, not while it waited for it); p50/p90 over every turn, and
  over turns 2..N (the first turn is cold in every mode). Beside them, from the replicas'
  own logs (``llama_perf_context_print``), the prompt tokens each mode had to evaluate
  (prefilled, not reloaded from a cached state) and the turns each replica served.

The machine is small and shared: note the load beside the numbers (BENCHMARKS.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PEERS_PY = ROOT / ".venv-peers" / "bin" / "python"
CONVERSATIONS = int(os.environ.get("BENCH_AFFINITY_CONVERSATIONS", "8"))
TURNS = int(os.environ.get("BENCH_AFFINITY_TURNS", "6"))
DOC_TOKENS = int(os.environ.get("BENCH_AFFINITY_DOC_TOKENS", "400"))
#: Requests in flight at once from the client (0: every conversation at once).
CONCURRENCY = int(os.environ.get("BENCH_AFFINITY_CONCURRENCY", "3"))
MAX_TOKENS = 8
N_CTX = 1024
#: Counted by LlamaRAMCache as the llama.cpp state only (~23 KB of KV per token for
#: SmolLM2-135M): one saved state per turn, every turn of every conversation of a mode, on
#: one replica if need be (8 x 6 x ~600 tokens x 23 KB = 660 MB), so nothing is evicted.
#: ``BENCH_AFFINITY_CACHE_MB`` sizes it otherwise: e.g. 64 holds about 4 saved states of
#: ~600 tokens, one replica's share of the conversations (8 on 3) rather than all of them,
#: the memory a pool has when its replicas' caches are sized for their share.
CACHE_BYTES = int(os.environ.get("BENCH_AFFINITY_CACHE_MB", "1024")) << 20
REPLICA_FLAGS = ("--n_threads", "1", "--cache", "True", "--cache_type", "ram",
                 "--cache_size", str(CACHE_BYTES), "--logits_all", "False",
                 "--interrupt_requests", "False")
START_TIMEOUT_S = 300.0
REPLICA_LIMIT = 3
MODES = tuple(os.environ.get("BENCH_AFFINITY_MODES",
                           "affinity,affinity-no-slack,round-robin,random").split(","))
#: The pool's affinity settings per gateway mode (empty: the defaults).
_GATEWAY_MODES = {"affinity": "", "affinity-no-slack": "affinity_load_slack = 0\n",
                "affinity-unbounded": "affinity_load_factor = false\n", "least-loaded": ""}

_WORDS = ("river stone lantern orchard copper meadow harbor violet summit thunder ember "
          "willow canyon marble falcon glacier").split()
_PERF = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _document(seed: str) -> str:
    rng = random.Random(seed)
    # ~1.3 tokens per word for these words: DOC_TOKENS / 1.3 words
    words = [rng.choice(_WORDS) for _ in range(int(DOC_TOKENS / 1.3))]
    return f"Document {seed}: " + " ".join(words)


def _start_replica(tmp: Path, i: int) -> tuple[subprocess.Popen[bytes], str]:
    from tokenwire.gguf_tokenizer import smollm2_gguf_path

    port = _free_port()
    with (tmp / f"replica{i}.log").open("wb") as log:
        proc = subprocess.Popen(
            [str(PEERS_PY), "-m", "llama_cpp.server", "--host", "127.0.0.1", "--port",
             str(port), "--model", str(smollm2_gguf_path()), "--n_ctx", str(N_CTX),
             *REPLICA_FLAGS], stdout=log, stderr=log)
    return proc, f"http://127.0.0.1:{port}/v1"


def _wait(url: str, proc: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited")
        try:
            return httpx.get(url + "/models", timeout=2).json()["data"][0]["id"]
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not start") from None
            time.sleep(0.3)


def _warm(url: str, model: str) -> None:
    """One throwaway request of ~150 prompt tokens: a replica's first prompt batch of more
    than a few dozen tokens costs 20-30 s more than later ones in trial runs (llama.cpp's
    batched kernels' first use), which would fall on whichever mode's first turn met it."""
    body = {"model": model, "max_tokens": 1, "messages": [
        {"role": "user", "content": "Warm up: " + " ".join(_WORDS * 7)}]}
    httpx.post(url + "/chat/completions", json=body, timeout=START_TIMEOUT_S
               ).raise_for_status()


def _start_gateway(tmp: Path, urls: list[str], model: str, bound: str
                   ) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    rows = ",\n".join(f'  {{ base_url = "{u}" }}' for u in urls)
    cfg = tmp / "pool.toml"
    cfg.write_text(f"""[server]
port = {port}
[[upstreams]]
name = "llama"
kind = "openai"
max_concurrent = {REPLICA_LIMIT}
{bound}replicas = [
{rows}
]
[[upstreams.models]]
name = "smollm2"
upstream_model = "{model}"
""")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOKENWIRE_", "CODEC_"))}
    env["PYTHONPATH"] = str(ROOT / "src")
    with (tmp / "gateway.log").open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tokenwire.cli.main", "serve",
                                 "--config", str(cfg), "--request-log", "off",
                                 "--max-concurrent", "64"], stdout=log, stderr=log, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url + "/v1"
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("tokenwire serve did not start: "
                               + (tmp / "gateway.log").read_text()[-2000:])
        time.sleep(0.2)


async def _ttft(client: httpx.AsyncClient, url: str, model: str, messages: list[dict],
                headers: dict[str, str]) -> tuple[float, str]:
    body = {"model": model, "messages": messages, "stream": True, "max_tokens": MAX_TOKENS,
            "temperature": 0}
    started = time.perf_counter()
    first, text = None, ""
    async with client.stream("POST", url + "/chat/completions", json=body,
                             headers=headers) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            delta = (chunk.get("choices") or [{}])[0].get("delta", {}).get("content")
            if delta:
                first = first or time.perf_counter()
                text += delta
    return (first or time.perf_counter()) - started, text


async def _mode(mode: str, gateway: str, replicas: list[str], model: str) -> list[tuple[int,
                                                                                     float]]:
    """(turn, ttft) for every turn of every conversation in ``mode``."""
    rng = random.Random(mode)
    counter = iter(range(10**9))
    out: list[tuple[int, float]] = []
    cap = asyncio.Semaphore(CONCURRENCY or CONVERSATIONS)

    async def conversation(c: int, client: httpx.AsyncClient) -> None:
        # The same documents and keys in every mode (fresh replicas each time): the modes
        # differ only in where each turn goes.
        messages = [{"role": "system", "content": _document(f"conv-{c}")}]
        for turn in range(1, TURNS + 1):
            messages.append({"role": "user", "content": f"Question {turn}: name a word "
                                                        f"from the document."})
            if mode in _GATEWAY_MODES:
                url = gateway
                headers = {} if mode == "least-loaded" else {"session-id": f"conv-{c}"}
                name = "smollm2"
            else:
                i = next(counter) % 3 if mode == "round-robin" else rng.randrange(3)
                url, headers, name = replicas[i], {}, model
            async with cap:
                ttft, text = await _ttft(client, url, name, messages, headers)
            out.append((turn, ttft))
            # one line per turn as it ends: a run stopped early still has its samples
            print(json.dumps({"mode": mode, "conversation": c, "turn": turn,
                              "ttft_s": round(ttft, 3)}), file=sys.stderr, flush=True)
            messages.append({"role": "assistant", "content": text})

    async with httpx.AsyncClient(timeout=600) as client:
        await asyncio.gather(*(conversation(c, client) for c in range(CONVERSATIONS)))
    return out


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] \
        if len(values) > 1 else values[0]


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()


def _prefill(logs: list[Path]) -> dict[str, object]:
    """What the replicas' logs say about a mode: prompt tokens evaluated (not reloaded from
    a saved state) per request, and the requests each replica served."""
    per_replica, tokens, ms = [], [], 0.0
    for log in logs:
        found = _PERF.findall(log.read_text(errors="replace"))[1:]  # not the warm-up
        per_replica.append(len(found))
        tokens += [int(n) for _, n in found]
        ms += sum(float(t) for t, _ in found)
    return {"requests per replica": "/".join(map(str, per_replica)),
            "prefilled tokens / turn": round(statistics.mean(tokens)) if tokens else 0,
            "prefill s / turn": round(ms / 1000 / max(1, len(tokens)), 2)}


def _one_mode(tmp: Path, mode: str) -> dict[str, object]:
    """Fresh replicas (and a gateway when the mode routes through one), the mode's turns,
    its row."""
    where = tmp / mode
    where.mkdir()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        started = [_start_replica(where, i) for i in range(3)]
        procs += [p for p, _ in started]
        urls = [u for _, u in started]
        models = [_wait(u, p) for p, u in started]  # every replica ready
        model = models[0]
        for u in urls:  # not what any mode measures
            _warm(u, model)
        gateway = ""
        if mode in _GATEWAY_MODES:
            gw, gateway = _start_gateway(where, urls, model, _GATEWAY_MODES[mode])
            procs.append(gw)
        load = os.getloadavg()[0]
        t0 = time.monotonic()
        samples = asyncio.run(_mode(mode, gateway, urls, model))
        wall = time.monotonic() - t0
    finally:
        _stop(procs)
    every = [t for _, t in samples]
    warm = [t for turn, t in samples if turn > 1]
    return {"routing": mode, "turns": len(every),
            "p50 TTFT s": _pct(every, 50), "p90 TTFT s": _pct(every, 90),
            "p50 turns 2+ s": _pct(warm, 50), "p90 turns 2+ s": _pct(warm, 90),
            **_prefill([where / f"replica{i}.log" for i in range(3)]),
            "wall s": round(wall), "load (1 min) at start / end":
                f"{load:.1f} / {os.getloadavg()[0]:.1f}"}


def run() -> list[dict]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-affinity-"))
    print(f"logs in {tmp}", file=sys.stderr)
    rows = []
    for mode in MODES:
        rows.append(_one_mode(tmp, mode))
        print(rows[-1], file=sys.stderr, flush=True)
    base = next((r for r in rows if r["routing"] == "round-robin"), None)
    for r in rows if base is not None else ():
        r["p50 vs round-robin"] = f"{base['p50 TTFT s'] / r['p50 TTFT s']:.2f}x lower"
        r["p50 turns 2+ vs round-robin"] = (
            f"{base['p50 turns 2+ s'] / r['p50 turns 2+ s']:.2f}x lower")
    return rows


NOTES = f"""
{CONVERSATIONS} conversations x {TURNS} turns, at most {CONCURRENCY or CONVERSATIONS} requests
in flight, each opening with its own ~{DOC_TOKENS}-token document, against three
`python -m llama_cpp.server` replicas (SmolLM2-135M, one thread, RAM prompt cache for
every state). `affinity`: tokenwire pool with a `session-id` per conversation (bounded
loads and their slack); `affinity-no-slack`: the bound alone; `affinity-unbounded`: plain
rendezvous; `least-loaded`: the same pool without a key;
`round-robin` / `random`: the client spreads turns over the replicas directly. Fresh
replicas for every mode.
"""

if __name__ == "__main__":
    for row in run():
        print(row)
