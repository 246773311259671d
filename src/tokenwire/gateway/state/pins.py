"""Which replica produced which response: a bounded, expiring map for soft pins.

A ``previous_response_id`` continues best on the replica that produced it (its prefix cache
holds the conversation), so the pool (``routing/pool.py``) records ``response id -> replica``
when a generation finishes and reads it when a request continues one. Losing a pin costs a
cache miss, never correctness (the gateway replays the stored items itself), so this is an
in-process LRU with a TTL, not a database. ``now`` is passed in (tests need no waiting).
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["DEFAULT_PIN_TTL_S", "MAX_PINS", "PinStore"]

#: A conversation idle for longer than an hour has most likely left the replica's prefix
#: cache anyway (llama.cpp keeps one prompt per slot, vLLM evicts by LRU under load).
DEFAULT_PIN_TTL_S = 3600.0
#: About 100 bytes each: 100 000 pins are ~10 MB, far more conversations than a pool of
#: replicas keeps cached.
MAX_PINS = 100_000


class PinStore:
    """``key -> replica name``, least recently used evicted first, expired after ``ttl_s``."""

    def __init__(self, *, max_pins: int = MAX_PINS, ttl_s: float = DEFAULT_PIN_TTL_S) -> None:
        if max_pins < 1 or ttl_s <= 0:
            raise ValueError("max_pins must be at least 1 and ttl_s positive")
        self.max_pins, self.ttl_s = max_pins, ttl_s
        self._pins: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def put(self, key: str, replica: str, now: float) -> None:
        self._pins[key] = (replica, now)
        self._pins.move_to_end(key)
        while len(self._pins) > self.max_pins:
            self._pins.popitem(last=False)

    def get(self, key: str, now: float) -> str | None:
        found = self._pins.get(key)
        if found is None:
            return None
        replica, at = found
        if now - at > self.ttl_s:
            del self._pins[key]
            return None
        return replica

    def __len__(self) -> int:
        return len(self._pins)
