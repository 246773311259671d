"""Real ``tokenwire serve`` processes for the cluster tests, started by the launcher itself.

:func:`running_cluster` starts ``Cluster`` (cluster/launcher.py: N ``tokenwire serve``
children on free ports sharing one real redis-server, and the balancer) in a background
event loop thread, so tests can use it from synchronous code with httpx, the openai SDK or
the Codex CLI; :func:`pool_config` writes the TOML of one pooled upstream.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.redis_server import free_ports
from tokenwire.cluster.launcher import Cluster

SRC = Path(__file__).resolve().parents[2] / "src"
#: The tests' Redis deadline: the default 250 ms is for a production Redis; on this shared
#: 2-core machine (load average 30+) a loopback call can miss it, and only injected faults
#: may degrade the state here (redis-store's tests use the same).
STATE_TIMEOUT_MS = 5000
#: Safety net for a whole wait (instances starting under a load average of 30); never a
#: measurement.
SAFETY_S = 240.0


def pool_config(path: Path, replicas: Sequence[tuple[str, str]], *, model: str = "m",
                kind: str = "openai", breaker: dict[str, Any] | None = None,
                probe_interval_s: float = 3600.0) -> Path:
    """One pooled upstream named ``pool`` over ``(name, base_url)`` replicas serving
    ``model``, and the ``[state]`` deadline of the tests. Probes are rare by default: a
    test's breakers move by requests only."""
    lines = ["[state]", f"timeout_ms = {STATE_TIMEOUT_MS}  # the url comes from the launcher",
             "[[upstreams]]", 'name = "pool"', f'kind = "{kind}"',
             f"probe_interval_s = {probe_interval_s}", "replicas = ["]
    lines += [f'  {{ base_url = "{url}", name = "{name}" }},' for name, url in replicas]
    lines += ["]"]
    if breaker:
        lines += ["[upstreams.breaker]", *(f"{k} = {v}" for k, v in breaker.items())]
    lines += ["[[upstreams.models]]", f'name = "{model}"']
    path.write_text("\n".join(lines) + "\n")
    return path


class LoopThread:
    """An event loop in a daemon thread; :meth:`run` waits for a coroutine there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float = SAFETY_S) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@contextmanager
def running_cluster(n: int, serve_args: Sequence[str], *, state_url: str | None,
                    log_dir: Path) -> Iterator[Cluster]:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    cluster = Cluster(ports=free_ports(n), serve_args=list(serve_args),
                      port=0, state_url=state_url, log_dir=log_dir, env=env)
    loop = LoopThread()
    try:
        loop.run(cluster.start())
        cluster.loop = loop  # type: ignore[attr-defined]
        yield cluster
    finally:
        try:
            loop.run(cluster.stop())
        finally:
            loop.close()


def balancer_url(cluster: Cluster) -> str:
    return f"http://127.0.0.1:{cluster.port}"


def replica_state(url: str, replica: str) -> dict[str, Any]:
    """Replica ``pool/<replica>`` in ``GET /health`` of the instance at ``url``."""
    body = httpx.get(url + "/health", timeout=30).json()
    [pool] = [u for u in body["upstreams"] if u["name"] == "pool"]
    [entry] = [r for r in pool["replicas"] if r["name"] == f"pool/{replica}"]
    return entry


def wait_until(what: str, predicate: Any, timeout: float = SAFETY_S) -> float:
    """Poll ``predicate`` until true; returns the seconds it took (printed, never
    asserted)."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, f"safety net: {what} never happened"
        time.sleep(0.05)
    return time.monotonic() - start
