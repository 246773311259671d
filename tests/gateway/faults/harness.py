"""One ``looptime`` event loop holding the scripted upstream, the gateway and the client.

Everything runs in one loop whose clock is fast-forwarded (``looptime``): whenever every task
waits on a timer, the clock jumps to the next one. A 40 s silent first token or a 120 s retry
budget then takes milliseconds, and a test reads the elapsed time from the loop's clock
(``asyncio.get_running_loop().time()``), never from the wall. Every timer involved is loop
time: the upstream's sleeps, the supervisor's heartbeats and deadlines, the retry waits, the
adapters' httpx read timeouts (``UpstreamConfig.read_timeout_s``: set deliberately below),
and the client's (``timeout=None``: httpx's default 5 s would fire in loop time too).

Loop time can only be trusted when nothing waits in real time, because looptime moves its
clock to the next timer whenever the loop looks idle. Three choices keep it honest: servers
listen on sockets created with ``IPPROTO_TCP`` (else asyncio sets no ``TCP_NODELAY`` and a
kept-alive connection waits ~40 ms of real time for a delayed ACK), uvicorn runs without its
0.1 s tick (:class:`~.scripted_upstream.QuietServer`), and the clock ticks in powers of two
(:data:`RESOLUTION_S`).

The gateway is built the way ``tokenwire serve --config`` builds it
(:func:`tokenwire.gateway.server.build_gateway` from an ``UpstreamConfig`` of kind
``openai``, or ``responses``), and served by uvicorn with ``create_app(state)``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import looptime

from tokenwire.codec.frames_msgpack import FrameDecoder
from tokenwire.codec.maps import TokenizerMap
from tokenwire.codec.versioning import CLIENT_VERSION_HEADER, OWN_VERSION, format_version
from tokenwire.gateway.config import GatewayConfig
from tokenwire.gateway.http.app import create_app
from tokenwire.gateway.routing.fallbacks import FallbackTable
from tokenwire.gateway.server import Gateway, build_gateway
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.upstreams.base import ModelRoute, UpstreamConfig

from .scripted_upstream import Fault, ScriptedUpstream, closed_port, serve_app

__all__ = [
    "APIS",
    "FALLBACK",
    "FALLBACK_FIRST_ID",
    "FALLBACK_PROMPT_TOKENS",
    "READ_TIMEOUT_S",
    "Env",
    "Outcome",
    "environment",
    "run_in_looptime",
    "send",
]

T = TypeVar("T")

#: The adapters' silence bound per read in these tests: the default a deployment gets
#: (``DEFAULT_READ_TIMEOUT_S``), named here because it fires in loop time like every timer.
READ_TIMEOUT_S = 300.0
#: The three client APIs every fault is shown on.
APIS = ("responses", "chat", "codec")
MODEL = "m"
#: The fallback model of the "with a fallback" runs, on its own scripted upstream whose ids
#: and prompt count differ from the primary's, so an answer shows whose it is.
FALLBACK = "f"
FALLBACK_FIRST_ID = 2000
FALLBACK_PROMPT_TOKENS = 7


#: The loop clock's tick: a power of two, so that every loop time and every sum of one with
#: a whole number of seconds is an exact float. With looptime's default (1e-6), a heartbeat
#: due at ``60.02 + 15`` = 75.02000000000001 is never reached by a clock frozen at 75.02
#: (asyncio fires timers up to its clock resolution early, and the supervisor then finds the
#: heartbeat not yet due and sleeps 1e-14 s again, forever: see the report on
#: ``SupervisedStream._on_timer``).
RESOLUTION_S = 2.0 ** -10
#: Loop time at which a run is abandoned (looptime fails every task): past the one-hour
#: cap, so a hang is a failed test within seconds instead of a busy loop whose clock runs on.
END_OF_TIME_S = 4000.0


def run_in_looptime(fn: Callable[[], Awaitable[T]]) -> T:
    """Run ``fn()`` in a fresh looptime loop starting at t=0 (one loop for everything)."""
    def factory() -> asyncio.AbstractEventLoop:
        return looptime.new_event_loop(start=0, end=END_OF_TIME_S, resolution=RESOLUTION_S)

    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(fn())  # type: ignore[arg-type]


@dataclass
class Env:
    """A running deployment: the scripted upstream, the gateway, a client to it."""

    upstream: ScriptedUpstream
    gateway: Gateway
    client: httpx.AsyncClient
    url: str
    fallback: ScriptedUpstream | None = None

    def fallbacks_counted(self) -> float:
        """``tokenwire_fallbacks_total`` summed over its labels."""
        metric = self.gateway.state.observability._m.fallbacks
        return sum(s.value for m in metric.collect() for s in m.samples
                   if s.name == "tokenwire_fallbacks_total")

    async def health(self) -> dict[str, Any]:
        resp = await self.client.get(f"{self.url}/health")
        return resp.json()


@asynccontextmanager
async def environment(script: list[Fault], *, cycle: bool = False,
                      settings: ServerSettings | None = None, kind: str = "openai",
                      refused: bool = False, read_timeout_s: float = READ_TIMEOUT_S,
                      max_concurrent: int = 4, fallback: list[Fault] | None = None,
                      maps: tuple[TokenizerMap, TokenizerMap] | None = None,
                      context_length: int | None = None) -> AsyncIterator[Env]:
    """Start the scripted upstream and a gateway over it; stop both afterwards.

    ``refused``: the gateway's upstream URL names a closed port (connections are refused;
    start-up probing is then off, as ``probe = false`` would be). ``fallback``: a second
    scripted upstream (an OpenAI-compatible one) serves model :data:`FALLBACK`, the
    primary's ``fallbacks`` and ``context_fallbacks``; ``maps`` are the two models' maps
    (a Codec request falls back only to a model with the primary's map); ``context_length``
    the primary's window."""
    up = ScriptedUpstream(script=script, cycle=cycle, model=MODEL)
    up_server, up_task, up_port = await serve_app(up.app(), http=up.protocol_class())
    loop = asyncio.get_running_loop()
    port = closed_port() if refused else up_port
    options: dict[str, object] = {"ids": "vllm"} if kind == "openai" else {}
    upstreams = [UpstreamConfig(
        name="scripted", kind=kind, base_url=f"http://127.0.0.1:{port}/v1",
        models=(ModelRoute(name=MODEL, context_length=context_length),),
        read_timeout_s=read_timeout_s, connect_timeout_s=10.0, max_concurrent=max_concurrent,
        options=options)]
    fb = fb_server = fb_task = None
    table, model_maps = FallbackTable(), {}
    if fallback is not None:
        fb = ScriptedUpstream(script=fallback, model=FALLBACK, first_id=FALLBACK_FIRST_ID,
                              prompt_tokens=FALLBACK_PROMPT_TOKENS)
        fb_server, fb_task, fb_port = await serve_app(fb.app(), http=fb.protocol_class())
        upstreams.append(UpstreamConfig(
            name="fallback", kind="openai", base_url=f"http://127.0.0.1:{fb_port}/v1",
            models=(ModelRoute(name=FALLBACK),), read_timeout_s=read_timeout_s,
            connect_timeout_s=10.0, max_concurrent=max_concurrent, options={"ids": "vllm"}))
        table = FallbackTable(general={MODEL: (FALLBACK,)}, context={MODEL: (FALLBACK,)})
        if maps is not None:
            model_maps = {MODEL: maps[0], FALLBACK: maps[1]}
    cfg = GatewayConfig(upstreams=tuple(upstreams), maps=model_maps, fallbacks=table,
                        no_probe=frozenset({"scripted"}) if refused else frozenset())
    gw = await build_gateway(cfg, settings or ServerSettings(), clock=loop.time)
    gw_server, gw_task, gw_port = await serve_app(create_app(gw.state))
    # identity: the faults, not the content codings, are under test here.
    client = httpx.AsyncClient(timeout=None, headers={"Accept-Encoding": "identity"})
    try:
        yield Env(upstream=up, gateway=gw, client=client, url=f"http://127.0.0.1:{gw_port}",
                  fallback=fb)
    finally:
        up.released.set()
        if fb is not None:
            fb.released.set()
        await client.aclose()
        gw_server.stop()
        await gw_task
        await gw.aclose()
        up_server.stop()
        await up_task
        if fb_server is not None and fb_task is not None:
            fb_server.stop()
            await fb_task


# -- the three client APIs -------------------------------------------------------------------


@dataclass
class Outcome:
    """What one client saw, in loop seconds from sending its request.

    ``terminal``: ``http`` (an error status before any byte), ``completed`` / ``failed`` /
    ``incomplete`` (Responses), ``error`` (a Chat error event), ``finish`` (a Chat
    ``finish_reason``), ``frame`` (a Codec terminal frame), ``none`` (the body ended without
    one). ``code``: the error code, incomplete reason or finish reason as written.
    """

    api: str
    status: int
    terminal: str = "none"
    code: str | None = None
    message: str | None = None
    text: str = ""
    ids: list[int] = field(default_factory=list)
    heartbeats: list[float] = field(default_factory=list)
    done_marker: bool = False  # Chat: ``data: [DONE]`` was sent
    elapsed: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    #: Every ``model`` the body named (Chat chunks, Responses snapshots), in order.
    models: list[str] = field(default_factory=list)
    #: The prompt count the answer reported (Responses ``usage.input_tokens``).
    prompt_tokens: int | None = None

    @property
    def succeeded(self) -> bool:
        if self.api == "responses":
            return self.terminal == "completed"
        if self.api == "chat":
            return self.terminal == "finish" and self.status == 200
        return self.terminal == "frame" and self.code not in ("error", None)

    def summary(self) -> str:
        """One table cell: how the failure or success reached this client."""
        if self.terminal == "http":
            return f"HTTP {self.status} `{self.code}`"
        if self.api == "responses":
            code = f" `{self.code}`" if self.code else ""
            return f"`response.{self.terminal}`{code}"
        if self.api == "chat":
            return (f"error event `{self.code}`" if self.terminal == "error"
                    else f"finish_reason `{self.code}`")
        return f"final frame `{self.code}`"


def _body(api: str, stream: bool) -> tuple[str, dict[str, Any]]:
    if api == "responses":
        return "/v1/responses", {"model": MODEL, "input": "Hi", "stream": stream}
    if api == "chat":
        return "/v1/chat/completions", {"model": MODEL, "stream": stream,
                                        "messages": [{"role": "user", "content": "Hi"}]}
    return "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 16,
                               "stream": True, "stream_format": "msgpack"}


async def send(env: Env, api: str, *, stream: bool = True,
               hang_up: Callable[[Outcome], bool] | None = None) -> Outcome:
    """One request on ``api``, read to its end, or until ``hang_up(outcome so far)`` is
    True: the client then closes the connection mid-stream."""
    loop = asyncio.get_running_loop()
    path, body = _body(api, stream)
    # The Codec client declares its version, as tokenwire's clients do: v0.4 vocabulary
    # (``policy_violation``) instead of the ``error`` older clients get (codec-spec §5.3).
    headers = {CLIENT_VERSION_HEADER: format_version(OWN_VERSION)} if api == "codec" else {}
    t0 = loop.time()
    async with env.client.stream("POST", env.url + path, json=body, headers=headers) as resp:
        out = Outcome(api=api, status=resp.status_code, headers=dict(resp.headers))
        if resp.status_code != 200:
            err = json.loads(await resp.aread()).get("error", {})
            out.terminal, out.code, out.message = "http", err.get("code"), err.get("message")
            out.elapsed = loop.time() - t0
            return out
        reader = _READERS[api](out, t0)
        async for chunk in resp.aiter_raw():
            reader.feed(chunk, loop.time())
            if hang_up is not None and hang_up(out):
                break
        out.elapsed = loop.time() - t0
    if not stream:
        reader.whole()
    return out


class _SSEReader:
    """Blocks of an SSE body (``event:`` / ``data:`` lines, ``:`` comments)."""

    def __init__(self, out: Outcome, t0: float) -> None:
        self.out, self.t0, self.buf = out, t0, b""

    def feed(self, chunk: bytes, now: float) -> None:
        self.buf += chunk
        while b"\n\n" in self.buf:
            block, self.buf = self.buf.split(b"\n\n", 1)
            self.block(block.decode(), now - self.t0)

    def block(self, block: str, at: float) -> None:
        raise NotImplementedError

    def whole(self) -> None:
        """A non-streaming body: one JSON document."""
        doc = json.loads(self.buf or b"{}")
        self.buf = b""
        self.document(doc)

    def document(self, doc: dict[str, Any]) -> None:
        raise NotImplementedError


class _ResponsesReader(_SSEReader):
    opened = False  # the first response.in_progress opens the stream; later ones are beats

    def block(self, block: str, at: float) -> None:
        data = next((line[6:] for line in block.splitlines() if line.startswith("data: ")), None)
        if data is None:
            return
        event = json.loads(data)
        kind = event.get("type", "")
        if isinstance(event.get("response"), dict) and event["response"].get("model"):
            self.out.models.append(event["response"]["model"])
        if kind == "response.in_progress":
            if self.opened:
                self.out.heartbeats.append(at)
            self.opened = True
        elif kind == "response.output_text.delta":
            self.out.text += event["delta"]
        elif kind in ("response.completed", "response.failed", "response.incomplete"):
            self.document(event["response"])

    def document(self, response: dict[str, Any]) -> None:
        status = response.get("status")
        usage = response.get("usage") or {}
        self.out.prompt_tokens = usage.get("input_tokens")
        if not self.out.models and response.get("model"):  # a whole (non-streamed) body
            self.out.models.append(response["model"])
        self.out.terminal = {"completed": "completed", "failed": "failed",
                             "incomplete": "incomplete"}.get(status, "none")
        if status == "failed":
            self.out.code = response["error"]["code"]
            self.out.message = response["error"]["message"]
        elif status == "incomplete":
            self.out.code = (response.get("incomplete_details") or {}).get("reason")


class _ChatReader(_SSEReader):
    def block(self, block: str, at: float) -> None:
        for line in block.splitlines():
            if line.startswith(":"):
                self.out.heartbeats.append(at)
            elif line == "data: [DONE]":
                self.out.done_marker = True
            elif line.startswith("data: "):
                self.chunk(json.loads(line[6:]))

    def chunk(self, chunk: dict[str, Any]) -> None:
        if chunk.get("model"):
            self.out.models.append(chunk["model"])
        if "error" in chunk:
            self.out.terminal, self.out.code = "error", chunk["error"].get("code")
            self.out.message = chunk["error"].get("message")
            return
        for choice in chunk.get("choices") or ():
            self.out.text += (choice.get("delta") or {}).get("content") or ""
            if choice.get("finish_reason"):
                self.out.terminal, self.out.code = "finish", choice["finish_reason"]

    def document(self, doc: dict[str, Any]) -> None:
        if doc.get("model"):
            self.out.models.append(doc["model"])
        for choice in doc.get("choices") or ():
            self.out.text += (choice.get("message") or {}).get("content") or ""
            if choice.get("finish_reason"):
                self.out.terminal, self.out.code = "finish", choice["finish_reason"]


class _CodecReader:
    def __init__(self, out: Outcome, t0: float) -> None:
        self.out, self.t0 = out, t0
        self.dec = FrameDecoder()

    def feed(self, chunk: bytes, now: float) -> None:
        for frame in self.dec.feed(chunk):
            if frame.done:
                self.out.terminal, self.out.code = "frame", frame.finish_reason
            elif not frame.ids:
                self.out.heartbeats.append(now - self.t0)
            self.out.ids += list(frame.ids)

    def whole(self) -> None:
        pass


_READERS: dict[str, Callable[[Outcome, float], Any]] = {
    "responses": _ResponsesReader, "chat": _ChatReader, "codec": _CodecReader}
