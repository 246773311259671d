"""A server of canned answers, for hostile-server tests: each path gets exactly the status,
headers and body it is given (a 404 for any other path). Serve it with ``_loopback.serve``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

Answer = tuple[int, dict[str, str], bytes]
ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


def canned_app(answers: Mapping[str, Answer]) -> ASGIApp:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        request = Request(scope, receive)
        await request.body()
        status, headers, body = answers.get(request.url.path, (404, {}, b""))
        await Response(body, status_code=status, headers=headers)(scope, receive, send)

    return app
