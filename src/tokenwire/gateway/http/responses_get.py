"""``GET /v1/responses/{id}`` (issue 5 item 6), the response store of an app, and the
OpenAI-shaped error body of :class:`~tokenwire.errors.ResponsesRequestError`.

The store is the gateway's (``GatewayState.response_store``): the POST route stores into it
and this route reads from it (:func:`response_store_of`), so both see one store. When the
state has none, an in-memory :class:`~tokenwire.gateway.state.response_store.SQLiteResponseStore`
is created on first use.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from tokenwire.errors import ResponsesRequestError
from tokenwire.gateway.apis.errors import error_type_for_status
from tokenwire.gateway.state.response_store import ResponseStore, SQLiteResponseStore

__all__ = [
    "get_response",
    "response_store_of",
    "responses_error_body",
    "responses_error_response",
]


def response_store_of(request: Request) -> ResponseStore:
    """The gateway's response store (``GatewayState.response_store``); an in-memory one is
    created on first use when the state has none."""
    gateway = request.app.state.gateway
    store = getattr(gateway, "response_store", None)
    if store is None:
        store = SQLiteResponseStore()
        gateway.response_store = store
    return store


def responses_error_body(message: str, *, status: int, code: str | None,
                         param: str | None = None) -> dict[str, Any]:
    """OpenAI's error object with ``param`` (the SDK reads ``.param`` and ``.code``); OpenAI
    types its 404 for an unknown response ``invalid_request_error`` too."""
    kind = "invalid_request_error" if 400 <= status < 500 else error_type_for_status(status)
    return {"error": {"message": message, "type": kind,
                      "param": param, "code": code}}


def _json(obj: Any, status: int) -> Response:
    return Response(json.dumps(obj).encode(), status_code=status,
                    media_type="application/json")


async def responses_error_response(request: Request, exc: Exception) -> Response:
    """The exception handler for :class:`ResponsesRequestError` (a non-stream refusal)."""
    assert isinstance(exc, ResponsesRequestError)
    status = exc.status_hint if 400 <= exc.status_hint <= 599 else 400
    return _json(responses_error_body(str(exc), status=status, code=exc.code,
                                      param=exc.param), status)


async def get_response(request: Request) -> Response:
    """The stored response object, or OpenAI's 404 when absent, expired or never stored."""
    response_id = request.path_params["response_id"]
    stored = response_store_of(request).get(response_id)
    if stored is None:
        return _json(responses_error_body(
            f"Response with id '{response_id}' not found.", status=404, code=None,
            param="response_id"), 404)
    return _json(stored.response, 200)
