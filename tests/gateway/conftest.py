"""Real loopback servers for gateway tests: uvicorn in a thread on a free 127.0.0.1 port.

``ASGITransport`` buffers whole bodies, so anything about streaming, timing or disconnects
runs against a real socket (STYLE §6 item 13). The embedded engine is loaded once per session
(``engine``); each deployment setting gets its own small app over it (``serve``).
``ScriptedUpstream`` replays fixed events with delays: it is for injecting faults and for
pacing, never a stand-in for the real engine in interop tests.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn

from tokenwire.codec.maps import TokenizerMap, bundled_map_path, load_map_file
from tokenwire.errors import ServerBusy
from tokenwire.gateway.http.app import create_app
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.ir import Event, GenerationRequest
from tokenwire.gateway.settings import ServerSettings, build_policy

_PROBE = """
from llama_cpp import Llama
from tokenwire.gguf_tokenizer import smollm2_gguf_path
llm = Llama(model_path=str(smollm2_gguf_path()), n_ctx=64, verbose=False)
next(iter(llm.generate(llm.tokenize(b"Hi", add_bos=False), temp=0.0)))
"""


@dataclass
class Served:
    url: str
    state: GatewayState
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self, *closing: Any) -> None:
        """Stop serving; ``closing`` (adapters, a built gateway: anything with ``aclose()``)
        are closed first on the server's loop, where their pooled connections live (left
        open, their sockets would warn when collected, during some later test)."""
        if closing and self.thread.is_alive():
            loop = self.server.servers[0].get_loop()
            for obj in closing:
                asyncio.run_coroutine_threadsafe(obj.aclose(), loop).result(10)
        self.server.should_exit = True
        self.thread.join(10)


def start_server(state: GatewayState, app: Any = None, *,
                 wrap: Callable[[Any], Any] | None = None) -> Served:
    """Serve ``app`` (default: ``create_app(state)``; pass ``harden(...)`` for the served
    stack with its key checks), wrapped in ``wrap(app)`` when given (e.g. a recorder), on
    uvicorn in a thread, on a free loopback port."""
    app = app if app is not None else create_app(state)
    if wrap is not None:
        app = wrap(app)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    config = uvicorn.Config(app, log_level="warning", lifespan="off",
                            timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    port = sock.getsockname()[1]
    return Served(url=f"http://127.0.0.1:{port}", state=state, server=server, thread=thread)


@pytest.fixture(scope="session")
def smollm2_map() -> TokenizerMap:
    return load_map_file(bundled_map_path("huggingfacetb/smollm2"))


def make_state(settings: ServerSettings, upstream, tmap: TokenizerMap,
               max_model_len: int = 1024) -> GatewayState:
    pair = build_policy(settings, tmap.id)
    policy, desc = pair if pair is not None else (None, None)
    return GatewayState(settings=settings, upstream=upstream, tmap=tmap,
                        max_model_len=max_model_len, policy=policy, descriptor=desc)


@functools.cache
def _llama_decodes() -> int:
    """The exit code of one decode in a child process (0: llama.cpp runs here), probed once
    per process: a wheel built for another CPU dies with SIGILL, which would kill pytest."""
    return subprocess.run([sys.executable, "-c", _PROBE], capture_output=True,
                          timeout=120).returncode


@contextmanager
def running_engine(tmap: TokenizerMap, *, n_ctx: int, n_threads: int = 1):
    """The real embedded engine at ``n_ctx``, started and closed on exit; skips the test if
    llama.cpp cannot decode on this machine."""
    if (code := _llama_decodes()) != 0:
        pytest.skip(f"llama-cpp-python cannot decode on this machine (exit {code};"
                    " install the portable wheel, see ./dev)")
    from tokenwire.gateway.upstreams.embedded import EmbeddedEngine

    eng = EmbeddedEngine.load(tmap, n_ctx=n_ctx, n_threads=n_threads, queue_size=4)
    eng.start()
    try:
        yield eng
    finally:
        eng.close()


@pytest.fixture(scope="session")
def engine(smollm2_map):
    """The real embedded engine, once per session (skips if llama.cpp cannot run here)."""
    with running_engine(smollm2_map, n_ctx=1024) as eng:
        yield eng


@pytest.fixture(scope="session")
def serve(smollm2_map) -> Iterator[Callable[..., Served]]:
    """``serve(upstream, **settings) -> Served``; servers stop at the end of the session."""
    started: list[Served] = []

    def factory(upstream, **kw) -> Served:
        served = start_server(make_state(ServerSettings(**kw), upstream, smollm2_map))
        started.append(served)
        return served

    yield factory
    for s in started:
        s.stop()


# -- fault injection -------------------------------------------------------------------------


@dataclass
class ScriptedUpstream:
    """Replays ``script`` ((delay_s, event) pairs) for every request; records cancellations."""

    script: list[tuple[float, Event]]
    model_id: str = "scripted"
    capacity: int = 1000
    requests: list[GenerationRequest] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    active: int = 0

    def submit(self, request: GenerationRequest) -> _ScriptStream:
        if self.active >= self.capacity:
            raise ServerBusy("scripted upstream is full")
        self.requests.append(request)
        self.active += 1
        return _ScriptStream(self, request)


class _ScriptStream:
    def __init__(self, up: ScriptedUpstream, request: GenerationRequest) -> None:
        self._up, self._req, self._i = up, request, 0

    async def next_event(self) -> Event:
        delay, event = self._up.script[self._i]
        await asyncio.sleep(delay)
        self._i += 1
        if self._i == len(self._up.script):
            self._up.active -= 1
        return event

    def cancel(self) -> None:
        self._up.cancelled.append(self._req.request_id)
