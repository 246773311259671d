"""The ASGI types the gateway's own middlewares are written against (ASGI 3.0), defined once.

Plain aliases rather than Starlette's, so the middlewares that wrap the app
(``security.py``, ``limits.py``, ``admission.py``, ``shutdown.py``) need nothing from it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["CORK_EXTENSION", "ASGIApp", "Cork", "Message", "Receive", "Scope", "Send"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: ``scope["extensions"][CORK_EXTENSION]``, offered by the server: ``cork(True)`` holds what
#: the response writes until ``cork(False)`` sends it in as few segments as possible. Over
#: HTTP/1.1 that is the request cycle's writes kept and joined into one (``connections.py``;
#: Linux's ``TCP_CORK`` until it cost three system calls), over HTTP/2 the HEADERS frame kept
#: in h2's buffer (``http2.py``).
#: A streamed response corks its head until its first body is written (``streaming.py``;
#: why, in BENCHMARKS.md "Session of 2026-12-05 (2)").
CORK_EXTENSION = "tokenwire.cork"
Cork = Callable[[bool], None]
