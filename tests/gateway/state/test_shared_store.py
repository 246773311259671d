"""Three ``tokenwire serve`` processes on one real ``redis-server`` (issue 16).

Each instance is its own process (its own memory, pins, connection); what they share is the
Redis. In front of them a pool of two recording upstreams (``conftest.EchoUpstream``), so a
test reads exactly what conversation each turn carried and which replica answered it.

- A Responses conversation through the ``openai`` SDK, every turn on another instance and
  with no pause between turns: each turn's upstream input is the whole conversation, every
  continuation lands on the replica that produced its predecessor, and any instance reads a
  response back by id.
- The Redis round trips of each kind of request, counted at the server (``MONITOR``) and by
  the client (``tokenwire_state_calls_total``).
- A byte cap: a response over it is served, not stored, and says so.
- Faults: Redis SIGKILLed in the middle of a load run (every request still answered;
  ``/health`` and ``/metrics`` say degraded, one log line per instance; a continuation gets
  503 ``store_unavailable``, never a wrong conversation), then started again on its data:
  recovery without a gateway restart, the responses stored before the kill read back by id
  and by continuation; and a clean Redis restart, the same.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.state.conftest import EchoUpstream, Instance, metric, start_instances
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow

#: How long a recovery may take to show: the longest re-check backoff (5 s) many times over,
#: for a loaded machine. A safety net, polled, never waited out.
RECOVERY_TIMEOUT_S = 90.0


@pytest.fixture
def replicas() -> Iterator[list[EchoUpstream]]:
    ups = [EchoUpstream(tag="alpha").start(), EchoUpstream(tag="beta").start()]
    try:
        yield ups
    finally:
        for up in ups:
            up.stop()


def _texts(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """``(role, text)`` of each Chat message the upstream received."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        out.append((m["role"], content or ""))
    return out


def _turn(client: openai.OpenAI, text: str, previous: str | None, *, stream: bool
          ) -> tuple[str, str]:
    """One Responses turn through the SDK: ``(response id, output text)``."""
    extra: dict[str, Any] = {"previous_response_id": previous} if previous else {}
    if not stream:
        r = client.responses.create(model="echo", input=text, **extra)
        return r.id, r.output_text
    final = None
    for event in client.responses.create(model="echo", input=text, stream=True, **extra):
        if event.type == "response.completed":
            final = event.response
    assert final is not None
    return final.id, final.output_text


def test_a_conversation_continues_on_every_instance_at_once(
        redis_server: RedisServer, replicas: list[EchoUpstream], tmp_path: Path,
        closing) -> None:
    with start_instances(3, replicas=replicas, state_url=redis_server.url,
                         tmp=tmp_path) as gws:
        clients = [closing(openai.OpenAI(base_url=g.url + "/v1", api_key="none",
                                         max_retries=0, timeout=60)) for g in gws]
        for conv in range(4):
            previous, expected, producers = None, [], []
            for turn in range(5):
                gw = (conv + turn) % 3  # never the instance of the previous turn
                text = f"conversation {conv} turn {turn}"
                counts = [len(r.requests) for r in replicas]
                rid, answer = _turn(clients[gw], text, previous, stream=turn % 2 == 1)
                [grown] = [i for i, r in enumerate(replicas) if len(r.requests) > counts[i]]
                tag, seen = replicas[grown].tag, replicas[grown].requests[-1]
                expected.append(("user", text))
                assert _texts(seen) == expected, (conv, turn)
                assert answer == f"{tag} heard: {text}"
                expected.append(("assistant", answer))
                producers.append(tag)
                # Readable by id on another instance the moment the turn ended.
                got = httpx.get(f"{gws[(gw + 1) % 3].url}/v1/responses/{rid}", timeout=30)
                assert got.status_code == 200 and got.json()["id"] == rid
                assert got.json()["output"][0]["content"][0]["text"] == answer
                previous = rid
            # Every continuation went to the replica that produced its predecessor, though
            # it came to an instance that never saw that response (the pin is stored with
            # it). Without it each turn is a coin toss between the two replicas.
            assert len(set(producers)) == 1, producers


class Monitor:
    """Redis ``MONITOR`` on a raw socket, in a thread: every command the server runs."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(b"MONITOR\r\n")
        self.lines: list[str] = []
        self._buf = b""
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                return
            if not data:
                return
            self._buf += data
            *done, self._buf = self._buf.split(b"\r\n")
            self.lines += [d.decode(errors="replace") for d in done if d.startswith(b"+")]

    def client_commands(self) -> list[str]:
        """The commands clients sent (a script's own commands, ``[0 lua]``, and the
        breaker sync's background reads of ``<prefix>breaker:*``, excluded)."""
        return [line.split("] ", 1)[1].split(" ", 1)[0].strip('"').upper()
                for line in self.lines if "] " in line and " lua]" not in line
                and ":breaker:" not in line]

    def close(self) -> None:
        self.sock.close()
        self._thread.join(5)


def test_redis_round_trips_per_request(redis_server: RedisServer,
                                       replicas: list[EchoUpstream], tmp_path: Path) -> None:
    """Counted at the server (MONITOR) and by the client (``tokenwire_state_calls_total``):
    a new stored response 1 (the write), a continuation 2 (the read, the write), a GET 1,
    ``store: false`` 0. Written down in README "Shared state"."""
    with start_instances(1, replicas=replicas, state_url=redis_server.url,
                         tmp=tmp_path) as [gw]:
        body = {"model": "echo", "input": "warm up"}
        first = httpx.post(gw.url + "/v1/responses", json=body, timeout=30).json()
        ok = 'tokenwire_state_calls_total{outcome="ok"}'
        sync = "tokenwire_breaker_sync_round_trips_total"  # background, not per request

        def calls(scrape: str) -> float:
            return (metric(scrape, ok) or 0) - (metric(scrape, sync) or 0)

        def count(method: str, path: str, json: Any = None) -> tuple[list[str], float]:
            before = calls(gw.metrics())
            mon = Monitor(redis_server.port)
            try:
                while not mon.lines:  # MONITOR answers +OK before it relays anything
                    mon._thread.join(0.01)
                r = httpx.request(method, gw.url + path, json=json, timeout=30)
                assert r.status_code == 200, r.text
                httpx.get(gw.url + "/metrics", timeout=30)  # flushes nothing; a fence
            finally:
                mon.close()
            commands = [c for c in mon.client_commands() if c != "OK"]
            return commands, calls(gw.metrics()) - before

        new, n_new = count("POST", "/v1/responses", {"model": "echo", "input": "hi"})
        cont, n_cont = count("POST", "/v1/responses", {
            "model": "echo", "input": "again", "previous_response_id": first["id"]})
        read, n_read = count("GET", f"/v1/responses/{first['id']}")
        none, n_none = count("POST", "/v1/responses", {"model": "echo", "input": "x",
                                                        "store": False})
    assert (new, n_new) == (["EVALSHA"], 1)
    assert (cont, n_cont) == (["GET", "EVALSHA"], 2)
    assert (read, n_read) == (["GET"], 1)
    assert (none, n_none) == ([], 0)


def test_a_response_over_the_byte_cap_is_served_not_stored_and_says_so(
        redis_server: RedisServer, replicas: list[EchoUpstream], tmp_path: Path) -> None:
    with start_instances(2, replicas=replicas, state_url=redis_server.url, tmp=tmp_path,
                         state="store_max_bytes = 4096") as gws:
        big = "word " * 2000  # ~10 KB of input: the stored conversation is over 4 KiB
        r = httpx.post(gws[0].url + "/v1/responses", json={"model": "echo", "input": big},
                       timeout=30)
        assert r.status_code == 200 and r.headers["x-tokenwire-not-stored"] == "too_large"
        rid = r.json()["id"]
        got = httpx.get(f"{gws[1].url}/v1/responses/{rid}", timeout=30)
        assert got.status_code == 404 and "over the store's cap of 4096 bytes" in got.text
        cont = httpx.post(gws[1].url + "/v1/responses", json={
            "model": "echo", "input": "and?", "previous_response_id": rid}, timeout=30)
        assert cont.status_code == 400
        err = cont.json()["error"]
        assert err["code"] == "previous_response_not_found" and "was not stored" in \
            err["message"]
        assert metric(gws[0].metrics(),
                      'tokenwire_responses_not_stored_total{reason="too_large"}') == 1
        small = httpx.post(gws[0].url + "/v1/responses", json={"model": "echo", "input": "x"},
                           timeout=30)
        assert "x-tokenwire-not-stored" not in small.headers


# -- faults ----------------------------------------------------------------------------------

N_LOAD = 90
KILL_AFTER = 30
WORKERS = 6


def _create(gw: Instance, text: str, *, stream: bool) -> httpx.Response:
    return httpx.post(gw.url + "/v1/responses", json={"model": "echo", "input": text,
                                                       "stream": stream}, timeout=60)


def _answer_of(r: httpx.Response) -> str:
    if r.headers["content-type"].startswith("application/json"):
        return r.json()["output"][0]["content"][0]["text"]
    import json
    done = [json.loads(line[6:]) for line in r.text.splitlines()
            if line.startswith("data: ") and '"response.completed"' in line]
    assert done, r.text[-500:]
    return done[0]["response"]["output"][0]["content"][0]["text"]


def _wait_state(gws: list[Instance], want: str) -> None:
    import time
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    for gw in gws:
        while (state := gw.health()["state"]["state"]) != want:
            assert time.monotonic() < deadline, f"{gw.name} stayed {state}"
            time.sleep(0.2)


def test_redis_killed_mid_load_then_back_with_its_data(
        redis_server: RedisServer, replicas: list[EchoUpstream], tmp_path: Path) -> None:
    with start_instances(3, replicas=replicas, state_url=redis_server.url,
                         tmp=tmp_path) as gws:
        seeds = [_create(gws[i], f"seed {i}", stream=False).json() for i in range(3)]
        done = threading.Semaphore(0)
        killed = threading.Event()

        def one(i: int) -> tuple[int, httpx.Response]:
            r = _create(gws[i % 3], f"load {i}", stream=i % 2 == 0)
            done.release()
            return i, r

        def killer() -> None:
            for _ in range(KILL_AFTER):
                done.acquire()
            redis_server.kill()
            killed.set()

        watcher = threading.Thread(target=killer)
        watcher.start()
        with ThreadPoolExecutor(WORKERS) as pool:
            results = list(pool.map(one, range(N_LOAD)))
        watcher.join()
        assert killed.is_set()
        # Every request was answered, with its own answer, Redis or not.
        for i, r in results:
            assert r.status_code == 200, (i, r.text[:300])
            assert _answer_of(r).endswith(f"heard: load {i}")
        not_stored = [r for _, r in results if "x-tokenwire-not-stored" in r.headers]
        assert not_stored and all(r.headers["x-tokenwire-not-stored"] == "store_unavailable"
                                  for r in not_stored)

        # While it is down: reported, and a continuation is a clear 503, never a guess.
        for gw in gws:
            health = gw.health()
            assert health["state"]["state"] == "degraded", health["state"]
            assert health["state"]["url"] == redis_server.url
            assert metric(gw.metrics(), "tokenwire_state_up") == 0
        cont = httpx.post(gws[1].url + "/v1/responses", json={
            "model": "echo", "input": "still there?",
            "previous_response_id": seeds[0]["id"]}, timeout=30)
        assert cont.status_code == 503 and int(cont.headers["retry-after"]) >= 1
        assert cont.json()["error"]["code"] == "store_unavailable"
        gone = httpx.get(f"{gws[2].url}/v1/responses/{seeds[0]['id']}", timeout=30)
        assert gone.status_code == 503

        # Back on its data (AOF, appendfsync always): recovery without a gateway restart.
        redis_server.start()
        _wait_state(gws, "up")
        _check_seeds_survive(gws, seeds, replicas)
        for gw in gws:
            assert metric(gw.metrics(), "tokenwire_state_up") == 1
            log = gw.log()
            # One line each way per instance, not one per request.
            assert log.count("shared state degraded") == 1, log[-2000:]
            assert log.count("shared state recovered") == 1, log[-2000:]

        # A clean restart (SIGTERM, then start on the same data): the same.
        redis_server.restart()
        _wait_state(gws, "up")
        _check_seeds_survive(gws, seeds, replicas, again=True)


def _check_seeds_survive(gws: list[Instance], seeds: list[dict], replicas: list[EchoUpstream],
                         *, again: bool = False) -> None:
    for i, seed in enumerate(seeds):
        reader = gws[(i + 1) % 3]
        got = httpx.get(f"{reader.url}/v1/responses/{seed['id']}", timeout=30)
        assert got.status_code == 200 and got.json()["output"] == seed["output"]
        text = f"after restart {i}{' again' if again else ''}"
        before = {r.tag: len(r.requests) for r in replicas}
        cont = httpx.post(reader.url + "/v1/responses", json={
            "model": "echo", "input": text, "previous_response_id": seed["id"]}, timeout=30)
        assert cont.status_code == 200, cont.text
        [seen] = [r.requests[-1] for r in replicas if len(r.requests) > before[r.tag]]
        assert _texts(seen) == [("user", f"seed {i}"),
                                ("assistant", seed["output"][0]["content"][0]["text"]),
                                ("user", text)]


def test_websocket_and_http_turns_continue_each_other_across_instances(
        redis_server: RedisServer, replicas: list[EchoUpstream], tmp_path: Path) -> None:
    """Codex's transport: a WebSocket turn on one instance, an HTTP turn on another, a
    WebSocket turn on a third; each reads its predecessor from the shared store."""
    import json

    from websockets.sync.client import connect

    def ws_turn(gw: Instance, text: str, previous: str | None) -> dict:
        with connect(gw.url.replace("http://", "ws://") + "/v1/responses", proxy=None,
                     open_timeout=60) as ws:
            extra = {"previous_response_id": previous} if previous else {}
            ws.send(json.dumps({"type": "response.create", "model": "echo", "input": text,
                                **extra}))
            while True:
                msg = json.loads(ws.recv(timeout=60))
                assert msg["type"] not in ("error", "response.failed"), msg
                if msg["type"] == "response.completed":
                    return msg["response"]

    with start_instances(3, replicas=replicas, state_url=redis_server.url,
                         tmp=tmp_path) as gws:
        first = ws_turn(gws[0], "over the socket", None)
        second = httpx.post(gws[1].url + "/v1/responses", json={
            "model": "echo", "input": "over http", "previous_response_id": first["id"]},
            timeout=60).json()
        third = ws_turn(gws[2], "socket again", second["id"])
        seen = max((r.requests[-1] for r in replicas if r.requests), key=len)
        answers = [r["output"][0]["content"][0]["text"] for r in (first, second)]
        assert _texts(seen) == [("user", "over the socket"), ("assistant", answers[0]),
                                ("user", "over http"), ("assistant", answers[1]),
                                ("user", "socket again")]
        assert third["output"][0]["content"][0]["text"].endswith("heard: socket again")
