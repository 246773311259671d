"""A server of canned answers, for hostile-server tests: each path gets exactly the status,
headers and body it is given (a 404 for any other path); a body of ``None`` sends the head
and then nothing until the client goes away. Serve it with ``_loopback.serve``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

Answer = tuple[int, dict[str, str], bytes | None]
ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


def canned_app(answers: Mapping[str, Answer]) -> ASGIApp:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        request = Request(scope, receive)
        await request.body()
        status, headers, body = answers.get(request.url.path, (404, {}, b""))
        if body is not None:
            await Response(body, status_code=status, headers=headers)(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": status,
                    "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]})
        while (await receive())["type"] != "http.disconnect":
            pass

    return app
