"""The real redis-server the shared-state tests start: up, persistent across a restart."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from tests.redis_server import RedisServer


def test_the_server_answers_and_keeps_its_data_across_a_restart(redis_server: RedisServer):
    async def roundtrip(value: str | None) -> bytes | None:
        client = aioredis.from_url(redis_server.url)
        try:
            if value is not None:
                await client.set("tokenwire:test", value)
            return await client.get("tokenwire:test")
        finally:
            await client.aclose()

    assert asyncio.run(roundtrip("kept")) == b"kept"
    redis_server.restart()
    assert asyncio.run(roundtrip(None)) == b"kept"
    redis_server.kill()
    redis_server.start()
    assert asyncio.run(roundtrip(None)) == b"kept"
