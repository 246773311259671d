"""Stored Responses for ``previous_response_id`` and ``GET /v1/responses/{id}`` (issue 5 item 4).

The seed's gateway keeps no server-side state; OpenAI's Responses API does (``store``, default
true), and clients such as the ``openai`` SDK examples continue a conversation by id. So a
stored response keeps what continuing it needs: the input items that produced it (already
expanded with its own predecessors, so one lookup gives the whole conversation), the
response object, whose ``output`` items follow that input, and the replica that produced it
(``pool``/``replica``: a continuation prefers it, ``routing/pool.py``).

:class:`ResponseStore` is the interface, **async** so that one set of callers serves both
backends: :class:`SQLiteResponseStore`, the embedded default (``sqlite3`` in a file or
``:memory:``), and ``state/redis_store.py``'s Redis store, shared by every instance
(``[state]``). Both bound rows in number (:data:`DEFAULT_MAX_ROWS`, oldest evicted first), in
age (:data:`DEFAULT_TTL_S`) and in size (:data:`DEFAULT_STORE_MAX_BYTES` per stored
response, encoded): an expired row reads as absent, exactly like an unknown id; a response
over the size cap is not stored and a marker says so, so a continuation from it gets a clear
"not stored: too large" instead of "not found" (:class:`ResponseNotStored`). The clock is
passed in so expiry is tested without waiting. One connection guarded by a lock: ``sqlite3``
objects are not safe to share across threads otherwise.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import msgspec

from tokenwire.errors import TokenwireError
from tokenwire.gateway.state.config import DEFAULT_STORE_MAX_BYTES

__all__ = [
    "DEFAULT_MAX_ROWS",
    "DEFAULT_STORE_MAX_BYTES",
    "DEFAULT_TTL_S",
    "OwnedStore",
    "ResponseNotStored",
    "ResponseStore",
    "ResponseTooLarge",
    "SQLiteResponseStore",
    "StoreUnavailable",
    "StoredResponse",
    "decode_record",
    "encode_record",
]

#: OpenAI keeps stored responses for 30 days; a local gateway has no reason to differ.
DEFAULT_TTL_S = 30 * 24 * 3600.0
#: A bound on rows so a busy gateway's store cannot grow without limit: at a few hundred KB per
#: agent turn, 10 000 rows stay within a few GB on disk (and the oldest go first).
DEFAULT_MAX_ROWS = 10_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS stored_responses (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    record BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS stored_responses_created ON stored_responses (created);
"""


class StoreUnavailable(TokenwireError):
    """The shared store cannot be read or written now (Redis is down or degraded).

    A continuation (``previous_response_id``) then gets this as a 503 ``store_unavailable``
    with ``Retry-After``: the conversation exists but cannot be read, so answering as if it
    did not (400 "not found") would make a client start over, and continuing without it
    would answer a different conversation. 503 says "the server, temporarily": clients,
    Codex and the openai SDK included, retry it."""

    status_hint = 503
    code = "store_unavailable"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ResponseTooLarge(TokenwireError):
    """``put``: the encoded response is over the store's byte cap; a marker was stored in
    its place (when the store was reachable) so reads say why it is missing."""

    def __init__(self, response_id: str, size: int, cap: int) -> None:
        super().__init__(f"response {response_id} is {size} bytes encoded, over the store's "
                         f"cap of {cap} bytes; it was served but not stored")
        self.size, self.cap = size, cap


class ResponseNotStored(TokenwireError):
    """``get``: the response exists but was too large to store (its marker was found)."""

    def __init__(self, response_id: str, size: int, cap: int) -> None:
        super().__init__(f"Response with id '{response_id}' was not stored: its conversation "
                         f"is {size} bytes encoded, over the store's cap of {cap} bytes "
                         "([state] store_max_bytes); resend the conversation's items instead")
        self.size, self.cap = size, cap


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """One stored response: ``input`` items (the whole conversation before it), the
    response object (``output`` holds its items) and where it was produced (``pool`` and
    ``replica``, when a pool of replicas produced it)."""

    id: str
    created: float
    input: tuple[Any, ...]
    response: dict[str, Any]
    pool: str | None = None
    replica: str | None = None

    @property
    def output(self) -> tuple[Any, ...]:
        items = self.response.get("output")
        return tuple(items) if isinstance(items, list) else ()

    def conversation(self) -> list[Any]:
        """The items a continuation prepends: this response's input, then its output."""
        return [*self.input, *self.output]


def encode_record(response_id: str, *, created: float, input_items: list[Any],
                  response: dict[str, Any], replica: tuple[str, str] | None,
                  max_bytes: int) -> tuple[bytes, bool]:
    """A stored response as one JSON value, or the "too large" marker in its place:
    ``(bytes, stored)``. Both backends store exactly these bytes, so the cap means the same."""
    if not isinstance(response_id, str) or not response_id:
        raise ValueError("a stored response needs an id")
    pool, name = replica if replica is not None else (None, None)
    data = msgspec.json.encode({"created": created, "input": input_items,
                                "response": response, "pool": pool, "replica": name})
    if len(data) <= max_bytes:
        return data, True
    return msgspec.json.encode({"created": created, "too_large": len(data),
                                "cap": max_bytes}), False


class _Record(msgspec.Struct):
    """What :func:`encode_record` writes, as read back: every field's type is checked, so a
    value under our key that only looks like a record is not served or replayed."""

    created: float
    input: list[dict[str, Any]]
    response: dict[str, Any]
    pool: str | None = None
    replica: str | None = None


class _Marker(msgspec.Struct):
    created: float
    too_large: int
    cap: int


def decode_record(response_id: str, data: bytes) -> StoredResponse | None:
    """The inverse of :func:`encode_record`; raises :class:`ResponseNotStored` on a marker.
    A value that is not a record of ours (corrupt, nested past the decoder's depth, fields
    of other types: written by something else under our prefix, or by another version) is
    None, "not found", rather than a 500 on every read of that id or a reply of its
    ``[1, 2]`` as the stored response."""
    try:
        doc = msgspec.json.decode(data, type=dict[str, Any])
        if "too_large" in doc:
            marker = msgspec.convert(doc, _Marker)
            raise ResponseNotStored(response_id, marker.too_large, marker.cap)
        record = msgspec.convert(doc, _Record)
        output = record.response.get("output", [])
        if not (isinstance(output, list) and all(isinstance(i, dict) for i in output)):
            return None  # a continuation would replay these as items
    except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
        return None
    return StoredResponse(id=response_id, created=record.created, input=tuple(record.input),
                          response=record.response, pool=record.pool, replica=record.replica)


class ResponseStore(Protocol):
    """Where stored responses live: the in-process SQLite one or the shared Redis one."""

    async def put(self, response_id: str, *, input_items: list[Any],
                  response: dict[str, Any], replica: tuple[str, str] | None = None) -> None:
        """Store (or replace) one response, the input items it answered and the
        ``(pool, replica)`` that produced it. Raises :class:`ResponseTooLarge` (a marker
        was stored instead) or :class:`StoreUnavailable` (nothing was stored)."""
        ...

    async def get(self, response_id: str) -> StoredResponse | None:
        """The stored response, or None when unknown or expired. Raises
        :class:`ResponseNotStored` (too large to store) or :class:`StoreUnavailable`."""
        ...

    async def delete(self, response_id: str) -> bool:
        """Forget one response (or its "too large" marker): True when it was there and
        unexpired. Raises :class:`StoreUnavailable`."""
        ...


class OwnedStore:
    """One API key's view of a store: the responses its requests stored, and no other.

    Ids are stored as ``<owner>/<id>`` (:func:`~.api_keys.response_owner`; an owner has no
    ``/``), so another key's ``previous_response_id`` or ``GET`` finds nothing: the same
    "not found" as an unknown id, which says nothing about whether it exists (OpenAI scopes
    responses to the project that made them). Before, any key read and continued any
    other key's conversation by its id. Errors name the id the client used."""

    def __init__(self, inner: ResponseStore, owner: str) -> None:
        if not owner or "/" in owner:
            raise ValueError("an owner is a non-empty name without '/'")
        self.inner, self.owner = inner, owner

    def _id(self, response_id: str) -> str:
        return f"{self.owner}/{response_id}"

    async def put(self, response_id: str, *, input_items: list[Any],
                  response: dict[str, Any], replica: tuple[str, str] | None = None) -> None:
        try:
            await self.inner.put(self._id(response_id), input_items=input_items,
                                 response=response, replica=replica)
        except ResponseTooLarge as exc:
            raise ResponseTooLarge(response_id, exc.size, exc.cap) from None

    async def get(self, response_id: str) -> StoredResponse | None:
        try:
            stored = await self.inner.get(self._id(response_id))
        except ResponseNotStored as exc:
            raise ResponseNotStored(response_id, exc.size, exc.cap) from None
        return None if stored is None else replace(stored, id=response_id)

    async def delete(self, response_id: str) -> bool:
        return await self.inner.delete(self._id(response_id))


class SQLiteResponseStore:
    """The embedded default: ``sqlite3``, bounded rows, a TTL, a byte cap, thread-safe.

    Its calls take microseconds on the in-memory database, so they run inline on the event
    loop (as they always did) behind the async interface."""

    def __init__(self, path: str = ":memory:", *, max_rows: int = DEFAULT_MAX_ROWS,
                 ttl_s: float = DEFAULT_TTL_S, max_bytes: int = DEFAULT_STORE_MAX_BYTES,
                 clock: Callable[[], float] = time.time) -> None:
        if max_rows < 1 or ttl_s <= 0 or max_bytes < 1:
            raise ValueError("max_rows, ttl_s and max_bytes must be positive")
        self.max_rows, self.ttl_s, self.max_bytes = max_rows, ttl_s, max_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.executescript(_SCHEMA)

    async def put(self, response_id: str, *, input_items: list[Any],
                  response: dict[str, Any], replica: tuple[str, str] | None = None) -> None:
        now = self._clock()
        data, stored = encode_record(response_id, created=now, input_items=input_items,
                                     response=response, replica=replica,
                                     max_bytes=self.max_bytes)
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.execute("INSERT OR REPLACE INTO stored_responses VALUES (?, ?, ?)",
                                 (response_id, now, data))
                self._db.execute("DELETE FROM stored_responses WHERE created < ?",
                                 (now - self.ttl_s,))
                self._db.execute(
                    "DELETE FROM stored_responses WHERE id IN (SELECT id FROM stored_responses "
                    "ORDER BY created DESC, rowid DESC LIMIT -1 OFFSET ?)", (self.max_rows,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        if not stored:
            raise ResponseTooLarge(response_id, msgspec.json.decode(data)["too_large"],
                                   self.max_bytes)

    async def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            row = self._db.execute(
                "SELECT created, record FROM stored_responses WHERE id = ?",
                (response_id,)).fetchone()
        if row is None or row[0] < self._clock() - self.ttl_s:
            return None
        return decode_record(response_id, row[1])

    async def delete(self, response_id: str) -> bool:
        with self._lock:
            gone = self._db.execute(
                "DELETE FROM stored_responses WHERE id = ? AND created >= ?",
                (response_id, self._clock() - self.ttl_s)).rowcount
        return gone > 0

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM stored_responses").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()
