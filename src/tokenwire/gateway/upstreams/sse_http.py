"""What the HTTP+SSE upstream adapters share (Responses and Anthropic Messages).

* :class:`SSEUpstreamStream`: one generation as one ``POST`` whose ``text/event-stream``
  body goes through :class:`~tokenwire.gateway.sse.SSEDecoder` and an adapter's sans-IO
  parser (``on_sse(event) -> list[Event]``, ``on_eof()``) into IR events, with cancellation
  and transport failures handled once.
* Failure classification from structured fields: HTTP status, the error body's
  ``type``/``code``, ``Retry-After``; context-overflow wording is read only as the last
  resort, and only its counts are kept (gateway-research §3.2/§3.3).
* API keys from the environment, the per-upstream ``httpx.AsyncClient``, and the
  ``GET .../models`` probe.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import re
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

import httpx
import msgspec

from tokenwire.errors import ConfigError, RemoteProtocolError
from tokenwire.gateway.ir import Event, Failure, FailureClass, Finish, FinishKind, is_terminal
from tokenwire.gateway.sse import SSEDecoder, SSEEvent
from tokenwire.gateway.upstreams.base import UpstreamConfig, UpstreamHealth, UpstreamState

__all__ = [
    "MAX_ERROR_BODY_BYTES",
    "FailedStream",
    "HttpClassifier",
    "SSEUpstreamStream",
    "StreamParser",
    "api_key_from_env",
    "context_overflow_counts",
    "error_fields",
    "failure_from_status",
    "http_client",
    "probe_models",
    "retry_after_seconds",
]

log = logging.getLogger(__name__)

#: An error body is a small JSON object; a proxy's HTML error page can be large. 64 KiB keeps
#: every real error message and bounds what a broken upstream makes us buffer.
MAX_ERROR_BODY_BYTES = 64 * 1024


# -- failure classification --------------------------------------------------------------------

#: HTTP status -> (class, status we answer with). Our own credentials being refused, or the
#: upstream failing, is the gateway's problem (502), not the client's.
_STATUS_CLASSES: dict[int, tuple[FailureClass, int]] = {
    400: (FailureClass.INVALID_REQUEST, 400),
    401: (FailureClass.AUTHENTICATION, 502),
    402: (FailureClass.QUOTA, 402),
    403: (FailureClass.AUTHENTICATION, 502),
    404: (FailureClass.INVALID_REQUEST, 404),
    408: (FailureClass.TIMEOUT, 504),
    413: (FailureClass.INVALID_REQUEST, 413),
    422: (FailureClass.INVALID_REQUEST, 400),
    429: (FailureClass.RATE_LIMITED, 429),
    500: (FailureClass.UPSTREAM, 502),
    502: (FailureClass.UPSTREAM, 502),
    503: (FailureClass.CAPACITY, 503),
    504: (FailureClass.TIMEOUT, 504),
    529: (FailureClass.CAPACITY, 503),  # Anthropic "overloaded"
}

# Context-overflow wordings (gateway-research §3.2/§3.3), the last resort when an upstream
# gives no machine-readable code. Only the counts are kept.
_OVERFLOW_WITH_COUNTS = (
    re.compile(r"prompt is too long: (?P<prompt>\d+) tokens > (?P<ctx>\d+)"),
    re.compile(r"exceed context limit: (?P<prompt>\d+) \+ \d+ > (?P<ctx>\d+)"),
    re.compile(r"maximum context length is (?P<ctx>\d+) tokens.*?"
               r"(?:resulted in|requested|has|contains(?: \(at least\))?) (?P<prompt>\d+)",
               re.S),
)
_OVERFLOW_WORDS = re.compile(
    r"prompt is too long|maximum context length|context length|context window|"
    r"exceed(?:s)? (?:the )?(?:available )?context", re.I)


def context_overflow_counts(message: str) -> tuple[int | None, int | None] | None:
    """``(prompt_tokens, context_tokens)`` if ``message`` reports a context overflow."""
    for pattern in _OVERFLOW_WITH_COUNTS:
        if m := pattern.search(message):
            return int(m["prompt"]), int(m["ctx"])
    return (None, None) if _OVERFLOW_WORDS.search(message) else None


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """``retry-after-ms`` (OpenAI), else ``Retry-After`` as seconds or an HTTP date."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(float(ms) / 1000.0, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max((when - datetime.datetime.now(datetime.UTC)).total_seconds(), 0.0)


def failure_from_status(
    status: int, message: str, *, code: str | None = None,
    known: tuple[FailureClass, int] | None = None, retry_after: float | None = None,
) -> Failure:
    """A Failure for an HTTP error: ``known`` (from the body's code) wins over the status;
    a 400 whose message reports a context overflow is ``CONTEXT_LENGTH`` with its counts."""
    cls, answer = known or _STATUS_CLASSES.get(
        status, (FailureClass.INVALID_REQUEST, 400) if status < 500
        else (FailureClass.UPSTREAM, 502))
    prompt = ctx = None
    if cls in (FailureClass.INVALID_REQUEST, FailureClass.CONTEXT_LENGTH) and status in (
            400, 413):
        counts = context_overflow_counts(message)
        if counts is not None:
            cls, answer, (prompt, ctx) = FailureClass.CONTEXT_LENGTH, 400, counts
    return Failure(failure_class=cls, message=message or f"upstream answered HTTP {status}",
                   status=answer, retry_after=retry_after, code=code, prompt_tokens=prompt,
                   context_tokens=ctx)


def error_fields(body: bytes) -> tuple[str, str | None, str | None]:
    """``(message, code, type)`` from an ``{"error": {...}}`` body (OpenAI and Anthropic)."""
    try:
        obj = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return body[:500].decode("utf-8", "replace").strip(), None, None
    err = obj.get("error", obj) if isinstance(obj, dict) else {}
    if not isinstance(err, dict):
        return str(err), None, None
    code, kind = err.get("code"), err.get("type")
    return (str(err.get("message") or ""), None if code is None else str(code),
            None if kind is None else str(kind))


# -- the HTTP side of one generation ------------------------------------------------------------


class StreamParser(Protocol):
    def on_sse(self, sse: SSEEvent) -> list[Event]: ...

    def on_eof(self) -> list[Event]: ...


#: ``(status, headers, body) -> Failure`` for a non-2xx answer.
HttpClassifier = Callable[[int, httpx.Headers, bytes], Failure]


class SSEUpstreamStream:
    """One generation over one SSE response (:class:`~tokenwire.gateway.ir.EventStream`).

    ``submit`` must not block, so the request starts on the first :meth:`next_event`, in a
    task that reads the body and queues events: a cancelled wait then loses nothing.
    :meth:`cancel` cancels that task, which closes the upstream response (the upstream sees
    the disconnect and stops generating), and the stream ends with ``ABORT``. The task stops
    reading at the first terminal event.
    """

    def __init__(self, *, client: httpx.AsyncClient, url: str, body: Any, parser: StreamParser,
                 classify_http: HttpClassifier, on_done: Callable[[], None]) -> None:
        self._client, self._url, self._body = client, url, body
        self.parser, self._classify_http, self._on_done = parser, classify_http, on_done
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._finished = False  # a terminal has been queued
        self._seen_bytes = False

    async def next_event(self) -> Event:
        if self._task is None and not self._finished:
            self._task = asyncio.get_running_loop().create_task(self._run())
        return await self._queue.get()

    def cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._put(Finish(reason=FinishKind.ABORT))

    def _put(self, event: Event) -> bool:
        """Queue ``event`` unless the stream already ended; True once it has ended."""
        if self._finished:
            return True
        self._queue.put_nowait(event)
        if is_terminal(event):
            self._finished = True
            self._on_done()
        return self._finished

    def _put_all(self, events: list[Event]) -> bool:
        return any(self._put(ev) for ev in events)

    async def _run(self) -> None:
        try:
            await self._exchange()
        except asyncio.CancelledError:
            raise
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            self._put(_transport_failure(FailureClass.CONNECTION, "could not connect", exc))
        except httpx.TimeoutException as exc:
            self._put(_transport_failure(FailureClass.TIMEOUT, "timed out", exc, 504))
        except httpx.TransportError as exc:
            cls = FailureClass.UPSTREAM if self._seen_bytes else FailureClass.CONNECTION
            self._put(_transport_failure(cls, "connection lost", exc))
        except RemoteProtocolError as exc:  # the SSE decoder: an oversized or cut-off line
            self._put(_transport_failure(FailureClass.UPSTREAM, "malformed event stream", exc))
        except Exception as exc:  # a bug here must still end the stream
            log.exception("upstream stream handler failed")
            self._put(_transport_failure(FailureClass.INTERNAL, "internal error", exc, 500))
        finally:
            self._put(Failure(failure_class=FailureClass.UPSTREAM, status=502,
                              message="the upstream stream ended without a terminal event"))

    async def _exchange(self) -> None:
        async with self._client.stream("POST", self._url, json=self._body) as resp:
            if resp.status_code >= 400:
                body = await _read_capped(resp, MAX_ERROR_BODY_BYTES)
                self._put(self._classify_http(resp.status_code, resp.headers, body))
                return
            ctype = resp.headers.get("content-type", "")
            if "text/event-stream" not in ctype:
                self._put(Failure(failure_class=FailureClass.UPSTREAM, status=502,
                                  message=f"expected text/event-stream, got {ctype!r}"))
                return
            decoder = SSEDecoder()
            async for chunk in resp.aiter_bytes():
                self._seen_bytes = True
                for sse in decoder.feed(chunk):
                    if self._put_all(self.parser.on_sse(sse)):
                        return
            for sse in decoder.feed_eof():
                if self._put_all(self.parser.on_sse(sse)):
                    return
            self._put_all(self.parser.on_eof())


class FailedStream:
    """A request that cannot be sent (e.g. token ids to a text-only API): one Failure."""

    def __init__(self, failure: Failure) -> None:
        self._failure = failure

    async def next_event(self) -> Event:
        return self._failure

    def cancel(self) -> None:
        pass


def _transport_failure(cls: FailureClass, what: str, exc: BaseException,
                       status: int = 502) -> Failure:
    # httpx messages name the URL at most, never headers, so no key can leak through them.
    return Failure(failure_class=cls, status=status,
                   message=f"upstream {what}: {type(exc).__name__}: {exc}".rstrip(": "))


async def _read_capped(resp: httpx.Response, limit: int) -> bytes:
    out = bytearray()
    async for chunk in resp.aiter_bytes():
        out += chunk[: limit - len(out)]
        if len(out) >= limit:
            break
    return bytes(out)





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
    limits = httpx.Limits(max_connections=config.max_concurrent + 1)  # + 1 for probes
    return httpx.AsyncClient(headers={**headers, **dict(config.headers)}, timeout=timeout,
                             limits=limits, transport=transport)



async def probe_models(client: httpx.AsyncClient, url: str, upstream: Any) -> UpstreamHealth:
    """GET the upstream's model list: DOWN if unreachable or refused, DEGRADED if one of
    the configured models is missing from it, else UP."""
    config: UpstreamConfig = upstream.config
    names = tuple(m.name for m in config.models)

    def health(state: UpstreamState, detail: str, models: tuple[str, ...] = ()) -> UpstreamHealth:
        return UpstreamHealth(name=config.name, kind=config.kind, state=state, models=models,
                              detail=detail)

    try:
        resp = await client.get(url)
    except httpx.HTTPError as exc:
        return health(UpstreamState.DOWN, f"unreachable: {type(exc).__name__}: {exc}")
    if resp.status_code in (401, 403):
        return health(UpstreamState.DOWN, f"the upstream refused our key (HTTP {resp.status_code})")
    if resp.status_code >= 400:
        return health(UpstreamState.DEGRADED, f"model listing failed (HTTP {resp.status_code})",
                      names)
    try:
        listed = {str(m.get("id")) for m in msgspec.json.decode(resp.content).get("data", ())}
    except (msgspec.DecodeError, AttributeError, TypeError):
        return health(UpstreamState.DEGRADED, "the model listing is not the expected JSON", names)
    missing = [m.name for m in config.models if m.sent_as not in listed]
    present = tuple(n for n in names if n not in missing)
    if missing:
        return health(UpstreamState.DEGRADED, "not listed upstream: " + ", ".join(missing),
                      present)
    return health(UpstreamState.UP, "", present)
