"""The response store on Redis, shared by every gateway instance (``[state]``).

Same interface and bounds as the SQLite store (``state/response_store.py``): the same
encoded record (:func:`~.response_store.encode_record`, so the byte cap means the same),
:data:`~.response_store.DEFAULT_TTL_S` as the key's expiry, and at most
:data:`~.response_store.DEFAULT_MAX_ROWS` responses, the oldest evicted first. Keys:

- ``<prefix>resp:<id>``: one stored response (a string, ``PX`` = the TTL), or the "too
  large" marker in its place; requests store and read through
  :class:`~.response_store.OwnedStore`, so ``<id>`` is ``<owner>/<response id>``;
- ``<prefix>resp-index``: a sorted set of ids by the time Redis stored them (its clock, one
  for every instance), so the count bound can evict the oldest (expired ids are trimmed
  from it on every write).

**One round trip per operation**: ``put`` is one ``EVALSHA`` of :data:`_PUT_SCRIPT` (set,
index, trim, evict: atomic, so two instances writing at once cannot leave the index and the
keys disagreeing), ``get`` is one ``GET``. After a Redis restart the first ``put`` finds the
script gone and redis-py loads it (``NOSCRIPT`` → ``SCRIPT LOAD`` → ``EVALSHA``: twice more,
once). The script touches keys it computes (the evicted ids), which a standalone Redis (or a
primary with replicas) allows; Redis Cluster would need every key in one hash slot and is not
supported.

A failure of the connection (down, degraded, past the deadline) is
:class:`~.response_store.StoreUnavailable`, with the seconds until the connection's next
re-check as its ``retry_after``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec

from tokenwire.gateway.state.config import DEFAULT_STORE_MAX_BYTES
from tokenwire.gateway.state.redis_conn import RedisConn, StateDataError, StateUnavailable
from tokenwire.gateway.state.response_store import (
    DEFAULT_MAX_ROWS,
    DEFAULT_TTL_S,
    ResponseTooLarge,
    StoredResponse,
    StoreUnavailable,
    decode_record,
    encode_record,
)

__all__ = ["RedisResponseStore"]

#: KEYS[1] the response's key, KEYS[2] the index; ARGV: the record, the TTL (ms), the id, the
#: row bound, the key prefix of responses. Returns how many were evicted by the row bound.
#: The index is scored by Redis's own clock (``TIME``; Redis 7 replicates a script's effects,
#: so a non-deterministic command before writes is allowed), never an instance's: with
#: instances' clocks apart, a write scored by a clock behind the others would be the "oldest"
#: at once and the row bound would evict the id just written, and a clock ahead would trim
#: every other instance's ids from the index as expired. The score is exact to the
#: microsecond (built as a string: a Lua number would print with 14 digits). The index is
#: written first: a script stops at its first error with what it wrote kept, so an index
#: that is not a sorted set of ours (``WRONGTYPE``) leaves no record behind that the caller
#: reports as not stored.
_PUT_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', KEYS[2], string.format('%d.%06d', t[1], t[2]), ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf',
           '(' .. string.format('%.6f', now - tonumber(ARGV[2]) / 1000))
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[4])
if over > 0 then
  local old = redis.call('ZPOPMIN', KEYS[2], over)
  for i = 1, #old, 2 do redis.call('DEL', ARGV[5] .. old[i]) end
else
  over = 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return over
"""


class RedisResponseStore:
    """:class:`~.response_store.ResponseStore` on the process's :class:`RedisConn`."""

    def __init__(self, conn: RedisConn, *, max_rows: int = DEFAULT_MAX_ROWS,
                 ttl_s: float = DEFAULT_TTL_S, max_bytes: int = DEFAULT_STORE_MAX_BYTES,
                 clock: Callable[[], float] = time.time) -> None:
        if max_rows < 1 or ttl_s <= 0 or max_bytes < 1:
            raise ValueError("max_rows, ttl_s and max_bytes must be positive")
        self.conn = conn
        self.max_rows, self.ttl_s, self.max_bytes = max_rows, ttl_s, max_bytes
        self._clock = clock
        self._index = conn.key("resp-index")
        self._script: Any = None

    def _key(self, response_id: str) -> str:
        return self.conn.key("resp", response_id)

    async def put(self, response_id: str, *, input_items: list[Any],
                  response: dict[str, Any], replica: tuple[str, str] | None = None) -> None:
        now = self._clock()
        data, stored = encode_record(response_id, created=now, input_items=input_items,
                                     response=response, replica=replica,
                                     max_bytes=self.max_bytes)
        args = [data, int(self.ttl_s * 1000), response_id, self.max_rows,
                self.conn.key("resp", "")]

        async def op(client: Any) -> Any:
            if self._script is None:
                self._script = client.register_script(_PUT_SCRIPT)
            return await self._script(keys=[self._key(response_id), self._index], args=args,
                                      client=client)

        # Idempotent: run twice, the same key and value, the id re-scored a moment later.
        await self._call(op, idempotent=True)
        if not stored:
            raise ResponseTooLarge(response_id, _marker_size(data), self.max_bytes)

    async def get(self, response_id: str) -> StoredResponse | None:
        key = self._key(response_id)
        try:
            data = await self._call(lambda client: client.get(key), idempotent=True)
        except _NotOurs:
            return None  # a value of another type under the key: as decode_record's garbage
        return None if data is None else decode_record(response_id, data)

    async def delete(self, response_id: str) -> bool:
        key, index = self._key(response_id), self._index

        async def op(client: Any) -> Any:
            async with client.pipeline(transaction=True) as pipe:  # one round trip
                pipe.delete(key)
                pipe.zrem(index, response_id)
                return await pipe.execute()

        try:  # idempotent: deleting twice leaves the same nothing
            removed, _ = await self._call(op, idempotent=True)
        except _NotOurs:
            return False  # the index is not ours: nothing of ours to delete there
        return bool(removed)

    async def _call(self, op: Callable[[Any], Any], *, idempotent: bool) -> Any:
        try:
            return await self.conn.call(op, idempotent=idempotent)
        except StateDataError as exc:
            raise _NotOurs from exc
        except StateUnavailable as exc:
            raise StoreUnavailable(
                "The response store is unavailable (its Redis does not answer); the "
                "stored conversation cannot be read or written now. Retry shortly.",
                retry_after=max(1.0, self.conn.retry_in())) from exc


class _NotOurs(StoreUnavailable):
    """A key of the store holds a value that is not ours (Redis refused it, ``WRONGTYPE``):
    a read finds no response there; a write was not done (the caller's "not stored")."""

    def __init__(self) -> None:
        super().__init__("The response store's Redis holds a value under this store's keys "
                         "that tokenwire did not write; nothing was stored.", retry_after=1.0)


def _marker_size(data: bytes) -> int:
    return int(msgspec.json.decode(data)["too_large"])
