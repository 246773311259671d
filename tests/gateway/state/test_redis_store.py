"""The response store on a real ``redis-server`` (``state/redis_store.py``): the bounds of the
SQLite store (TTL, row count, byte cap), one round trip per operation, and a typed error
when Redis is gone."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.redis_server import RedisServer
from tokenwire.gateway.state.config import StateConfig
from tokenwire.gateway.state.redis_conn import RedisConn
from tokenwire.gateway.state.redis_store import RedisResponseStore
from tokenwire.gateway.state.response_store import (
    DEFAULT_TTL_S,
    ResponseNotStored,
    ResponseTooLarge,
    StoreUnavailable,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def response(rid: str, text: str = "hi") -> dict[str, Any]:
    return {"id": rid, "object": "response", "status": "completed",
            "output": [{"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": text}]}]}


def run(server: RedisServer, body: Any, **store_kw: Any) -> Any:
    async def main() -> Any:
        conn = RedisConn(StateConfig(url=server.url, key_prefix="t:", timeout_s=5.0))
        try:
            return await body(RedisResponseStore(conn, **store_kw), conn)
        finally:
            await conn.aclose()
    return asyncio.run(main())


def test_put_and_get_are_one_round_trip_each(redis_server: RedisServer) -> None:
    async def body(store: RedisResponseStore, conn: RedisConn) -> None:
        items = [{"type": "message", "role": "user", "content": "hello"}]
        await store.put("resp_1", input_items=items, response=response("resp_1"),
                        replica=("pool", "r1"))
        assert conn.calls == 1
        got = await store.get("resp_1")
        assert conn.calls == 2
        assert got is not None and got.input == tuple(items)
        assert got.response == response("resp_1") and (got.pool, got.replica) == ("pool", "r1")
        assert await store.get("resp_unknown") is None
        ttl_ms = await conn.call(lambda r: r.pttl("t:resp:resp_1"))
        assert DEFAULT_TTL_S * 1000 - 60_000 < ttl_ms <= DEFAULT_TTL_S * 1000
    run(redis_server, body)


def test_delete_forgets_a_response_and_its_index_entry_in_one_round_trip(
        redis_server: RedisServer) -> None:
    async def body(store: RedisResponseStore, conn: RedisConn) -> None:
        await store.put("resp_1", input_items=[], response=response("resp_1"))
        await store.put("resp_2", input_items=[], response=response("resp_2"))
        before = conn.calls
        assert await store.delete("resp_1") is True
        assert conn.calls == before + 1
        assert await store.get("resp_1") is None and await store.get("resp_2") is not None
        assert await conn.call(lambda r: r.zrange("t:resp-index", 0, -1)) == [b"resp_2"]
        assert await store.delete("resp_1") is False  # gone: the route's 404
        assert await store.delete("resp_unknown") is False

    run(redis_server, body)


def test_rows_are_bounded_and_the_oldest_go_first(redis_server: RedisServer) -> None:
    clock = Clock()

    async def body(store: RedisResponseStore, conn: RedisConn) -> None:
        for i in range(5):
            clock.now += 1
            await store.put(f"resp_{i}", input_items=[], response=response(f"resp_{i}"))
        present = [await store.get(f"resp_{i}") is not None for i in range(5)]
        assert present == [False, False, True, True, True]
        assert await conn.call(lambda r: r.zcard("t:resp-index")) == 3
    run(redis_server, body, max_rows=3, clock=clock)


async def _redis_time(conn: RedisConn) -> float:
    seconds, micros = await conn.call(lambda r: r.time())
    return seconds + micros / 1e6


def test_expired_ids_leave_the_index(redis_server: RedisServer) -> None:
    async def body(store: RedisResponseStore, conn: RedisConn) -> None:
        start = await _redis_time(conn)
        await store.put("resp_old", input_items=[], response=response("resp_old"))
        while await _redis_time(conn) < start + 2 * store.ttl_s:  # past the TTL, by Redis
            await asyncio.sleep(store.ttl_s)
        await store.put("resp_new", input_items=[], response=response("resp_new"))
        assert await conn.call(lambda r: r.zrange("t:resp-index", 0, -1)) == [b"resp_new"]
    run(redis_server, body, ttl_s=0.05)


def test_a_skewed_instance_clock_never_evicts_what_it_just_wrote(
        redis_server: RedisServer) -> None:
    """Two instances on one Redis at the row bound, one clock an hour behind, one a day
    ahead (skew, not a real TTL): the id each writes is kept, the oldest write goes, and no
    id leaves the index as "expired" because another instance's clock runs ahead."""
    behind, ahead = Clock(), Clock()
    behind.now -= 3600
    ahead.now += 86_400

    async def main() -> None:
        conn = RedisConn(StateConfig(url=redis_server.url, key_prefix="t:", timeout_s=5.0))
        ok = RedisResponseStore(conn, max_rows=2, ttl_s=3600)
        late = RedisResponseStore(conn, max_rows=2, ttl_s=3600, clock=behind)
        early = RedisResponseStore(conn, max_rows=2, ttl_s=3600, clock=ahead)
        try:
            await ok.put("resp_a", input_items=[], response=response("resp_a"))
            await ok.put("resp_b", input_items=[], response=response("resp_b"))
            await late.put("resp_c", input_items=[], response=response("resp_c"))
            assert await late.get("resp_c") is not None
            assert [await ok.get(f"resp_{x}") is not None for x in "abc"] == [
                False, True, True]
            await early.put("resp_d", input_items=[], response=response("resp_d"))
            assert await conn.call(lambda r: r.zrange("t:resp-index", 0, -1)) == [
                b"resp_c", b"resp_d"]
        finally:
            await conn.aclose()
    asyncio.run(main())


def test_too_large_is_a_marker_not_a_truncation(redis_server: RedisServer) -> None:
    async def body(store: RedisResponseStore, conn: RedisConn) -> None:
        with pytest.raises(ResponseTooLarge):
            await store.put("resp_big", input_items=[{"content": "x" * 5000}],
                            response=response("resp_big"))
        with pytest.raises(ResponseNotStored, match="over the store's cap of 2048 bytes"):
            await store.get("resp_big")
        raw = await conn.call(lambda r: r.get("t:resp:resp_big"))
        assert len(raw) < 200  # the marker, not a cut-down record
    run(redis_server, body, max_bytes=2048)


def test_a_dead_redis_is_store_unavailable_with_a_retry_after(
        redis_server: RedisServer) -> None:
    async def body(store: RedisResponseStore, conn: RedisConn) -> None:
        await store.put("resp_1", input_items=[], response=response("resp_1"))
        redis_server.kill()
        for call in (store.get("resp_1"),
                     store.put("resp_2", input_items=[], response=response("resp_2"))):
            with pytest.raises(StoreUnavailable) as err:
                await call
            assert err.value.status_hint == 503 and err.value.code == "store_unavailable"
            assert err.value.retry_after is not None and err.value.retry_after >= 1
    run(redis_server, body)


def test_a_value_of_another_type_under_the_store_s_keys_is_not_ours(
        redis_server: RedisServer) -> None:
    """Another application's hash under ``resp:<id>``, a string as the index: each read or
    write raised WRONGTYPE, which made the whole connection degraded (every continuation a
    503 ``store_unavailable``, the limits local-only, for as long as the key stayed). Now a
    read of that id is "not found", a write is "not stored" and leaves no record behind,
    and the connection stays up for everything else."""
    async def body(store: RedisResponseStore, conn: RedisConn) -> None:
        await conn.call(lambda r: r.hset("t:resp:resp_hash", "a", "b"))
        assert await store.get("resp_hash") is None
        await conn.call(lambda r: r.set("t:resp-index", "not a sorted set"))
        with pytest.raises(StoreUnavailable):
            await store.put("resp_new", input_items=[], response=response("resp_new"))
        assert await conn.call(lambda r: r.exists("t:resp:resp_new")) == 0
        assert conn.up and conn.counts["data_error"] == 2
        await conn.call(lambda r: r.delete("t:resp-index"))
        await store.put("resp_new", input_items=[], response=response("resp_new"))
        assert (await store.get("resp_new")) is not None

    run(redis_server, body)
