"""A server of canned answers, for hostile-server tests: each path gets exactly the status,
headers and body it is given (a 404 for any other path); a body of ``None`` sends the head
and then nothing until the client goes away; a :class:`Trickle` sends the head, then its
piece at its pace, for ever (until the client goes away). Serve it with ``_loopback.serve``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response


@dataclass(frozen=True)
class Trickle:
    """A body that never ends: ``piece`` every ``every_s`` seconds (the server paces it)."""

    piece: bytes
    every_s: float = 0.05


Answer = tuple[int, dict[str, str], bytes | Trickle | None]
ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


def canned_app(answers: Mapping[str, Answer]) -> ASGIApp:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        request = Request(scope, receive)
        await request.body()
        status, headers, body = answers.get(request.url.path, (404, {}, b""))
        if isinstance(body, bytes):
            await Response(body, status_code=status, headers=headers)(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": status,
                    "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]})
        if body is None:
            while (await receive())["type"] != "http.disconnect":
                pass
            return
        while True:
            await send({"type": "http.response.body", "body": body.piece, "more_body": True})
            try:  # the pause doubles as the wait for the client to leave
                if (await asyncio.wait_for(receive(), body.every_s))["type"] == "http.disconnect":
                    return
            except TimeoutError:
                pass

    return app
