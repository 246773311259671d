"""Breaker ejections shared between gateway instances: the decisions, without I/O.

Each instance keeps its own :class:`~.breaker.Breaker` per replica, fed by its own requests
and probes (failure and success counts, the error-rate window, half-open trials). What is
shared is the *outcome*: when an instance ejects a replica, it publishes an
:class:`Ejection` (the cool-down left and the ejection streak) under one Redis key per
replica, with the cool-down as the key's TTL; every other instance reads those keys every
``sync_interval_s`` and adopts each ejection it does not already honour
(:meth:`~.breaker.Breaker.adopt_open`). ``breaker_sync.py`` does the Redis round trips.

Why counts stay per process (LiteLLM's users hit the mix of per-process success/failure
counts and shared cool-downs, issue 16): here the shared thing is only ever a decision one
instance took from its own complete evidence, and every instance applies it the same way
(open until the same moment, Redis's TTL being the one clock). Sharing the counts would put
a Redis write on every request's end and let three instances' partial views add up to an
ejection none of them saw; sharing the decision costs one write per ejection and one read
per interval per process, none on the request path. The price: with traffic spread over N
instances, a dead replica fails up to N x ``consecutive_failures`` - (N - 1) requests before
the first instance trips (each retried on another replica before any output), and after the
cool-down each instance runs its own half-open trial (at most N trials at once).

The TTL is what makes the staleness bound independent of the instances' clocks: a reader
takes the remaining cool-down from Redis (``PTTL``), never a wall-clock time written by
another machine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tokenwire.gateway.routing.breaker import Breaker, BreakerState

__all__ = ["DEFAULT_SYNC_INTERVAL_S", "MAX_RECORD_BYTES", "Ejection", "adopt", "ejection_of"]

#: How often each instance reads the shared ejections: an ejection published by one
#: instance is honoured by the others within this plus two Redis round trips (README
#: "Deployment: several instances"). One pipelined read per pool per interval: 2 per
#: second per process, whatever the load.
DEFAULT_SYNC_INTERVAL_S = 0.5
#: A record is a few dozen bytes; anything larger under a breaker key is not ours.
MAX_RECORD_BYTES = 512


@dataclass(frozen=True, slots=True)
class Ejection:
    """One instance's ejection of one replica, as published."""

    cooldown_s: float
    streak: int
    origin: str  # the publishing instance's id: it ignores its own records

    def encode(self) -> str:
        return json.dumps({"streak": self.streak, "by": self.origin}, separators=(",", ":"))

    @property
    def ttl_ms(self) -> int:
        return max(1, round(self.cooldown_s * 1000))

    @classmethod
    def decode(cls, raw: bytes | str | None, pttl_ms: int) -> Ejection | None:
        """The record read back with its remaining TTL; None when absent, expired,
        without a TTL, or not a record of ours (never trusted to do more than eject)."""
        if raw is None or pttl_ms <= 0 or len(raw) > MAX_RECORD_BYTES:
            return None
        try:
            doc = json.loads(raw)
            streak, origin = int(doc["streak"]), str(doc["by"])
        except (ValueError, TypeError, KeyError, OverflowError):  # Infinity
            return None
        return cls(cooldown_s=pttl_ms / 1000.0, streak=max(1, min(streak, 64)), origin=origin)


def ejection_of(breaker: Breaker, before: BreakerState, now: float, origin: str
                ) -> Ejection | None:
    """What to publish after this instance's own breaker event: an ejection when it just
    opened (tripped, or a half-open trial failed, or the start-up probe found it down);
    nothing for other transitions (closing is not published: the key expires with the
    cool-down, and each instance closes on its own trial)."""
    if breaker.state is not BreakerState.OPEN or before is BreakerState.OPEN:
        return None
    left = breaker.cooldown_left(now)
    return Ejection(cooldown_s=left, streak=breaker.streak, origin=origin) if left > 0 else None


def adopt(breaker: Breaker, ejection: Ejection | None, now: float, origin: str) -> bool:
    """Apply another instance's published ejection to this instance's breaker; True when
    it changed (the replica is now open here, or open for longer). Never for longer than
    this instance's own ``max_cooldown_s``: the TTL is whatever the key was written with (a
    year, by hand or by an instance with another policy), and a replica honoured open that
    long is gone from every instance until someone deletes the key (an open breaker is not
    probed)."""
    if ejection is None or ejection.origin == origin:
        return False
    cooldown_s = min(ejection.cooldown_s, breaker.policy.max_cooldown_s)
    return breaker.adopt_open(now, cooldown_s, ejection.streak)
