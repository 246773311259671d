"""Every error response of the served routes, rendered in one place per API shape.

A route (or a parser it calls) raises; the app's exception handlers land here. The shape is
the API's: Anthropic's ``{"type": "error", "error": {"type", "message"}}`` on every
``/v1/messages`` path (404 and 405 included), OpenAI's ``{"error": {"message", "type",
"param", "code"}}`` everywhere else (:mod:`tokenwire.gateway.apis.errors`). The status,
``code`` and ``param`` come from the exception's structured fields
(:class:`~tokenwire.errors.ProtocolError`), never from its class name or message text.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from tokenwire.codec.versioning import VARY
from tokenwire.errors import ProtocolError
from tokenwire.gateway.apis.errors import code_for_status, error_body, retry_after_header
from tokenwire.gateway.apis.messages import (
    anthropic_error_body,
    is_messages_path,
    type_for_status,
)
from tokenwire.gateway.http.admission import REQUEST_ID_SCOPE_KEY

__all__ = ["error_parts", "error_response", "exception_response", "json_error"]

log = logging.getLogger(__name__)


def json_error(status: int, message: str, *, code: str | None = None,
               param: str | None = None, headers: dict[str, str] | None = None) -> Response:
    """An OpenAI-shaped error response (``Vary`` as every generation route sends it)."""
    return Response(error_body(message, status=status, code=code, param=param),
                    status_code=status, media_type="application/json",
                    headers={"Vary": VARY, **(headers or {})})


def error_response(path: str, status: int, message: str, *, code: str | None = None,
                   param: str | None = None, headers: dict[str, str] | None = None,
                   anthropic_type: str | None = None) -> Response:
    """The error in the shape of the API that ``path`` belongs to. Anthropic's shape has
    neither ``param`` nor ``code``: its message names the field (``messages.0.role: ...``)."""
    if not is_messages_path(path):
        return json_error(status, message, code=code, param=param, headers=headers)
    type_ = anthropic_type or (type_for_status(status) if status < 500 else "api_error")
    body = anthropic_error_body(type_, message)
    return Response(json.dumps(body).encode(), status_code=status,
                    media_type="application/json", headers=headers)


def _status(exc: Exception, default: int) -> int:
    status = getattr(exc, "status_hint", default)
    return status if isinstance(status, int) and 400 <= status <= 599 else default


def error_parts(exc: Exception) -> tuple[int, str, str, str | None]:
    """Status, message, code and param of a raised :class:`~tokenwire.errors.TokenwireError`:
    the one classification of every route (and of the Responses WebSocket's ``error``
    messages, ``http/responses_ws.py``)."""
    if isinstance(exc, ProtocolError):
        status = _status(exc, 400)
        return status, str(exc), exc.code or code_for_status(status), exc.param
    status = _status(exc, 500)  # another TokenwireError (a bug is security.py's 500)
    code = getattr(exc, "code", None)
    return status, str(exc), code if isinstance(code, str) else code_for_status(status), None


async def exception_response(request: Request, exc: Exception) -> Response:
    """The exception handler for every error a route raises before its response starts."""
    if isinstance(exc, HTTPException):
        return _http_exception(request, exc)
    status, message, code, param = error_parts(exc)
    wait = getattr(exc, "retry_after", None)  # e.g. the store's StoreUnavailable (503)
    headers = dict(retry_after_header(wait)) if isinstance(wait, int | float) else {}
    if (rid := request.scope.get(REQUEST_ID_SCOPE_KEY)) is not None:  # (requests.named)
        headers["X-Request-Id"] = rid
    return error_response(request.url.path, status, message, code=code, param=param,
                          headers=headers)


def _http_exception(request: Request, exc: HTTPException) -> Response:
    """Starlette's own refusals: no route (404) and a route without this method (405)."""
    method, path = request.method, request.url.path
    headers: dict[str, Any] = dict(exc.headers or {})
    if exc.status_code == 404:
        message = (f"Unknown request URL: {method} {path}. Check the URL for typos; "
                   "GET /v1/models lists what this server serves.")
        return error_response(path, 404, message, code="unknown_url", headers=headers)
    if exc.status_code == 405:
        allowed = headers.get("Allow") or headers.get("allow") or ""
        message = f"{method} is not allowed on {path}" + (f"; use {allowed}" if allowed else "")
        return error_response(path, 405, message, code="method_not_allowed", headers=headers)
    status = exc.status_code if 400 <= exc.status_code <= 599 else 500
    return error_response(path, status, str(exc.detail), code=code_for_status(status),
                          headers=headers)
