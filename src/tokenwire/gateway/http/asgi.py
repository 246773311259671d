"""The ASGI types the gateway's own middlewares are written against (ASGI 3.0), defined once.

Plain aliases rather than Starlette's, so the middlewares that wrap the app
(``security.py``, ``limits.py``, ``admission.py``, ``shutdown.py``) need nothing from it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["ASGIApp", "Message", "Receive", "Scope", "Send"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
