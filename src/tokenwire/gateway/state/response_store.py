"""Stored Responses for ``previous_response_id`` and ``GET /v1/responses/{id}`` (issue 5 item 4).

The seed's gateway keeps no server-side state; OpenAI's Responses API does (``store``, default
true), and clients such as the ``openai`` SDK examples continue a conversation by id. So a
stored response keeps what continuing it needs: the input items that produced it (already
expanded with its own predecessors, so one lookup gives the whole conversation) and the
response object, whose ``output`` items follow that input.

:class:`ResponseStore` is the small interface; :class:`SQLiteResponseStore` the embedded
default (``sqlite3`` in a file or ``:memory:``). Rows are bounded in number
(:data:`DEFAULT_MAX_ROWS`, oldest evicted first) and in age (:data:`DEFAULT_TTL_S`); an expired
row reads as absent, exactly like an unknown id. The clock is passed in so expiry is tested
without waiting. One connection guarded by a lock: ``sqlite3`` objects are not safe to share
across threads otherwise, and the gateway may call from a thread pool.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

__all__ = [
    "DEFAULT_MAX_ROWS",
    "DEFAULT_TTL_S",
    "ResponseStore",
    "SQLiteResponseStore",
    "StoredResponse",
]

#: OpenAI keeps stored responses for 30 days; a local gateway has no reason to differ.
DEFAULT_TTL_S = 30 * 24 * 3600.0
#: A bound on rows so a busy gateway's store cannot grow without limit: at a few hundred KB per
#: agent turn, 10 000 rows stay within a few GB on disk (and the oldest go first).
DEFAULT_MAX_ROWS = 10_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    input BLOB NOT NULL,
    response BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_created ON responses (created);
"""


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """One stored response: ``input`` items (the whole conversation before it) and the
    response object (``output`` holds its items)."""

    id: str
    created: float
    input: tuple[Any, ...]
    response: dict[str, Any]

    @property
    def output(self) -> tuple[Any, ...]:
        items = self.response.get("output")
        return tuple(items) if isinstance(items, list) else ()

    def conversation(self) -> list[Any]:
        """The items a continuation prepends: this response's input, then its output."""
        return [*self.input, *self.output]


class ResponseStore(Protocol):
    """Where stored responses live; any object with these two methods will do."""

    def put(self, response_id: str, *, input_items: list[Any],
            response: dict[str, Any]) -> None:
        """Store (or replace) one response and the input items it answered."""
        ...

    def get(self, response_id: str) -> StoredResponse | None:
        """The stored response, or None when unknown or expired."""
        ...


class SQLiteResponseStore:
    """The embedded default: ``sqlite3``, bounded rows, a TTL, thread-safe."""

    def __init__(self, path: str = ":memory:", *, max_rows: int = DEFAULT_MAX_ROWS,
                 ttl_s: float = DEFAULT_TTL_S,
                 clock: Callable[[], float] = time.time) -> None:
        if max_rows < 1 or ttl_s <= 0:
            raise ValueError("max_rows must be at least 1 and ttl_s positive")
        self.max_rows, self.ttl_s, self._clock = max_rows, ttl_s, clock
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.executescript(_SCHEMA)

    def put(self, response_id: str, *, input_items: list[Any],
            response: dict[str, Any]) -> None:
        if not isinstance(response_id, str) or not response_id:
            raise ValueError("a stored response needs an id")
        now = self._clock()
        row = (response_id, now, msgspec.json.encode(input_items), msgspec.json.encode(response))
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?)", row)
                self._db.execute("DELETE FROM responses WHERE created < ?", (now - self.ttl_s,))
                self._db.execute(
                    "DELETE FROM responses WHERE id IN (SELECT id FROM responses "
                    "ORDER BY created DESC, rowid DESC LIMIT -1 OFFSET ?)", (self.max_rows,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            row = self._db.execute(
                "SELECT created, input, response FROM responses WHERE id = ?",
                (response_id,)).fetchone()
        if row is None or row[0] < self._clock() - self.ttl_s:
            return None
        return StoredResponse(id=response_id, created=row[0],
                              input=tuple(msgspec.json.decode(row[1])),
                              response=msgspec.json.decode(row[2]))

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()
