"""Helpers for shared-state tests: gateway instances as real processes on one Redis.

- :class:`EchoUpstream`: an OpenAI Chat upstream in a thread that records every request's
  ``messages`` and answers with a reply derived from them (``"<tag> heard: <last user
  text>"``), so a test can check the conversation each turn carried and which replica
  answered. It is scripted (for faults and for reading what the upstream saw); interop claims
  use the real engine or ``llama_cpp.server`` instead.
- :func:`start_instances`: N ``tokenwire serve`` subprocesses, each its own process state,
  with ``[state]`` naming one Redis, in front of the same upstream (or pool of replicas);
  :class:`Instance` reads their ``/health`` and ``/metrics``.

redis-cluster may reuse these (the ``redis_server`` fixture is tests/conftest.py's).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

__all__ = ["EchoUpstream", "Instance", "free_port", "metric", "pool_of", "start_instances"]

SRC = Path(__file__).resolve().parents[3] / "src"
#: A gateway process imports, probes its upstream and binds: seconds idle; generous for a
#: loaded shared machine (a safety net, never a measurement).
START_TIMEOUT_S = 120.0
#: The tests' per-call Redis deadline: the maximum, so that only the faults a test injects
#: (a killed server: refused at once) make the connection degraded, never a slow moment of
#: this loaded machine. The default (250 ms) is for production.
TEST_TIMEOUT_MS = 5000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class EchoUpstream:
    """A recording OpenAI Chat upstream on a loopback port (see the module docstring)."""

    tag: str = "echo"
    model: str = "echo-model"
    requests: list[list[dict[str, Any]]] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def reply(self, messages: list[dict[str, Any]]) -> str:
        users = [m for m in messages if m.get("role") == "user"]
        last = users[-1]["content"] if users else ""
        if isinstance(last, list):  # content parts
            last = " ".join(p.get("text", "") for p in last if isinstance(p, dict))
        return f"{self.tag} heard: {last}"

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.model, "object": "model", "owned_by": "test"}]})

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        messages = body.get("messages", [])
        self.requests.append(messages)
        text = self.reply(messages)
        usage = {"prompt_tokens": len(json.dumps(messages)) // 4,
                 "completion_tokens": len(text.split()),
                 "total_tokens": len(json.dumps(messages)) // 4 + len(text.split())}
        if not body.get("stream"):
            return JSONResponse({"id": "chatcmpl-echo", "object": "chat.completion",
                                 "model": self.model, "usage": usage, "choices": [{
                                     "index": 0, "finish_reason": "stop", "message": {
                                         "role": "assistant", "content": text}}]})

        def chunk(choices: list[Any], **extra: Any) -> bytes:
            return b"data: " + json.dumps({"id": "chatcmpl-echo", "object":
                                           "chat.completion.chunk", "model": self.model,
                                           "choices": choices, **extra}).encode() + b"\n\n"

        def events() -> Iterator[bytes]:
            words = text.split(" ")
            for i, word in enumerate(words):
                piece = word if i == 0 else " " + word
                delta = {"role": "assistant", "content": piece} if i == 0 else {
                    "content": piece}
                yield chunk([{"index": 0, "delta": delta, "finish_reason": None}])
            yield chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}])
            yield chunk([], usage=usage)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    def start(self) -> EchoUpstream:
        app = Starlette(routes=[Route("/v1/models", self._models, methods=["GET"]),
                                Route("/v1/chat/completions", self._chat, methods=["POST"])])
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the echo upstream did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(10)


@dataclass
class Instance:
    """One ``tokenwire serve`` process."""

    name: str
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def health(self) -> dict[str, Any]:
        return httpx.get(self.url + "/health", timeout=30).json()

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=30).text

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


def metric(text: str, name: str) -> float | None:
    """The value of one sample in a Prometheus scrape, named exactly as it appears
    (``tokenwire_state_up``, ``tokenwire_state_calls_total{outcome="ok"}``); None if absent."""
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        if series == name:
            return float(value)
    return None


def pool_of(replicas: Sequence[EchoUpstream]) -> str:
    """``[[upstreams]]``: one pool named ``echo`` of ``replicas``, serving model ``echo``."""
    rows = ",\n".join(f'  {{ name = "{r.tag}", base_url = "{r.url}" }}' for r in replicas)
    return f"""
[[upstreams]]
name = "echo"
kind = "openai"
max_concurrent = 16
replicas = [
{rows}
]
[[upstreams.models]]
name = "echo"
upstream_model = "{replicas[0].model}"
"""


def _config(port: int, upstreams: str, state_url: str, state: str) -> str:
    return f"""
[server]
port = {port}

[state]
url = "{state_url}"
timeout_ms = {TEST_TIMEOUT_MS}
{state}
{upstreams}
"""


def _wait_healthy(inst: Instance) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        assert inst.proc.poll() is None, inst.log()[-3000:]
        with suppress(httpx.TransportError):
            if httpx.get(inst.url + "/health", timeout=5).status_code == 200:
                return
        assert time.monotonic() < deadline, f"{inst.name} did not start:\n{inst.log()[-3000:]}"
        time.sleep(0.2)


#: ``tokenwire serve``'s exit status when its port is taken (README "Exit statuses"): a free
#: port can be taken by another process between choosing it and binding it (7 people share
#: this machine), so the instance is started again on another.
_PORT_TAKEN = 3
_PORT_ATTEMPTS = 5


def _launch(i: int, *, upstreams: str, state_url: str, tmp: Path, state: str,
            env: dict[str, str]) -> Instance:
    port = free_port()
    cfg = tmp / f"gw{i}.toml"
    cfg.write_text(_config(port, upstreams, state_url, state))
    log_path = tmp / f"gw{i}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tokenwire.cli.main", "serve", "--config", str(cfg),
             "--request-log", "off", "--queue-size", "256"],
            stdout=log, stderr=log, env=env)
    return Instance(name=f"gw{i}", port=port, log_path=log_path, proc=proc)


def _spawn_all(n: int, stack: ExitStack, **launch: Any) -> list[Instance]:
    """``n`` instances launched at once (each start is seconds of imports; one after the
    other they were most of a shared-store test), then each waited for."""
    instances = [_launch(i, **launch) for i in range(n)]
    for inst in instances:
        stack.callback(inst.stop)
    for i, inst in enumerate(instances):
        for attempt in range(_PORT_ATTEMPTS):
            try:
                _wait_healthy(inst)
                break
            except AssertionError:
                inst.stop()
                if inst.proc.returncode != _PORT_TAKEN or attempt == _PORT_ATTEMPTS - 1:
                    raise
                inst = instances[i] = _launch(i, **launch)
                stack.callback(inst.stop)
    return instances


@contextmanager
def start_instances(n: int, *, state_url: str, tmp: Path,
                    replicas: Sequence[EchoUpstream] = (), upstreams: str = "",
                    state: str = "") -> Iterator[list[Instance]]:
    """``n`` gateway processes on ``state_url`` in front of one pool of ``replicas`` (or of
    ``upstreams``, ``[[upstreams]]`` TOML), with ``state``: more ``[state]`` lines (e.g.
    ``store_max_bytes = 2048``); started together (each must answer ``/health``),
    stopped (SIGTERM) at the end."""
    upstreams = upstreams or pool_of(replicas)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOKENWIRE_", "CODEC_"))}
    env["PYTHONPATH"] = str(SRC)
    with ExitStack() as stack:
        yield _spawn_all(n, stack, upstreams=upstreams, state_url=state_url, tmp=tmp,
                         state=state, env=env)
