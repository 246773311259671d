"""A breaker opened by failures seen on one instance is honoured by the others (issue 16).

Three real ``tokenwire serve`` processes (started by ``tokenwire cluster``'s launcher) share
one real redis-server. Their pool has two replicas, scripted OpenAI-compatible servers on
loopback: ``good`` answers every chat request, ``bad`` answers ``GET /v1/models`` (so the
active probe finds nothing wrong) and fails every generation with a 500, counting each one.

1. Only instance A gets traffic until its breaker ejects ``bad`` (each failure is retried on
   ``good`` before any output: every client request succeeds).
2. B and C, which never sent ``bad`` anything, show it ejected (``/health``: breaker open,
   ``adopted_ejections`` 1, ``ejections`` 0: taken from Redis, not seen by themselves).
   How long that took is printed; the bound (sync interval + two Redis round trips) is the
   documented figure, not asserted here.
3. 30 more requests through B, C and the balancer: ``bad`` receives none of them.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.cluster.harness import (
    balancer_url,
    pool_config,
    replica_state,
    running_cluster,
    wait_until,
)
from tests.gateway.upstreams.fakes import Reply, chat_stream, error_reply, start_fake

pytestmark = pytest.mark.slow

#: Eject after 3 failures in a row; the cool-down outlasts the test so nothing half-opens.
BREAKER = {"consecutive_failures": 3, "base_cooldown_s": 600, "max_cooldown_s": 600}
#: At most this many requests to A before it must have ejected ``bad`` (least-loaded of two
#: random picks sends ``bad`` about half of them; 3 in a row is reached long before).
MAX_REQUESTS_TO_EJECT = 200


def _chat(url: str) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", timeout=60, json={
        "model": "m", "messages": [{"role": "user", "content": "hi"}]})


def test_an_ejection_on_one_instance_is_honoured_by_the_others(redis_server, tmp_path) -> None:
    good = start_fake(lambda path, body: Reply(chunks=chat_stream("vllm", ["fine"])))
    bad = start_fake(lambda path, body: error_reply(500, {"error": {
        "message": "scripted failure", "type": "server_error", "code": 500}}))
    try:
        config = pool_config(tmp_path / "pool.toml", [("good", good.url), ("bad", bad.url)],
                             breaker=BREAKER)
        with running_cluster(3, ["--config", str(config)], state_url=redis_server.url,
                             log_dir=tmp_path / "logs") as cluster:
            a, b, c = (i.url for i in cluster.instances)
            sent = 0
            for _ in range(MAX_REQUESTS_TO_EJECT):
                r, sent = _chat(a), sent + 1
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["message"]["content"] == "fine"
                if replica_state(a, "bad")["breaker"] == "open":
                    break
            else:
                pytest.fail(f"A never ejected bad in {MAX_REQUESTS_TO_EJECT} requests")
            seen_by_bad = len(bad.requests)
            assert seen_by_bad >= BREAKER["consecutive_failures"]
            assert replica_state(a, "bad")["ejections"] == 1
            took = max(wait_until(f"{name} honours the ejection",
                                  lambda url=url: replica_state(url, "bad")["breaker"] == "open")
                       for name, url in (("B", b), ("C", c)))
            print(f"\nA ejected bad after {sent} requests ({seen_by_bad} failed on it); "
                  f"B and C honoured it {took:.2f} s later (documented bound: 0.5 s sync "
                  "interval + 2 Redis round trips)")
            for url in (b, c):
                entry = replica_state(url, "bad")
                assert (entry["ejections"], entry["adopted_ejections"]) == (0, 1), entry
                assert entry["cooldown_left_s"] > 0
            for url in (b, c, balancer_url(cluster)) * 10:
                r = _chat(url)
                assert r.status_code == 200 and r.json()["choices"][0]["message"][
                    "content"] == "fine", r.text
            assert len(bad.requests) == seen_by_bad, "B or C sent the ejected replica work"
            keys = [k for k in _redis_keys(redis_server.url) if ":breaker:" in k]
            assert keys == ["tokenwire:breaker:pool:pool/bad"], keys
    finally:
        good.stop()
        bad.stop()


def _redis_keys(url: str) -> list[str]:
    import redis

    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        keys = sorted(client.keys("*"))
        for k in keys:
            if ":breaker:" in k:
                json.loads(client.get(k))  # the record is well-formed JSON
        return keys
    finally:
        client.close()
