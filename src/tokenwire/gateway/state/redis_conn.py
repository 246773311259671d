"""The one Redis connection of a gateway process: deadlines, degraded mode, recovery.

Everything the gateway shares with its other instances (stored responses, pins, limits,
breakers) goes through one :class:`RedisConn`, built from ``[state]``
(``state/config.py``). Its rules:

- **Every call has a deadline** (``[state] timeout_ms``, default 250 ms,
  :data:`~tokenwire.gateway.state.config.DEFAULT_TIMEOUT_MS` says why), enforced around the
  whole call (connect, send, reply), and redis-py's own retries are off: a retry belongs to
  the caller, which knows whether the request can wait.
- **One immediate retry, only where it cannot count twice**: a call whose command never left this
  process (the pooled socket was already reset: redis-py raises ``ConnectionError`` from
  ``send_packed_command``, which :func:`_marking_sends` marks; a refused connect happens in the
  pool, before that, and is not retried) is sent once more on a fresh connection, inside the same
  deadline; so is any call its caller declares ``idempotent`` (a GET, a SET of the same value). A
  call that failed after its command was written (the reply was lost: the connection closed, a read
  timed out) is not retried unless idempotent: Redis may have run it, and an ``INCR`` or the
  limiter's charging script run twice counts twice. redis-py itself says which case happened only in
  the message text ("while writing to socket" / "while reading from"), so the distinction is made
  where it is certain, at the send.
- **A failing Redis makes the connection "degraded"** and requests stop waiting on it: while
  degraded, :meth:`RedisConn.call` raises :class:`StateUnavailable` at once, without I/O,
  except for one probe call every backoff period (0.5 s doubling to 5 s). Each piece of state
  then does its documented degraded thing (local-only limits, "store unavailable").
- **It recovers by itself**: the first probe that succeeds makes it "up" again. Transitions,
  never requests, produce the log lines (one WARNING each way: degraded, recovered) and
  move ``tokenwire_state_up``.
- **A refusal of one key's data is not a failing Redis.** ``WRONGTYPE``, or a script's error
  on a value it cannot read (another application, or another tokenwire version, wrote under
  the prefix), means Redis answered: it fails that call only (:class:`StateDataError`, a
  ``StateUnavailable``, so each caller's degraded behaviour applies to it), is counted
  (``outcome="data_error"``), shown in ``/health`` and logged at most once a minute, and is
  neither retried nor the cause of a degraded connection. Degrading on it took every piece
  of shared state down with the one key, for as long as the key stayed (a foreign value
  under the index or a lease set has no expiry: for good).

The up/degraded decisions are :class:`LinkHealth`, a sans-IO state machine that is given the
time (tests drive it with a fake clock); :class:`RedisConn` does the I/O around it. The
``redis`` package is imported only when a connection is built, so a gateway without
``[state]`` never loads it.

Callers pass an operation ``op(client)`` that does **one round trip** (one command, or one
pipeline): :meth:`RedisConn.call` counts round trips (``calls``, the
``tokenwire_state_calls_total`` series), which is how the per-request count is measured.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tokenwire.gateway.state.config import StateConfig

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = [
    "INITIAL_BACKOFF_S",
    "MAX_BACKOFF_S",
    "MAX_CONNECTIONS",
    "NEVER_SENT",
    "LinkHealth",
    "RedisConn",
    "StateDataError",
    "StateUnavailable",
]

T = TypeVar("T")

#: The attribute :func:`_marking_sends` sets on an error raised before the command was sent.
NEVER_SENT: Final = "tokenwire_never_sent"

log = logging.getLogger("tokenwire.state")

#: The first re-check after Redis fails: short, because a restart or a failover usually
#: completes within a second and every skipped call is degraded service.
INITIAL_BACKOFF_S: Final = 0.5
#: The longest wait between re-checks: a Redis that stays down costs one probe call (at most
#: one deadline of one request) per 5 s, and recovery is noticed within 5 s of it returning.
MAX_BACKOFF_S: Final = 5.0
#: Connections to Redis per gateway process. Calls take well under a millisecond each, so 64
#: carry tens of thousands of calls a second; a bound keeps a stalled Redis from collecting
#: one socket per waiting request (the wait for a free one counts against the deadline).
MAX_CONNECTIONS: Final = 64
#: At most one log line per this many seconds about data Redis refused (a foreign value under
#: the prefix is refused on every call that touches it: per call, it would flood the log).
DATA_ERROR_LOG_S: Final = 60.0


class StateUnavailable(Exception):
    """Redis could not be used for this call: it is known to be down (``skipped``), or the
    call failed or missed its deadline. The caller falls back to its degraded behaviour."""

    def __init__(self, reason: str, *, skipped: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.skipped = skipped


class StateDataError(StateUnavailable):
    """Redis answered, refusing this call because of the value under one of its keys (not a
    value of ours: ``WRONGTYPE``, or a script's error on it). The connection is fine; only
    calls touching that key fail."""


@dataclass(slots=True)
class LinkHealth:
    """Up or degraded, and when the next probe of a degraded Redis may go (sans-IO).

    :meth:`admit` is asked before each call: ``"call"`` (up), ``"probe"`` (degraded, and a
    re-check is due: this one call goes through), or None (degraded: skip, no I/O). The call's
    result is reported with :meth:`succeeded`, :meth:`failed` or :meth:`abandoned`; the first
    two return True when they changed the state (the caller logs transitions only).
    """

    initial_backoff_s: float = INITIAL_BACKOFF_S
    max_backoff_s: float = MAX_BACKOFF_S
    up: bool = True
    since: float = 0.0
    next_check: float = 0.0
    backoff_s: float = 0.0
    probing: bool = False

    def admit(self, now: float) -> str | None:
        if self.up:
            return "call"
        if self.probing or now < self.next_check:
            return None
        self.probing = True
        return "probe"

    def succeeded(self, now: float, kind: str) -> bool:
        if kind == "probe":
            self.probing = False
        if self.up:
            return False
        # A success is proof Redis answers, whether from the probe or from a call that was
        # already under way when another one failed.
        self.up, self.since, self.backoff_s = True, now, 0.0
        return True

    def failed(self, now: float, kind: str) -> bool:
        if kind == "probe":
            # Free the probe's slot first: a call sent before Redis went down (a deadline
            # longer than the first re-check) may have answered while the probe ran, making
            # the link up again; left taken, no probe was ever admitted again.
            self.probing = False
        if self.up:
            self.up, self.since = False, now
            self.backoff_s = self.initial_backoff_s
            self.next_check = now + self.backoff_s
            return True
        if kind == "probe":
            # Only a failed probe lengthens the wait: calls that were in flight when Redis
            # went down fail together and must not multiply the backoff.
            self.backoff_s = min(self.backoff_s * 2, self.max_backoff_s)
            self.next_check = now + self.backoff_s
        return False

    def abandoned(self, kind: str) -> None:
        """The call was cancelled (its client went away): a probe may be sent again."""
        if kind == "probe":
            self.probing = False


def _transport_errors() -> tuple[type[BaseException], ...]:
    from redis.exceptions import RedisError
    # OSError: refused or reset sockets that escape redis-py's wrapping; TimeoutError: the
    # deadline (asyncio.timeout raises the builtin).
    return (RedisError, OSError, TimeoutError)


class RedisConn:
    """The process's Redis client behind a deadline and the degraded-mode gate.

    ``call(op)`` runs ``op(client)`` (one round trip) or raises :class:`StateUnavailable`;
    ``key(*parts)`` builds a key under the configured prefix; ``up``, ``snapshot()`` and
    ``collector()`` report the state for ``/health`` and ``/metrics``. ``client=`` injects
    a client (tests); ``clock`` drives the backoff.
    """

    def __init__(self, config: StateConfig, *, client: Redis | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.prefix = config.key_prefix
        self._clock = clock
        self.health = LinkHealth(since=clock())
        self._client = client if client is not None else _build_client(config)
        self._errors = _transport_errors()
        #: Round trips attempted (``outcome`` ok / error / data_error) and calls skipped
        #: while degraded.
        self.counts: dict[str, int] = {"ok": 0, "error": 0, "data_error": 0, "skipped": 0}
        self.transitions = 0
        self.last_error: str | None = None
        self.last_data_error: str | None = None
        self._data_error_logged_at: float | None = None
        self._data_errors_unlogged = 0

    @property
    def up(self) -> bool:
        return self.health.up

    @property
    def calls(self) -> int:
        """Round trips sent to Redis so far (the per-request count is a difference)."""
        return self.counts["ok"] + self.counts["error"] + self.counts["data_error"]

    def key(self, *parts: str) -> str:
        """``<key_prefix>part1:part2...``: every key this gateway writes goes through it."""
        return self.prefix + ":".join(parts)

    def retry_in(self) -> float:
        """Seconds until a degraded connection's next re-check (0 when up): a
        ``Retry-After`` for answers that needed Redis."""
        if self.up:
            return 0.0
        return max(0.0, self.health.next_check - self._clock())

    async def call(self, op: Callable[[Redis], Awaitable[T]], *,
                   idempotent: bool = False) -> T:
        """``op(client)``, one round trip, within the deadline. ``idempotent``: running it
        twice has the effect of running it once, so it may be retried even when the failed
        attempt's command may have reached Redis (see the module docstring)."""
        kind = self.health.admit(self._clock())
        if kind is None:
            self.counts["skipped"] += 1
            raise StateUnavailable("redis is degraded; re-check pending", skipped=True)
        try:
            async with asyncio.timeout(self.config.timeout_s):
                result = await self._once_more_if_safe(op, idempotent)
        except self._errors as exc:
            if _is_data_error(exc):
                self._data_error(exc)
                self._answered(kind)  # as much proof that Redis is up as a success
                raise StateDataError(f"redis refused the data: {_describe(exc)}") from exc
            self.counts["error"] += 1
            self._failed(exc, kind)
            raise StateUnavailable(f"redis call failed: {_describe(exc)}") from exc
        except BaseException:
            # Cancelled (the client went away), or the operation's own error, not Redis's:
            # it says nothing about Redis, and a probe's slot must not stay taken.
            self.health.abandoned(kind)
            raise
        self.counts["ok"] += 1
        self._answered(kind)
        return result

    def _answered(self, kind: str) -> None:
        if self.health.succeeded(self._clock(), kind):
            self.transitions += 1
            # WARNING as the degraded line is, so that whoever sees one sees the other.
            log.warning("shared state recovered: redis at %s answers again; shared state "
                        "resumes", self.config.display_url)

    async def _once_more_if_safe(self, op: Callable[[Redis], Awaitable[T]],
                                 idempotent: bool) -> T:
        try:
            return await op(self._client)
        except self._errors as exc:
            if _is_data_error(exc) or not (idempotent or getattr(exc, NEVER_SENT, False)):
                raise
        # redis-py has dropped the failed connection: the pool hands out a fresh one.
        return await op(self._client)

    def _failed(self, exc: BaseException, kind: str) -> None:
        self.last_error = _describe(exc)
        if self.health.failed(self._clock(), kind):
            self.transitions += 1
            log.warning("shared state degraded: redis at %s failed (%s); serving without "
                        "it (see README \"Shared state\"), re-checking every %.1f-%.0f s",
                        self.config.display_url, self.last_error,
                        self.health.initial_backoff_s, self.health.max_backoff_s)

    def _data_error(self, exc: BaseException) -> None:
        self.counts["data_error"] += 1
        self.last_data_error = _describe(exc)
        now = self._clock()
        last = self._data_error_logged_at
        if last is not None and now - last < DATA_ERROR_LOG_S:
            self._data_errors_unlogged += 1
            return
        more = (f" ({self._data_errors_unlogged} more since the last line)"
                if self._data_errors_unlogged else "")
        self._data_error_logged_at, self._data_errors_unlogged = now, 0
        log.warning("shared state: redis at %s refused a value under the key prefix %r (%s)%s; "
                    "something other than this tokenwire version writes there; the calls "
                    "touching it fail, the rest of the shared state is unaffected",
                    self.config.display_url, self.prefix, self.last_data_error, more)

    async def check(self) -> bool:
        """One PING when Redis is up or a re-check is due (``/health``, start-up); whether
        Redis is up afterwards. Never raises."""
        try:
            await self.call(lambda r: r.ping(), idempotent=True)
        except StateUnavailable:
            pass
        return self.up

    def snapshot(self) -> dict[str, Any]:
        """``/health``'s ``state`` entry: the backend, its URL without password, up or
        degraded, and the last error while degraded."""
        body: dict[str, Any] = {"backend": "redis", "url": self.config.display_url,
                                "key_prefix": self.prefix,
                                "state": "up" if self.up else "degraded",
                                "since_s": round(max(0.0, self._clock() - self.health.since), 3)}
        if not self.up and self.last_error:
            body["last_error"] = self.last_error
        if self.last_data_error:
            body["data_errors"] = self.counts["data_error"]
            body["last_data_error"] = self.last_data_error
        return body

    def collector(self) -> Collector:
        """The ``tokenwire_state_*`` series, read at scrape time (register it once)."""
        return _StateCollector(self)

    async def aclose(self) -> None:
        try:
            await self._client.aclose()
        except self._errors:
            pass  # closing a connection to a dead Redis has nothing left to do


#: The code a Redis error reply starts with (``NOREPLICAS ...``); redis-py strips ``ERR``.
_ERROR_CODE: Final = re.compile(r"[A-Z]+ ")


def _is_data_error(exc: BaseException) -> bool:
    """An error reply about a value, not about Redis: ``WRONGTYPE`` (a command, or a
    script's ``redis.call``) or a script's runtime error (arithmetic on a value that is not a
    number). Replies about the server itself (``OOM``, ``READONLY``, ``LOADING``, ``BUSY``,
    ``NOAUTH``, ``MISCONF``...) are not: they degrade the connection as before."""
    from redis.exceptions import ResponseError
    if type(exc) is not ResponseError:
        return False
    text = str(exc)
    if text.startswith("WRONGTYPE"):
        return True
    # A script's error on a value is an ``ERR`` reply, which redis-py gives without its code
    # ("user_script:3: attempt to ...", "value is not an integer ... script: ..."). A reply
    # with a code of its own (``NOREPLICAS``, ``MISCONF``: the ones redis-py has no class
    # for) is about the server, whether a command or a script's ``redis.call`` met it: Redis
    # only appends "script: ..., on @user_script:N." to the latter.
    return "user_script:" in text and _ERROR_CODE.match(text) is None


def _describe(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _build_client(config: StateConfig) -> Redis:
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    extra: dict[str, Any] = {}
    if config.tls and config.tls_ca_file:
        extra["ssl_ca_certs"] = config.tls_ca_file
    if config.password is not None:
        extra["password"] = config.password
    pool = aioredis.BlockingConnectionPool.from_url(
        config.url, max_connections=MAX_CONNECTIONS, timeout=None,
        socket_timeout=config.timeout_s, socket_connect_timeout=config.timeout_s,
        # No retry inside redis-py: it would resend a command whose reply was lost (and
        # redis-py's default is 3 retries with backoff). RedisConn.call retries what is safe.
        retry=Retry(NoBackoff(), 0), **extra)
    # After from_url, which picks Connection or SSLConnection from the scheme.
    pool.connection_class = _marking_sends(pool.connection_class)
    # from_pool: the client owns the pool, so aclose() also closes every pooled socket.
    return aioredis.Redis.from_pool(pool)


def _marking_sends(base: type) -> type:
    """``base`` (a redis-py connection class) whose ``ConnectionError`` raised while
    connecting or sending carries :data:`NEVER_SENT`: the command did not leave this
    process (a socket the peer had already reset fails the write before any byte goes;
    a partly written command is never run by Redis). A write *timeout* is not marked: the
    transport may still flush the command after it."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    class MarkingSends(base):  # type: ignore[misc, valid-type]
        async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            try:
                await super().send_packed_command(command, check_health)
            except RedisConnectionError as exc:
                setattr(exc, NEVER_SENT, True)
                raise

    MarkingSends.__name__ = MarkingSends.__qualname__ = f"MarkingSends{base.__name__}"
    return MarkingSends


class _StateCollector(Collector):
    def __init__(self, conn: RedisConn) -> None:
        self._conn = conn

    def describe(self) -> Iterable[Metric]:
        return self.collect()

    def collect(self) -> Iterable[Metric]:
        conn = self._conn
        up = GaugeMetricFamily("tokenwire_state_up", "1 when the shared-state Redis answers, "
                               "0 while degraded (README \"Shared state\").",
                               value=1 if conn.up else 0)
        calls = CounterMetricFamily("tokenwire_state_calls", "Shared-state Redis round "
                                    "trips by outcome (ok, error, data_error: a value under "
                                    "the prefix that is not ours), and calls skipped while "
                                    "degraded.", labels=["outcome"])
        for outcome, n in conn.counts.items():
            calls.add_metric([outcome], n)
        transitions = CounterMetricFamily("tokenwire_state_transitions", "Times the "
                                          "shared-state connection went degraded or "
                                          "recovered.", value=conn.transitions)
        return [up, calls, transitions]
