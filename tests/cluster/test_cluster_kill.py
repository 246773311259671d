"""Kill one gateway instance (SIGKILL) mid-stream (issue 16, "Faults").

Three real ``tokenwire serve`` processes share one real redis-server (the response store is
on it) behind the launcher's balancer, in front of one scripted OpenAI-compatible upstream
whose streams send their first words, then wait for the test's gate: so every stream is
provably in the middle when the kill happens, whatever the machine's speed.

Four streamed Responses requests with ``store: true``: three through the balancer (one per
instance, the ``x-tokenwire-instance`` header says which) and one straight to the victim.
The victim is SIGKILLed, then the gate opens. What must hold:

* the victim's two streams end as a cut connection at the client (httpx's
  ``RemoteProtocolError``), through the balancer as well as directly: never a clean end;
* the other two streams are untouched: every word, then ``response.completed``;
* the store on Redis holds exactly the two completed responses, each readable from every
  surviving instance with its whole text, once; the victim's responses are not stored
  (``404`` from the survivors), so nothing is half-stored, lost or duplicated.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading

import httpx
import pytest
import redis

from tests.cluster.harness import SAFETY_S, balancer_url, pool_config, running_cluster
from tests.gateway.upstreams.fakes import FakeServer, Reply, chat_stream

pytestmark = pytest.mark.slow

WORDS = ["one ", "two ", "three ", "four."]


class GatedUpstream(FakeServer):
    """Each stream sends its first content chunk, then waits for :meth:`open_gate`."""

    def __init__(self) -> None:
        super().__init__(lambda path, body: Reply(chunks=chat_stream("vllm", WORDS)))
        self._gate_lock = threading.Lock()
        self._gates: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self.opened = False

    def open_gate(self) -> None:
        with self._gate_lock:
            self.opened = True
            for loop, event in self._gates:
                loop.call_soon_threadsafe(event.set)

    async def _stream(self, reply: Reply, receive, send) -> None:
        event = asyncio.Event()
        with self._gate_lock:
            self._gates.append((asyncio.get_running_loop(), event))
            if self.opened:
                event.set()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        try:
            # Role chunk and the first word, then the gate.
            for chunk in reply.chunks[:2]:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await event.wait()
            for chunk in reply.chunks[2:]:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        except OSError:
            return


class Stream:
    """One streamed Responses request read in a thread: its events, and how it ended."""

    def __init__(self, url: str, tag: str) -> None:
        self.url, self.tag = url, tag
        self.instance = ""
        self.events: list[dict] = []
        self.started = threading.Event()  # the first text delta arrived
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        body = {"model": "m", "input": f"stream {self.tag}", "stream": True, "store": True}
        try:
            with httpx.stream("POST", self.url + "/v1/responses", json=body,
                              timeout=SAFETY_S) as r:
                assert r.status_code == 200, r.read()
                self.instance = r.headers.get("x-tokenwire-instance", "")
                for line in r.iter_lines():
                    if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
                        self.events.append(json.loads(line[5:]))
                        if self.events[-1]["type"] == "response.output_text.delta":
                            self.started.set()
        except BaseException as exc:  # the cut under test, read by the test thread
            self.error = exc
        finally:
            self.started.set()

    def of(self, type_: str) -> list[dict]:
        return [e for e in self.events if e["type"] == type_]

    @property
    def response_id(self) -> str:
        return self.of("response.created")[0]["response"]["id"]


def test_sigkill_of_one_instance_mid_stream(redis_server, tmp_path) -> None:
    up = GatedUpstream().start()
    try:
        config = pool_config(tmp_path / "pool.toml", [("only", up.url)])
        with running_cluster(3, ["--config", str(config)], state_url=redis_server.url,
                             log_dir=tmp_path / "logs") as cluster:
            via_lb = [Stream(balancer_url(cluster), f"lb{i}") for i in range(3)]
            for s in via_lb:
                assert s.started.wait(SAFETY_S) and s.error is None, s.error
            by_port = {int(s.instance.rsplit(":", 1)[1]): s for s in via_lb}
            assert sorted(by_port) == sorted(i.port for i in cluster.instances)
            victim = cluster.instances[1]
            direct = Stream(victim.url, "direct")
            assert direct.started.wait(SAFETY_S) and direct.error is None, direct.error
            os.kill(victim.pid, signal.SIGKILL)
            cluster.loop.run(victim.process.wait())
            up.open_gate()
            for s in (*via_lb, direct):
                s.thread.join(SAFETY_S)
                assert not s.thread.is_alive()
            cut = [by_port[victim.port], direct]
            kept = [s for s in via_lb if s is not by_port[victim.port]]
            for s in cut:
                assert isinstance(s.error, httpx.RemoteProtocolError), (s.tag, s.error)
                assert not s.of("response.completed") and not s.of("response.failed")
            for s in kept:
                assert s.error is None, (s.tag, s.error)
                [done] = s.of("response.completed")
                text = "".join(e["delta"] for e in s.of("response.output_text.delta"))
                assert text == "".join(WORDS)
                assert done["response"]["output"][0]["content"][0]["text"] == text
            _check_store(cluster, redis_server.url, kept, cut)
    finally:
        up.stop()


def _check_store(cluster, redis_url: str, kept: list[Stream], cut: list[Stream]) -> None:
    survivors = [i for i in cluster.instances if i.process.returncode is None]
    assert len(survivors) == 2
    for inst in survivors:
        for s in kept:
            r = httpx.get(f"{inst.url}/v1/responses/{s.response_id}", timeout=30)
            assert r.status_code == 200, r.text
            assert r.json()["status"] == "completed"
            assert r.json()["output"][0]["content"][0]["text"] == "".join(WORDS)
        for s in cut:
            r = httpx.get(f"{inst.url}/v1/responses/{s.response_id}", timeout=30)
            assert r.status_code == 404, r.text
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        stored = sorted(k.rsplit(":", 1)[1] for k in client.keys("tokenwire:resp:*"))
        indexed = sorted(client.zrange("tokenwire:resp-index", 0, -1))
    finally:
        client.close()
    # Stored under their owner (``state/api_keys.response_owner``): a keyless loopback
    # client's are the anonymous key's.
    assert stored == indexed == sorted(f"anonymous/{s.response_id}" for s in kept)
