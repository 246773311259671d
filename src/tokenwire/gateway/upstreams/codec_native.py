"""Codec-native upstreams: engines that already stream Codec frames (``kind = "codec"``).

The Codec forks of sglang, vLLM and llama.cpp, or another tokenwire. We ask for binary
frames (``stream_format`` msgpack or protobuf, codec-spec §2.3) and pass the engine's ids
through untouched: a Codec client of this gateway receives exactly the ids the engine
sampled, with no detokenize/retokenize round trip (which could change them, §3.4). Text is
produced, by the :class:`~tokenwire.codec.detokenizer.Detokenizer` of the model's map, only
when the downstream client shows text (``GenerationRequest.want_text``, or a request that
does not ask for ids at all).

The wire decisions are the Codec client's (:mod:`tokenwire.client._base`): request shapes
for Path A/B/C (§2.1), ``Codec-Client-Version`` (§2.5), the ``Accept-Encoding`` offer, the
§2.7 response checks, dictionary and map discovery (§6.3), the bounded decompressor and
frame decoders. This module adds the chat request, the frame -> IR translation, failure
classification, and the I/O (one pump task per stream, see :class:`_CodecStream`).

Rules kept here:

* The map is verified, never assumed: a response whose ``Codec-Tokenizer-Map`` differs from
  the model's configured map, or a ``/v1/models`` entry advertising another map at
  ``probe()``, is a :class:`Failure` (§2.7: fatal), never silently wrong ids. (The engine
  forks send neither today, §2.5; then the configured map is trusted.) Without a
  configured map, ``probe()`` fetches the upstream's by discovery (the hash ``/v1/models``
  lists, else the map id, else the one map of ``index.json``); a response naming a map we
  do not hold has it fetched by hash and verified.
* Every upstream problem becomes a classified :class:`Failure`: HTTP errors before the
  first frame from their status and error body, a 426 naming the version the upstream
  wants (§5.4), a broken or truncated frame stream (§2.7: abandon it) as ``UPSTREAM``.
* Finish reasons in both vocabularies (§5.7): ``eos_token``/``stop``, ``stop_sequence``,
  ``length``, ``policy_violation`` end normally; ``error``, ``abort`` and unknown values are
  upstream failures (we did not ask it to stop).

Options (``UpstreamConfig.options``): ``stream_format`` (``"msgpack"`` | ``"protobuf"``),
``path`` (``"b"``: id prompts as JSON ints; ``"c"``: ``/v1/completions/codec``, falling back
to B on 404, and used only when the request has nothing Path C cannot carry),
``accept_encoding`` (override the offer), ``zstd`` (offer zstd and fetch the dictionary the
upstream names), ``allow_http`` (discovery over http beyond loopback).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import Mapping
from typing import Any

import httpx

from tokenwire.client._base import ResponseDecoder, TokenChunk
from tokenwire.client.discovery import (
    DiscoveryCache,
    adrive,
    index_flow,
    map_by_hash_flow,
    map_flow,
)
from tokenwire.codec.detokenizer import Detokenizer
from tokenwire.codec.maps import TokenizerMap, bundled_map_path, load_map_file, parse_hash
from tokenwire.errors import ConfigError, TokenwireError
from tokenwire.gateway.ir import (
    Event,
    Failure,
    FailureClass,
    Finish,
    FinishKind,
    GenerationRequest,
    IdsSource,
)
from tokenwire.gateway.upstreams.base import (
    ModelRoute,
    UpstreamConfig,
    UpstreamHealth,
    UpstreamState,
)
from tokenwire.gateway.upstreams.codec_native_wire import (
    CodecOptions,
    FrameTranslator,
    ModelWire,
    classify_exception,
    classify_http,
)
from tokenwire.gateway.upstreams.failures import fetch_capped, read_capped
from tokenwire.gateway.upstreams.http_transport import UpstreamClient, upstream_transport

__all__ = ["STREAM_QUEUE_DEPTH", "CodecNativeUpstream", "CodecOptions"]

log = logging.getLogger(__name__)

#: Events buffered between the task reading the upstream and the consumer. Enough to ride
#: out a slow client for a few coalescing windows; beyond it the reader waits, so a stalled
#: client applies backpressure to the upstream instead of growing memory without bound.
STREAM_QUEUE_DEPTH = 64
#: Connections beyond ``max_concurrent`` for probes and discovery GETs.
_SPARE_CONNECTIONS = 2


# -- the stream ------------------------------------------------------------------------------


class _CodecStream:
    """One generation. A task reads the upstream into a bounded queue; ``next_event`` waits
    on the queue, so cancelling that wait (the HTTP layer bounds it by its coalescing
    window) loses nothing, and ``cancel()`` cancels the task, whose ``finally`` closes the
    upstream response: the upstream sees the disconnect and stops generating."""

    def __init__(self, upstream: CodecNativeUpstream, wire: ModelWire | None,
                 request: GenerationRequest) -> None:
        self._up = upstream
        self._wire = wire
        self._req = request
        self._queue: asyncio.Queue[Event] = asyncio.Queue(maxsize=STREAM_QUEUE_DEPTH)
        self._task: asyncio.Task[None] | None = None
        self._cancelled = False

    async def next_event(self) -> Event:
        if self._task is None and not self._cancelled:  # submit() never blocks: start here
            self._task = asyncio.create_task(self._run(), name=f"codec-{self._req.request_id}")
            self._up._tasks.add(self._task)
            self._task.add_done_callback(self._up._tasks.discard)
        return await self._queue.get()

    def cancel(self) -> None:
        if self._cancelled:
            return
        self._cancelled = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
        while not self._queue.empty():  # the client is gone: undelivered deltas are moot
            self._queue.get_nowait()
        self._queue.put_nowait(Finish(reason=FinishKind.ABORT))

    async def _emit(self, event: Event) -> None:
        await self._queue.put(event)

    async def _run(self) -> None:
        try:
            if self._wire is None:
                await self._emit(self._up.unknown_model(self._req.model))
                return
            if self._wire.mismatch is not None:
                await self._emit(Failure(failure_class=FailureClass.UPSTREAM, status=502,
                                         message=self._wire.mismatch,
                                         code="tokenizer_map_mismatch"))
                return
            async with self._up._slots:
                await self._generate(self._wire)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every stream ends with a terminal, whatever broke
            failure = classify_exception(exc, self._up.name)
            if failure.failure_class is FailureClass.INTERNAL:
                log.error("codec upstream %s: unexpected %s", self._up.name, type(exc).__name__)
            await self._emit(failure)

    async def _generate(self, wire: ModelWire) -> None:
        opened = await self._open(wire)
        if opened is None:
            return
        resp, path = opened
        try:
            head = wire.check_head(resp.headers)
            zdict, tmap = await adrive(wire.needs_flow(head), self._up._http)
            # Stop strings match on text, so they need it even for an ids-only client.
            needs_text = self._req.want_text or not self._req.want_ids or bool(self._req.stop)
            if needs_text and tmap is None:
                await self._emit(Failure(
                    failure_class=FailureClass.UPSTREAM, status=502, code="no_tokenizer_map",
                    message=f"upstream {self._up.name!r} names no tokenizer map for model "
                            f"{wire.name!r} and none is configured: text cannot be produced"))
                return
            decoder = wire.decoder(path, head, zdict)
            detok = self._up._detokenizer(tmap) if needs_text and tmap is not None else None
            translator = FrameTranslator(self._req, detok,
                                         max_id=tmap.max_id if tmap is not None else None)
            await self._pump(resp, decoder, translator)
        finally:
            await resp.aclose()

    async def _open(self, wire: ModelWire) -> tuple[httpx.Response, str] | None:
        """Send the request (Path C -> B fallback); a non-200 becomes a Failure."""
        attempts = wire.attempts(self._req)
        for i, (path, url, headers, body) in enumerate(attempts):
            request = self._up._http.build_request(
                "POST", url, headers={**headers, **self._up._auth_headers()}, content=body)
            resp = await self._up._http.send(request, stream=True)
            if resp.status_code == 200:
                return resp, path
            try:
                error_body = await read_capped(resp)
            finally:
                await resp.aclose()
            if resp.status_code == 404 and path == "c" and i + 1 < len(attempts):
                continue  # §2.1: Path C is optional; a 404 means "use Path B"
            await self._emit(classify_http(resp.status_code, resp.headers, error_body,
                                           self._up.name))
            return None
        return None  # pragma: no cover - the last attempt always returns above

    async def _pump(self, resp: httpx.Response, decoder: ResponseDecoder,
                    tr: FrameTranslator) -> None:
        async for raw in resp.aiter_raw():
            for chunk in decoder.feed(raw):
                if await self._deliver(tr, chunk):
                    return  # the terminal is out; trailing bytes are not ours to judge
        for chunk in decoder.feed_eof():  # raises TruncatedStream without done=true
            if await self._deliver(tr, chunk):
                return
        await self._emit(tr.missing_terminal())  # pragma: no cover - feed_eof raised

    async def _deliver(self, tr: FrameTranslator, chunk: TokenChunk) -> bool:
        for event in tr.on_chunk(chunk):
            await self._emit(event)
        return tr.finished


class _Secret:
    """A credential that never shows in a repr, a log line or a traceback's locals."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def __repr__(self) -> str:
        return "<secret>"

    def reveal(self) -> str:
        return self._value


# -- the adapter -----------------------------------------------------------------------------


class CodecNativeUpstream:
    """Every model of one Codec-native upstream (implements :class:`~.ir.Upstream`)."""

    kind = "codec"
    ids_source = IdsSource.UPSTREAM
    #: A Codec engine counts its own ids and answers a typed overflow error before it
    #: streams: the router does not tokenize the prompt to count it again.
    checks_context_itself = True

    def __init__(self, config: UpstreamConfig, opts: CodecOptions, http: httpx.AsyncClient,
                 maps: Mapping[str, TokenizerMap], api_key: str | None) -> None:
        self.name = config.name
        self.base_url = _origin_base(config.base_url)
        self.options = opts
        self._config = config
        self._http = http
        self._api_key = _Secret(api_key) if api_key else None
        self._cache = DiscoveryCache()
        self._slots = asyncio.Semaphore(max(1, config.max_concurrent))
        self._tasks: set[asyncio.Task[None]] = set()
        self._wires: dict[str, ModelWire] = {}
        for route in config.models:
            tmap = _configured_map(route, maps)
            self._wires[route.name] = ModelWire(
                self.base_url, opts, name=route.name, sent_as=route.sent_as, tmap=tmap,
                map_id=route.map_id, cache=self._cache)
        self.model_id = config.models[0].name if config.models else ""

    @staticmethod
    def parse_options(upstream: str, options: Mapping[str, object]) -> CodecOptions:
        """``[upstreams.options]`` checked when the config is read (and in from_config)."""
        return CodecOptions.parse(upstream, options)

    @classmethod
    def from_config(cls, config: UpstreamConfig, *,
                    transport: httpx.AsyncBaseTransport | None = None,
                    maps: Mapping[str, TokenizerMap] | None = None) -> CodecNativeUpstream:
        if config.kind != "codec":
            raise ConfigError(f"upstream {config.name!r} is kind {config.kind!r}, not 'codec'")
        if not config.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"upstream {config.name!r}: base_url must be an http(s) URL")
        opts = CodecOptions.parse(config.name, config.options)
        api_key = None
        if config.api_key_env:
            api_key = os.environ.get(config.api_key_env)
            if not api_key:
                raise ConfigError(f"upstream {config.name!r}: environment variable "
                                  f"{config.api_key_env} is not set")
        most = config.max_concurrent + _SPARE_CONNECTIONS
        http = UpstreamClient(
            transport=transport or upstream_transport(most),
            timeout=httpx.Timeout(config.read_timeout_s, connect=config.connect_timeout_s),
            limits=httpx.Limits(max_connections=most),
            headers=dict(config.headers),
        )
        return cls(config, opts, http, maps or {}, api_key)

    def __repr__(self) -> str:
        return f"CodecNativeUpstream(name={self.name!r}, base_url={self.base_url!r})"

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self._wires)

    def tokenizer_map(self, model: str) -> TokenizerMap | None:
        """The model's map: configured, or found by ``probe()``; ``None`` when unknown."""
        wire = self._wires.get(model)
        return wire.tmap if wire is not None else None

    def submit(self, request: GenerationRequest) -> _CodecStream:
        return _CodecStream(self, self._wire_for(request.model), request)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._http.aclose()

    # -- helpers used by the stream ------------------------------------------------------

    def _wire_for(self, model: str) -> ModelWire | None:
        if not model and len(self._wires) == 1:
            return next(iter(self._wires.values()))
        return self._wires.get(model)

    def unknown_model(self, model: str) -> Failure:
        return Failure(failure_class=FailureClass.INVALID_REQUEST, status=404,
                       code="model_not_found",
                       message=f"model {model!r} is not served by upstream {self.name!r}; "
                               f"it serves {', '.join(map(repr, self._wires)) or 'nothing'}")

    def _auth_headers(self) -> dict[str, str]:
        # Only on requests to the upstream itself, never on discovery GETs: a map pointer
        # may send us to a CDN, which must not see the key.
        return {"Authorization": f"Bearer {self._api_key.reveal()}"} if self._api_key else {}

    def _detokenizer(self, tmap: TokenizerMap) -> Any:
        return Detokenizer(tmap).stream()

    # -- probe -----------------------------------------------------------------------------

    async def probe(self) -> UpstreamHealth:
        """GET ``/v1/models``; check every model is served and its map is the one we use,
        fetching the upstream's map by discovery for models configured without one."""
        try:
            status, headers, body = await self._get_models()
        except httpx.HTTPError as exc:
            return self._health(UpstreamState.DOWN, (), f"GET /v1/models failed: "
                                                        f"{type(exc).__name__}: {exc}")
        if status != 200:
            failure = classify_http(status, headers, body, self.name)
            return self._health(UpstreamState.DOWN, (), failure.message)
        advertised = _advertised_maps(body)
        served = tuple(advertised)
        if not self._config.models:  # nothing configured: serve what the upstream serves
            for name in served:
                self._wires.setdefault(name, ModelWire(
                    self.base_url, self.options, name=name, sent_as=name, tmap=None,
                    map_id=None, cache=self._cache))
            self.model_id = self.model_id or next(iter(self._wires), "")
        problems = []
        for wire in self._wires.values():
            problem = await self._check_model(wire, served, advertised)
            if problem:
                problems.append(problem)
        state = UpstreamState.DEGRADED if problems else UpstreamState.UP
        return self._health(state, served, "; ".join(problems))

    async def _get_models(self) -> tuple[int, httpx.Headers, bytes]:
        """``/v1/models``, read no further than :data:`MAX_LISTING_BYTES` (the peer sets its
        length)."""
        return await fetch_capped(self._http, "GET", f"{self.base_url}/v1/models",
                                  headers=self._auth_headers())

    async def _check_model(self, wire: ModelWire, served: tuple[str, ...],
                           advertised: dict[str, str | None]) -> str:
        sent_as = wire.model or wire.name
        if served and sent_as not in served:
            return f"model {sent_as!r} is not served upstream (it serves {', '.join(served)})"
        upstream_hash = advertised.get(sent_as)
        if wire.tmap is not None:
            if upstream_hash is not None and upstream_hash != wire.tmap.hash:
                wire.mismatch = (f"upstream {self.name!r} serves {sent_as!r} with map "
                                 f"{upstream_hash}, but {wire.tmap.id} ({wire.tmap.hash}) is "
                                 "configured: its ids would be decoded wrong (§2.7)")
                return wire.mismatch
            wire.mismatch = None
            return ""
        try:
            wire.pin(await adrive(self._map_flow(wire, upstream_hash), self._http))
        except TokenwireError as exc:
            return f"model {wire.name!r}: no tokenizer map configured and discovery failed: {exc}"
        return ""

    def _map_flow(self, wire: ModelWire, digest: str | None) -> Any:
        allow = wire.allow_http
        if digest is not None:
            return map_by_hash_flow(wire.origin, digest, allow_http=allow, cache=self._cache)
        if wire.map_id is not None:
            return map_flow(wire.origin, wire.map_id, allow_http=allow, cache=self._cache)
        return _single_index_map(wire.origin, allow, self._cache)

    def _health(self, state: UpstreamState, served: tuple[str, ...], detail: str) -> UpstreamHealth:
        return UpstreamHealth(name=self.name, kind=self.kind, state=state, models=served,
                              detail=detail)


def _single_index_map(origin: str, allow_http: bool, cache: DiscoveryCache) -> Any:
    entries = yield from index_flow(origin, allow_http=allow_http)
    if len(entries) != 1:
        raise ConfigError(f"{origin} lists {len(entries)} maps in index.json; configure "
                          "map_id for the model")
    return (yield from map_by_hash_flow(origin, entries[0][1], allow_http=allow_http,
                                        cache=cache))


def _advertised_maps(body: bytes) -> dict[str, str | None]:
    """``/v1/models`` ids -> the map hash a tokenwire upstream lists (``codec_tokenizer_map``)."""
    try:
        doc = json.loads(body)
        out: dict[str, str | None] = {}
        for entry in doc.get("data", []):
            info = entry.get("codec_tokenizer_map")
            digest = info.get("hash") if isinstance(info, dict) else None
            out[str(entry["id"])] = parse_hash(digest) if isinstance(digest, str) else None
        return out
    except (ValueError, TypeError, KeyError, AttributeError):
        return {}


def _configured_map(route: ModelRoute, maps: Mapping[str, TokenizerMap]) -> TokenizerMap | None:
    """The route's map from ``maps`` (by model name, map id or path), else loaded here."""
    for key in (route.name, route.map_id, route.map_path):
        if key is not None and key in maps:
            return maps[key]
    if route.map_path:
        return load_map_file(route.map_path)
    if route.map_id:
        try:
            return load_map_file(bundled_map_path(route.map_id))
        except TokenwireError:
            return None  # not bundled: probe() resolves it by id at the upstream
    return None


_V1_SUFFIX = re.compile(r"/v1/?$")


def _origin_base(url: str) -> str:
    """Accept ``http://host:port`` and the OpenAI-style ``http://host:port/v1`` alike."""
    return _V1_SUFFIX.sub("", url.rstrip("/"))
