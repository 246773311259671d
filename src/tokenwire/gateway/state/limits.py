"""Per-key limits, sans-IO: requests and tokens per minute, requests at once (issue 16).

Each API key may carry :class:`KeyLimits`: ``rpm`` (requests started per minute), ``tpm``
(tokens per minute, charged from each request's real usage when it ends) and
``max_concurrent`` (requests in flight). This module decides; it never reads a clock or a
socket (callers pass ``now``, seconds on a wall clock shared by every instance). The two
backends keep the counts: :class:`LocalLimiter` here (one process), and
``state/limits_redis.py`` (every instance on one Redis, the same decisions in Lua).

**The counter** is a sliding window with carry (Cloudflare's "sliding window counter"): a
count per fixed one-minute window, and an estimate of the last minute that weighs the
previous window by the part of it still inside the last 60 s::

    estimate = previous * (1 - elapsed_fraction_of_current_window) + current

A request is admitted while ``estimate + 1 <= limit`` (for tokens: while at least one token of
room is left). Unlike a plain fixed window it never lets ``2 x limit`` through across a window
boundary; unlike a log of timestamps it is two integers per limit. The estimate assumes the
previous window's requests were spread evenly, which is where its error lies (at most the
previous window's count times the fraction, never more than ``limit`` requests in any window).

**Tokens** are charged after the request, from the usage the client was shown (the real count,
``gateway/usage.py``), so requests already running when the window fills each still finish:
the overshoot of ``tpm`` is at most the tokens of the requests in flight at that moment. A
request is refused up front only when the window has no room left at all.

``Retry-After`` is the time until the estimate has room again (:func:`wait_s`), rounded up to
whole seconds: exact for the counts the decision saw.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

__all__ = [
    "CONCURRENT_RETRY_AFTER_S",
    "EPSILON",
    "WINDOW_S",
    "KeyLimits",
    "Limit",
    "LocalLimiter",
    "Verdict",
    "WindowCounts",
    "charged_tokens",
    "decide",
    "estimate",
    "retry_after_s",
    "wait_s",
    "window_of",
]

#: The limits are per minute: one window is 60 s.
WINDOW_S = 60.0


def charged_tokens(prompt: int | None, completion: int | None, streamed: int) -> int:
    """What a request costs against ``tpm``: prompt + completion of the usage the client was
    shown, with the completion tokens streamed standing in for a completion count the usage
    lacks (``None`` is "not known", never 0)."""
    return (prompt or 0) + (streamed if completion is None else completion)


class Limit(enum.Enum):
    """Which limit refused a request; the value names it in metrics, logs and bodies."""

    REQUESTS = "requests"
    TOKENS = "tokens"
    CONCURRENT = "concurrent"


@dataclass(frozen=True)
class KeyLimits:
    """A key's limits; ``None`` is "no limit"."""

    rpm: int | None = None
    tpm: int | None = None
    max_concurrent: int | None = None

    def __post_init__(self) -> None:
        for name in ("rpm", "tpm", "max_concurrent"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")

    @property
    def any(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.max_concurrent is not None


def window_of(now: float, window_s: float = WINDOW_S) -> tuple[int, float]:
    """``(index, elapsed fraction)`` of the window holding ``now``."""
    index = math.floor(now / window_s)
    return index, now / window_s - index


def estimate(previous: int, current: int, fraction: float) -> float:
    """The sliding estimate of the last window's count (the Lua scripts compute the same
    expression, in the same order, so both backends decide alike)."""
    return previous * (1.0 - fraction) + current


#: Slack in ``estimate + 1 <= limit``: the fraction of a window is a float, and at the exact
#: moment ``Retry-After`` names the estimate may land a rounding error above the limit. Counts
#: are whole numbers, so no real request is ever admitted by it. The Lua scripts use the same.
EPSILON = 1e-9


def _admits(previous: int, current: int, fraction: float, limit: int) -> bool:
    return estimate(previous, current, fraction) + 1 <= limit + EPSILON


def wait_s(previous: int, current: int, fraction: float, limit: int,
           window_s: float = WINDOW_S) -> float:
    """Seconds until ``estimate + 1 <= limit`` again, if nothing else is counted meanwhile.

    Within the current window the estimate falls as the previous window slides out; when the
    current count alone is over, the wait reaches into the next window, where the current
    count becomes the previous one and slides out in turn."""
    room = limit - 1
    if _admits(previous, current, fraction, limit):
        return 0.0
    if current <= room and previous > 0:
        # previous * (1 - fraction - t / window) + current <= room
        t = window_s * (1.0 - fraction - (room - current) / previous)
        return max(t, 0.0)
    to_next = (1.0 - fraction) * window_s
    # next window at offset s: current * (1 - s / window) <= room
    return to_next + window_s * (1.0 - room / current)


def retry_after_s(wait: float) -> int:
    """``Retry-After``: whole seconds, rounded up, at least 1."""
    return max(1, math.ceil(wait - EPSILON))


@dataclass(frozen=True)
class WindowCounts:
    """What a decision saw: the counts of both windows for requests and tokens, the requests
    in flight, and the fraction of the current window elapsed."""

    fraction: float
    requests: tuple[int, int] = (0, 0)  # previous, current
    tokens: tuple[int, int] = (0, 0)
    in_flight: int = 0


@dataclass(frozen=True)
class Verdict:
    """An admission decision. ``refused`` names the limit that refused (``None``: admitted);
    ``retry_after`` is whole seconds for the 429; ``remaining_*`` and ``reset_*_s`` feed the
    ``x-ratelimit-*`` headers (``None`` when the key has no such limit)."""

    refused: Limit | None
    retry_after: int = 0
    remaining_requests: int | None = None
    remaining_tokens: int | None = None
    reset_requests_s: float | None = None
    reset_tokens_s: float | None = None

    @property
    def admitted(self) -> bool:
        return self.refused is None


#: Concurrency has no clock to wait for: a slot frees when some request ends. One second
#: lets the client come back soon without spinning.
CONCURRENT_RETRY_AFTER_S = 1


def decide(limits: KeyLimits, seen: WindowCounts) -> Verdict:
    """The decision for counts ``seen`` (taken before this request is counted). The order
    is concurrency, requests, tokens: the first limit reached refuses."""
    f = seen.fraction
    rp, rc = seen.requests
    tp, tc = seen.tokens
    refused: Limit | None = None
    wait = 0.0
    if limits.max_concurrent is not None and seen.in_flight + 1 > limits.max_concurrent:
        refused, wait = Limit.CONCURRENT, float(CONCURRENT_RETRY_AFTER_S)
    elif limits.rpm is not None and not _admits(rp, rc, f, limits.rpm):
        refused, wait = Limit.REQUESTS, wait_s(rp, rc, f, limits.rpm)
    elif limits.tpm is not None and not _admits(tp, tc, f, limits.tpm):
        refused, wait = Limit.TOKENS, wait_s(tp, tc, f, limits.tpm)
    counted = 0 if refused is not None else 1
    return Verdict(
        refused=refused, retry_after=retry_after_s(wait) if refused is not None else 0,
        remaining_requests=None if limits.rpm is None else max(
            0, math.floor(limits.rpm - estimate(rp, rc + counted, f))),
        remaining_tokens=None if limits.tpm is None else max(
            0, math.floor(limits.tpm - estimate(tp, tc, f))),
        reset_requests_s=None if limits.rpm is None else _reset(rp, rc + counted, f),
        reset_tokens_s=None if limits.tpm is None else _reset(tp, tc, f))


def _reset(previous: int, current: int, fraction: float) -> float:
    """OpenAI's ``x-ratelimit-reset-*``: the time until the count is back to zero."""
    if current:
        return (1.0 - fraction) * WINDOW_S + WINDOW_S
    return (1.0 - fraction) * WINDOW_S if previous else 0.0


# -- the one-process backend -----------------------------------------------------------------


@dataclass
class _Windows:
    """One counter: the index of the current window and the counts of it and the previous."""

    index: int = 0
    previous: int = 0
    current: int = 0

    def at(self, index: int) -> tuple[int, int]:
        """Roll to window ``index`` and return ``(previous, current)``."""
        if index == self.index + 1:
            self.previous, self.current = self.current, 0
        elif index != self.index:
            self.previous = self.current = 0
        self.index = index
        return self.previous, self.current


@dataclass
class _KeyState:
    requests: _Windows = field(default_factory=_Windows)
    tokens: _Windows = field(default_factory=_Windows)
    in_flight: int = 0


class LocalLimiter:
    """The counts of one process, keyed by key name: the default backend, and every
    instance's fallback while Redis is unreachable (then each instance admits up to the
    whole limit: the shared limit becomes N x the limit for N instances)."""

    def __init__(self) -> None:
        self._keys: dict[str, _KeyState] = {}

    def acquire(self, name: str, limits: KeyLimits, now: float) -> Verdict:
        """Decide, and count the request when it is admitted."""
        state = self._keys.setdefault(name, _KeyState())
        index, fraction = window_of(now)
        seen = WindowCounts(fraction=fraction, requests=state.requests.at(index),
                            tokens=state.tokens.at(index), in_flight=state.in_flight)
        verdict = decide(limits, seen)
        if verdict.admitted:
            state.requests.current += 1
            state.in_flight += 1
        return verdict

    def release(self, name: str, tokens: int, now: float) -> None:
        """The request ended (however it ended): free its slot and charge its tokens."""
        state = self._keys.get(name)
        if state is None:
            return
        state.in_flight = max(0, state.in_flight - 1)
        if tokens > 0:
            index, _ = window_of(now)
            state.tokens.at(index)
            state.tokens.current += tokens

    def in_flight(self, name: str) -> int:
        state = self._keys.get(name)
        return 0 if state is None else state.in_flight
