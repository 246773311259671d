"""A stored response is written before its terminal event (or its whole body) is sent.

LiteLLM's #28587: ``previous_response_id`` readable only ~10 s after the response, because
the store was written after the answer. Here the store records, at the moment ``put`` is
called, every ASGI message already sent; nothing the client can have read may contain the
end of the response yet. Driven at the ASGI level (the app called directly with a recording
``send``), so the order is observed, not timed.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.gateway.conftest import ScriptedUpstream, make_state
from tokenwire.gateway.http.app import create_app
from tokenwire.gateway.ir import Finish, FinishKind, TokenDelta
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.state.response_store import SQLiteResponseStore


class WatchingStore(SQLiteResponseStore):
    """Records what had been sent when each ``put`` came."""

    def __init__(self, sent: list[dict[str, Any]]) -> None:
        super().__init__()
        self.sent = sent
        self.seen_at_put: list[list[dict[str, Any]]] = []

    async def put(self, response_id: str, **kw: Any) -> None:
        self.seen_at_put.append(list(self.sent))
        await super().put(response_id, **kw)


async def _post(app: Any, body: dict[str, Any], sent: list[dict[str, Any]]) -> None:
    raw = json.dumps(body).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/responses",
             "raw_path": b"/v1/responses", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", str(len(raw)).encode()),
                         (b"host", b"127.0.0.1")],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8080)}
    messages = [{"type": "http.request", "body": raw, "more_body": False}]
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await never.wait()  # the client stays connected
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await asyncio.wait_for(app(scope, receive, send), 60)


@pytest.mark.parametrize("stream", [True, False])
def test_the_store_is_written_before_the_end_is_sent(smollm2_map, stream: bool) -> None:
    up = ScriptedUpstream([(0.0, TokenDelta(text="Hello")), (0.0, TokenDelta(text=" there")),
                           (0.0, Finish(reason=FinishKind.EOS))])
    sent: list[dict[str, Any]] = []
    state = make_state(ServerSettings(), up, smollm2_map)
    store = WatchingStore(sent)
    state.response_store = store
    asyncio.run(_post(create_app(state), {"model": "scripted", "input": "hi",
                                          "stream": stream}, sent))
    assert sent[0]["status"] == 200
    assert b"Hello there" in b"".join(m.get("body", b"") for m in sent)
    [before] = store.seen_at_put
    if stream:  # the stream had begun, and its end had not gone out
        sent_then = b"".join(m.get("body", b"") for m in before)
        assert b"response.created" in sent_then
        assert b"response.completed" not in sent_then
    else:  # not even the head had gone out
        assert before == []
