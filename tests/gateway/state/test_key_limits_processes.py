"""Per-key limits through three real ``tokenwire serve`` processes on one ``redis-server``:
``[[keys]]`` and ``[state]`` from the config file, wall clocks (nothing pinned).

The exact count with a pinned clock is tests/gateway/test_key_limits_shared.py; here the
point is the whole path (file -> settings -> key check -> shared limiter) in separate
processes. With real clocks a run may cross a minute boundary, where the carried estimate
lets slots back at most one per second (60 a minute): so the admitted count is exactly 60
when the run stays in one window (Redis's own ``TIME`` before and after says), and at most
``60 + seconds spanned + 1`` otherwise, whatever the machine's speed.
"""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
import redis

from tests.redis_server import RedisServer

from .conftest import SRC, TEST_TIMEOUT_MS, EchoUpstream, Instance, _wait_healthy, free_port

SECRET = "sk-process-0123456789abcdef"
WAIT_S = 60.0


def _spawn(i: int, tmp: Path, upstream: EchoUpstream, state_url: str) -> Instance:
    port = free_port()
    cfg = tmp / f"gw{i}.toml"
    cfg.write_text(f"""
[server]
port = {port}

[state]
url = "{state_url}"
timeout_ms = {TEST_TIMEOUT_MS}

[[keys]]
name = "proc-bot"
key_env = "TW_TEST_LIMITED_KEY"
rpm = 60

[[upstreams]]
name = "echo"
kind = "openai"
base_url = "{upstream.url}"
""")
    log_path = tmp / f"gw{i}.log"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TOKENWIRE_", "CODEC_"))}
    env.update(PYTHONPATH=str(SRC), TW_TEST_LIMITED_KEY=SECRET)
    with log_path.open("wb") as log:
        # Loopback needs no key (so /health answers); a presented key is still identified
        # and limited.
        proc = subprocess.Popen(
            [sys.executable, "-m", "tokenwire.cli.main", "serve", "--config", str(cfg),
             "--request-log", "off", "--queue-size", "256",
             "--allow-unauthenticated-localhost"], stdout=log, stderr=log, env=env)
    inst = Instance(name=f"gw{i}", port=port, log_path=log_path, proc=proc)
    _wait_healthy(inst)
    return inst


@pytest.fixture
def three(redis_server: RedisServer, tmp_path: Path) -> Iterator[list[Instance]]:
    upstream = EchoUpstream(tag="echo").start()
    with ExitStack() as stack:
        stack.callback(upstream.stop)
        out = []
        for i in range(3):
            inst = _spawn(i, tmp_path, upstream, redis_server.url)
            stack.callback(inst.stop)
            out.append(inst)
        yield out


def _hammer(urls: list[str], total: int) -> list[int]:
    async def main() -> list[int]:
        gate = asyncio.Semaphore(12)
        async with httpx.AsyncClient(timeout=WAIT_S) as client:
            async def one(i: int) -> int:
                async with gate:
                    resp = await client.post(
                        urls[i % 3] + "/v1/chat/completions",
                        headers={"Authorization": f"Bearer {SECRET}"},
                        json={"model": "echo-model",
                              "messages": [{"role": "user", "content": "Hi"}]})
                    return resp.status_code
            return await asyncio.gather(*(one(i) for i in range(total)))
    return asyncio.run(main())


def test_sixty_a_minute_through_three_serve_processes(three, redis_server) -> None:
    with redis.Redis.from_url(redis_server.url) as r:
        def now() -> float:
            sec, usec = r.time()
            return sec + usec / 1e6

        before = now()
        statuses = Counter(_hammer([i.url for i in three], 120))
        after = now()
    admitted = statuses[200]
    assert statuses[200] + statuses[429] == 120, statuses
    if math.floor(before / 60) == math.floor(after / 60):
        assert admitted == 60
    else:
        assert 60 <= admitted <= 60 + math.ceil(after - before) + 1
    scrapes = [httpx.get(i.url + "/metrics", timeout=WAIT_S).text for i in three]
    served = [float(line.rsplit(" ", 1)[1]) for text in scrapes for line in text.splitlines()
              if line.startswith('tokenwire_key_requests_total{key="proc-bot"}')]
    assert sum(served) == admitted and len(served) == 3
    assert all(SECRET not in text for text in scrapes)
