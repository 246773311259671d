"""What the HTTP+SSE upstream adapters share (OpenAI-compatible, Responses, Anthropic).

* :class:`SSEUpstreamStream`: one generation as one ``POST`` whose ``text/event-stream``
  body goes through :class:`~tokenwire.gateway.upstreams.sse.SSEDecoder` and an adapter's sans-IO
  parser (``on_sse(event) -> list[Event]``, ``on_eof()``) into IR events, with cancellation
  transport failures and back-pressure handled once. Failures are classified by
  :mod:`.failures`, shared with every HTTP adapter.
* API keys from the environment, the per-upstream ``httpx.AsyncClient``, and the
  ``GET .../models`` probe.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol, Self

import httpx
import msgspec

from tokenwire.codec.maps import TokenizerMap
from tokenwire.errors import ConfigError, RemoteProtocolError, ServerBusy
from tokenwire.gateway.ir import (
    Event,
    Failure,
    FailureClass,
    Finish,
    FinishKind,
    IdsSource,
    is_terminal,
)
from tokenwire.gateway.upstreams.base import UpstreamConfig, UpstreamHealth, UpstreamState
from tokenwire.gateway.upstreams.failures import (
    MALFORMED,
    failure_from_exception,
    fetch_capped,
    not_a_stream,
    read_capped,
)
from tokenwire.gateway.upstreams.http_transport import UpstreamClient, upstream_transport
from tokenwire.gateway.upstreams.sse import SSEDecoder, SSEEvent
from tokenwire.gateway.upstreams.stream_post import BodyReader, stream_post

__all__ = [
    "OTHER_UNKNOWN",
    "UNKNOWN_NAMES",
    "UNKNOWN_NAME_CHARS",
    "FailedStream",
    "HttpClassifier",
    "SSEUpstreamStream",
    "StreamParser",
    "TextUpstream",
    "UnknownEvents",
    "api_key_from_env",
    "broken_stream",
    "http_client",
    "probe_models",
]

log = logging.getLogger(__name__)

#: The names of the events (blocks, deltas) an adapter does not read are the upstream's own
#: strings: each is kept cut to this many characters, and at most this many names per
#: counter; later names are counted under :data:`OTHER_UNKNOWN`. Kept whole and all, an
#: upstream that named each event anew made the gateway hold them for as long as it ran.
UNKNOWN_NAMES = 64
UNKNOWN_NAME_CHARS = 64
OTHER_UNKNOWN = "(other)"


class UnknownEvents(Counter[str]):
    """How often each kind of event an adapter does not read came, within the bounds
    above (per stream in a parser, per upstream over its life)."""

    def add(self, name: str, count: int = 1) -> None:
        name = name[:UNKNOWN_NAME_CHARS]
        if name not in self and len(self) >= UNKNOWN_NAMES:
            name = OTHER_UNKNOWN
        self[name] += count


# -- the HTTP side of one generation ------------------------------------------------------------


class StreamParser(Protocol):
    def on_sse(self, sse: SSEEvent) -> list[Event]: ...

    def on_eof(self) -> list[Event]: ...


#: ``(status, headers, body) -> Failure`` for a non-2xx answer.
HttpClassifier = Callable[[int, httpx.Headers, bytes], Failure]


class SSEUpstreamStream:
    """One generation over one SSE response (:class:`~tokenwire.gateway.ir.EventStream`).

    ``submit`` must not block, so the request starts on the first :meth:`next_event`: a
    task sends it (with ``slots``, after waiting for one of them: the adapter's concurrency
    cap) and reads the answer's head. From there the body is read by :meth:`next_event`
    itself, in its caller's task, one read per call while no event is ready. Every wait in
    it can be cancelled without losing anything (the supervisor's timer cancels it for each
    heartbeat): the opening task is waited for, never cancelled, and a body read keeps its
    bytes in the connection's buffer until it returns (:class:`BodyReader`). Nothing is read
    that was not asked for, so a slow client leaves bytes in the socket, and back-pressure
    reaches the upstream. Until issue 15 a task read the whole body into a queue of events:
    every token crossed that queue and woke one more task (BENCHMARKS.md, "Session of
    2026-12-04 (2)").

    With a sink (:meth:`push_to`: the supervisor's, through the usage meter) the body is
    pushed instead while nothing is ready: the connection's callback decodes and parses
    what arrives, and each event the sink takes never wakes this task. The first event
    the sink leaves, a terminal or the body's end hands the body back to :meth:`next_event`
    (later bytes wait in the connection's buffer, so back-pressure still works).

    :meth:`cancel` closes the upstream response (the upstream sees the disconnect and stops
    generating), and the stream ends with ``ABORT``. Parsing stops at the first terminal
    event; the body's end is then read within bounds (:func:`_drain_for_reuse`) so that
    its connection can carry the next request.
    """

    def __init__(self, *, client: httpx.AsyncClient, url: str, body: Any, parser: StreamParser,
                 classify_http: HttpClassifier, on_done: Callable[[], None] = lambda: None,
                 headers: Mapping[str, str] | None = None,
                 slots: asyncio.Semaphore | None = None) -> None:
        # ``body`` is a JSON value, or ``bytes`` sent exactly as given (a passthrough body).
        self._client, self._url, self._body = client, url, body
        self._headers = dict(headers or {})
        self.parser, self._classify_http, self._on_done = parser, classify_http, on_done
        self._slots = slots
        self._holding_slot = False
        self._ready: deque[Event] = deque()  # events parsed, not yet returned
        self._opening: asyncio.Task[None] | None = None
        self._post: stream_post | None = None
        self._reader: BodyReader | None = None  # once the head said "an SSE body follows"
        self._decoder = SSEDecoder()
        self._finished = False  # the terminal is in ``_ready`` (or was returned)
        self._seen_bytes = False
        #: Takes events as they are parsed, while nothing is ready (``push_to``).
        self._sink: Callable[[Event], bool] | None = None
        self._pushing: Any = None  # the body while it is pushed to us (its ``listen``)

    def push_to(self, sink: Callable[[Event], bool]) -> bool:
        """Offer each non-terminal event to ``sink`` as it is parsed, in the upstream
        connection's callback, before it is queued for :meth:`next_event`: ``sink`` returns
        True when it took the event (then :meth:`next_event` never returns it), False to
        leave it (and every later one) to :meth:`next_event`. Only while nothing is queued,
        so the order is kept. See ``http_transport._ChunkedBody.listen`` for why."""
        self._sink = sink
        return True

    async def next_event(self) -> Event:
        ready = self._ready
        while not ready:
            if self._finished:  # read after the terminal: nothing more will come
                return Finish(reason=FinishKind.ABORT)
            reader = self._reader
            if reader is None:
                self.start()
                await _finished(self._opening)  # type: ignore[arg-type]
                if self._reader is None and not self._finished:  # a bug: never a hang
                    self._end(broken_stream())
                continue
            if self._sink is not None and getattr(reader, "can_listen", _never)():
                # Pushed: the connection's callback parses what comes (_on_piece) and the
                # sink takes it; this task wakes for what the sink leaves, or the body's end.
                self._pushing = reader
                reader.listen(self._on_piece)  # type: ignore[attr-defined]
                try:
                    await reader.wait_pushed()  # type: ignore[attr-defined]
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self._fail(exc)
                continue
            try:
                data = await reader.read()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._fail(exc)
                continue
            self._feed(data)
        return ready.popleft()

    def start(self) -> None:
        """Send the request now (its task), before the first :meth:`next_event`."""
        if self._opening is None and not self._finished:
            self._opening = asyncio.get_running_loop().create_task(self._open())

    def cancel(self) -> None:
        if self._finished:
            return
        if self._opening is not None and not self._opening.done():
            self._opening.cancel()  # its cleanup closes what it opened
        self._end(Finish(reason=FinishKind.ABORT))
        self._close_answer()

    # -- opening: the request and the answer's head, in a task ----------------------------

    async def _open(self) -> None:
        try:
            await self._open_answer()
        except asyncio.CancelledError:
            if self._post is not None:
                await self._post.aclose()
            raise
        except Exception as exc:
            self._fail(exc)
        # Answered without an SSE body (an error status, another content type, a terminal
        # in the head): the answer is closed here, pooled only if its body's end was read.
        # Left open, its connection stayed taken and the upstream's pool ran dry.
        if self._finished and self._post is not None:
            await self._post.aclose()

    async def _open_answer(self) -> None:
        """The request, the answer's head, and what came with it."""
        if self._slots is not None:
            await self._slots.acquire()
            self._holding_slot = True
        body = self._body if isinstance(self._body, bytes) else json_body(self._body)
        headers = {**self._headers, "Content-Type": "application/json"}
        self._post = post = stream_post(self._client, parsed_url(self._url), body, headers)
        resp = await post.__aenter__()
        if resp.status_code >= 400:
            data = await read_capped(resp)
            self._end(self._classify_http(resp.status_code, resp.headers, data))
            return
        ctype = post.content_type
        if "text/event-stream" not in ctype:
            self._end(not_a_stream(ctype, await read_capped(resp)))
            return
        # A parser that reads the response head (the Responses turn state) says so.
        on_head = getattr(self.parser, "on_head", None)
        if on_head is not None and self._put_all(on_head(resp.headers)):
            return
        self._reader = reader = post.reader()
        take_start = getattr(reader, "take_start", None)
        if self._sink is not None and take_start is not None:
            # What came with the head (the first tokens, as often as not) is parsed here,
            # where the head was read: a sink takes it without a wake-up of the task that
            # waits for this one (on the way to the first token).
            for piece in take_start():
                self._feed(piece)
                if self._finished:
                    break

    # -- the body, in the caller's task -----------------------------------------------------

    def _feed(self, data: bytes) -> None:
        """Parse what one read returned (``b""``: the body's end)."""
        try:
            if data:
                self._seen_bytes = True
                for sse in self._decoder.feed(data):
                    if self._put_all(self.parser.on_sse(sse)):
                        self._after_terminal()
                        return
                return
            for sse in self._decoder.feed_eof():
                if self._put_all(self.parser.on_sse(sse)):
                    return
            if not self._put_all(self.parser.on_eof()):
                self._end(broken_stream())
        except Exception as exc:
            self._fail(exc)

    def _on_piece(self, data: bytes) -> None:
        """A chunk of the body, pushed by its connection (``b""``: never, the end is read)."""
        if self._finished:
            return  # the rest after a terminal: the body's end is read by _after_terminal
        self._feed(data)
        if self._ready and self._pushing is not None:  # what the sink left: the task's
            self._unlisten()

    def _unlisten(self) -> None:
        reader, self._pushing = self._pushing, None
        if reader is not None:
            reader.listen(None)

    def _put_all(self, events: list[Event]) -> bool:
        """Make ``events`` ready, up to a terminal; True once the stream ended. While nothing
        is ready, the sink (``push_to``) is offered each event first."""
        ready, sink = self._ready, self._sink
        for event in events:
            if self._finished:
                break
            if is_terminal(event):
                self._end(event)
            elif ready or sink is None or not sink(event):
                ready.append(event)
        return self._finished

    def _after_terminal(self) -> None:
        """Parsing stopped at the terminal: the connection is pooled if the body's end was
        read with it (the common case), else the end is read in a task of its own (the
        terminal goes out now), within bounds, so that it can carry the next request."""
        reader = self._reader
        if reader is None or reader.ended:
            self._close_answer()
            return
        drain = asyncio.get_running_loop().create_task(_drain_for_reuse(reader))
        _DRAINS.add(drain)  # the loop keeps only a weak reference to a task
        drain.add_done_callback(_DRAINS.discard)

    # -- the end ----------------------------------------------------------------------------

    def _fail(self, exc: Exception) -> None:
        if isinstance(exc, httpx.HTTPError):
            failure = failure_from_exception(exc, started=self._seen_bytes)
        elif isinstance(exc, RemoteProtocolError):  # the SSE decoder: oversized or cut off
            failure = _transport_failure(FailureClass.UPSTREAM, "malformed event stream", exc,
                                         code=MALFORMED)
        else:  # a bug here must still end the stream
            log.error("upstream stream handler failed: %s", type(exc).__name__)
            failure = _transport_failure(FailureClass.INTERNAL, "internal error", exc, 500)
        self._end(failure)
        self._close_answer()

    def _end(self, terminal: Event) -> None:
        """Make the terminal ready (after what is ready), at most once; the slot and the
        adapter's count go back. The answer is closed by the caller (or drained)."""
        if self._finished:
            return
        self._finished = True
        self._unlisten()  # what follows the terminal is read (drained) by a task
        self._ready.append(terminal)
        if self._holding_slot:
            self._holding_slot = False
            self._slots.release()  # type: ignore[union-attr]
        self._on_done()

    def _close_answer(self) -> None:
        """Stop reading the body: its connection is pooled if the body's end was read, else
        closed (the upstream sees the disconnect). Before there is a body, the opening task
        closes what it opened."""
        if self._reader is not None:
            self._reader.close()


#: Drains in progress (:meth:`SSEUpstreamStream._after_terminal`).
_DRAINS: set[asyncio.Task[None]] = set()


async def _finished(task: asyncio.Task[None]) -> None:
    """Wait for ``task`` to end; cancelling this wait cancels only the wait, never the task
    (``asyncio.wait``'s guarantee, for one future instead of its sets and callbacks on the
    way to the first token)."""
    if task.done():
        return
    ended = asyncio.get_running_loop().create_future()
    task.add_done_callback(lambda _: ended.done() or ended.set_result(None))
    await ended


def _never() -> bool:
    return False


def broken_stream() -> Failure:
    """An upstream stream that ended without its terminal event (a 502, retryable)."""
    return Failure(failure_class=FailureClass.UPSTREAM, status=502,
                   message="the upstream stream ended without a terminal event")


def json_body(value: Any) -> bytes:
    """A JSON value as the request body: compact UTF-8, the strings byte for byte as
    httpx's ``json=`` (``json.dumps``) wrote them, 25x faster (1.2 ms -> 0.04 ms for a
    190 KB prompt, on the way to the first token). Floats keep their values; an exponent
    is spelled ``1e16`` where ``json.dumps`` wrote ``1e+16``. A non-finite float cannot
    come from a client's JSON (msgspec refuses it at decode)."""
    return _json_encode(value)


_json_encode = msgspec.json.Encoder().encode


@functools.lru_cache(maxsize=1024)
def parsed_url(url: str) -> httpx.URL:
    """``url`` parsed once: httpx parses a str URL on every request (character checks in
    Python, a fifth of building the request), and an upstream has a handful of URLs."""
    return httpx.URL(url)


#: After its terminal event the rest of an upstream's body is normally its end alone (the
#: chunked terminator, perhaps ``[DONE]`` or a usage chunk). Read within these bounds, the
#: body ends and its connection goes back to the pool; past them the connection is closed,
#: as it always was. Closing every stream's connection cost a connect per stream and left a
#: TIME_WAIT socket on each side: with thousands of them, ``connect()`` itself was 10 % of
#: the gateway's samples on sequential short streams (BENCHMARKS.md, "The hot path").
DRAIN_MAX_BYTES = 64 * 1024
DRAIN_MAX_S = 0.25


async def _drain_for_reuse(reader: BodyReader) -> None:
    """Read what follows the terminal so the connection can be reused; never raises (the
    client already has its terminal) and never waits past :data:`DRAIN_MAX_S`."""
    seen = 0
    try:
        async with asyncio.timeout(DRAIN_MAX_S):
            while data := await reader.read():
                seen += len(data)
                if seen > DRAIN_MAX_BYTES:
                    break
    except (TimeoutError, httpx.HTTPError):
        pass
    finally:
        reader.close()  # a no-op once the end was read: the connection is pooled


class FailedStream:
    """A request that cannot be sent (e.g. token ids to a text-only API): one Failure."""

    def __init__(self, failure: Failure) -> None:
        self._failure = failure

    async def next_event(self) -> Event:
        return self._failure

    def cancel(self) -> None:
        pass


def _transport_failure(cls: FailureClass, what: str, exc: BaseException,
                       status: int = 502, code: str | None = None) -> Failure:
    # httpx messages name the URL at most, never headers, so no key can leak through them.
    return Failure(failure_class=cls, status=status, code=code,
                   message=f"upstream {what}: {type(exc).__name__}: {exc}".rstrip(": "))


def api_key_from_env(config: UpstreamConfig) -> str | None:
    """The key named by ``api_key_env``; a missing variable is a start-up error."""
    if config.api_key_env is None:
        return None
    key = os.environ.get(config.api_key_env)
    if not key:
        raise ConfigError(f"upstream {config.name!r}: environment variable "
                          f"{config.api_key_env} (its API key) is not set")
    return key


def http_client(config: UpstreamConfig, headers: dict[str, str],
                transport: httpx.AsyncBaseTransport | None) -> httpx.AsyncClient:
    timeout = httpx.Timeout(config.read_timeout_s, connect=config.connect_timeout_s)
    most = config.max_concurrent + 1  # + 1 for probes
    sent = {**headers, **dict(config.headers)}
    if not any(name.lower() == "accept-encoding" for name in sent):
        # identity: a token stream gains nothing from compression on its way here, and a
        # coded body is work to undo (``content_coding``); the configuration may still ask.
        sent["Accept-Encoding"] = "identity"
    return UpstreamClient(headers=sent, timeout=timeout,
                             limits=httpx.Limits(max_connections=most),
                             transport=transport or upstream_transport(most))



async def probe_models(
    client: httpx.AsyncClient, url: str, upstream: Any, *,
    on_listing: Callable[[list[Any]], None] | None = None,
) -> UpstreamHealth:
    """GET the upstream's model list: DOWN if unreachable or answering an error, DEGRADED if
    the list is not the expected JSON or lacks a configured model, else UP.

    ``models`` is what the upstream lists, the names requests are sent as: start-up compares
    each route's ``sent_as`` with it, and an upstream configured without models serves it
    (:mod:`tokenwire.gateway.server`). ``on_listing`` sees the listing's ``data`` entries
    (the OpenAI adapter reads ``owned_by`` there).
    """
    config: UpstreamConfig = upstream.config

    def health(state: UpstreamState, detail: str, models: tuple[str, ...] = ()) -> UpstreamHealth:
        return UpstreamHealth(name=config.name, kind=config.kind, state=state, models=models,
                              detail=detail)

    try:
        status, _, body = await fetch_capped(client, "GET", url)
    except httpx.HTTPError as exc:
        return health(UpstreamState.DOWN, f"unreachable: {type(exc).__name__}: {exc}")
    if status in (401, 403):
        return health(UpstreamState.DOWN, f"the upstream refused our key (HTTP {status})")
    if status != 200:
        return health(UpstreamState.DOWN, f"the model listing answered HTTP {status}")
    try:
        data = msgspec.json.decode(body).get("data") or []
        listed = tuple(str(m["id"]) for m in data)
        if on_listing is not None:
            on_listing(data)
    except (msgspec.DecodeError, AttributeError, KeyError, TypeError):
        return health(UpstreamState.DEGRADED, "the model listing is not the expected JSON")
    missing = [m.name if m.name == m.sent_as else f"{m.name} (as {m.sent_as!r})"
               for m in config.models if m.sent_as not in listed]
    if missing:
        return health(UpstreamState.DEGRADED, "not listed upstream: " + ", ".join(missing),
                      listed)
    return health(UpstreamState.UP, "", listed)


class TextUpstream:
    """What the text-only SSE adapters (Responses, Anthropic) share: the client's model name
    mapped to the upstream's, a cap on requests in flight, ids by retokenizing (only for
    models with a map), probing and closing. Subclasses set ``kind``, name their endpoint
    base (:meth:`api_base_for`) and auth headers (:meth:`auth_headers`), and build requests
    in ``submit``, which calls :meth:`_admit` and hands :meth:`_release` to the stream."""

    kind: ClassVar[str] = ""

    def __init__(self, config: UpstreamConfig, client: httpx.AsyncClient,
                 maps: Mapping[str, TokenizerMap] | None = None) -> None:
        self.name = config.name
        self.config = config
        self._client = client
        self._maps = dict(maps or {})
        self.api_base = self.api_base_for(config)
        self._routes = {m.name: m for m in config.models}
        self.model_id = config.models[0].name if config.models else config.name
        # Text only: ids exist only where a model's map lets the router retokenize the text.
        self.ids_source = IdsSource.RETOKENIZED if self._maps else IdsSource.NONE
        self.active = 0
        self.unknown_events = UnknownEvents()

    @staticmethod
    def api_base_for(config: UpstreamConfig) -> str:
        return config.base_url.rstrip("/")

    @staticmethod
    def auth_headers(key: str | None) -> dict[str, str]:
        raise NotImplementedError

    @classmethod
    def parse_options(cls, upstream: str, options: Mapping[str, object]) -> Mapping[str, Any]:
        """``[upstreams.options]`` checked (a :class:`ConfigError` naming the key), when the
        config is read and before any client is built. This kind takes none (Anthropic's):
        a key here would otherwise be ignored in silence. A kind with options overrides it."""
        if options:
            raise ConfigError(f"upstream {upstream!r}: unknown {cls.kind} option "
                              f"{next(iter(options))!r} in [upstreams.options]; {cls.kind} "
                              "upstreams take none")
        return options

    @classmethod
    def from_config(cls, config: UpstreamConfig, *,
                    transport: httpx.AsyncBaseTransport | None = None,
                    maps: Mapping[str, TokenizerMap] | None = None) -> Self:
        # Everything that can fail is checked before the client exists: a client built
        # first would be left open (its pool and transport) by a constructor that raised.
        cls.parse_options(config.name, config.options)
        headers = cls.auth_headers(api_key_from_env(config))
        return cls(config, http_client(config, headers, transport), maps)

    def __repr__(self) -> str:  # never the headers: they hold the key
        return f"<{type(self).__name__} {self.name!r} {self.api_base}>"

    def ids_source_for(self, model: str) -> IdsSource:
        return IdsSource.RETOKENIZED if model in self._maps else IdsSource.NONE

    def upstream_model(self, model: str) -> str:
        route = self._routes.get(model or self.model_id)
        return route.sent_as if route is not None else model

    def _admit(self) -> None:
        if self.active >= self.config.max_concurrent:
            raise ServerBusy(f"upstream {self.name!r} has {self.active} requests in flight")
        self.active += 1

    def _release(self, parser: StreamParser) -> None:
        self.active -= 1
        for name, count in getattr(parser, "unknown", {}).items():
            self.unknown_events.add(name, count)

    async def probe(self) -> UpstreamHealth:
        return await probe_models(self._client, f"{self.api_base}/models", self)

    async def aclose(self) -> None:
        await self._client.aclose()
