"""``GET`` and ``DELETE /v1/responses/{id}`` (issue 5 item 6) and the response store of an
app.

The store is the gateway's (``GatewayState.response_store``): the POST route stores into it
and this route reads from it (:func:`response_store_of`), so both see one store, each request
through its API key's view of it (:class:`~tokenwire.gateway.state.response_store.OwnedStore`:
another key's responses are "not found"). When the state has none, an in-memory
:class:`~tokenwire.gateway.state.response_store.SQLiteResponseStore` is created on first use.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import HTTPConnection, Request
from starlette.responses import Response

from tokenwire.gateway.apis.errors import retry_after_header
from tokenwire.gateway.apis.responses_request import MAX_RESPONSE_ID_CHARS
from tokenwire.gateway.http.errors import json_error
from tokenwire.gateway.http.limits import key_of
from tokenwire.gateway.state.api_keys import response_owner
from tokenwire.gateway.state.response_store import (
    OwnedStore,
    ResponseNotStored,
    ResponseStore,
    SQLiteResponseStore,
    StoreUnavailable,
)

__all__ = ["delete_response", "get_response", "response_store_of"]


def response_store_of(conn: HTTPConnection) -> ResponseStore:
    """The gateway's response store (``GatewayState.response_store``) as the key of
    ``conn`` (a request or a WebSocket) sees it; an in-memory one is created on first use
    when the state has none."""
    gateway = conn.app.state.gateway
    store = getattr(gateway, "response_store", None)
    if store is None:
        store = SQLiteResponseStore()
        gateway.response_store = store
    return OwnedStore(store, response_owner(key_of(conn.scope)))


def _json(obj: Any, status: int) -> Response:
    return Response(json.dumps(obj).encode(), status_code=status,
                    media_type="application/json")


def _too_long(response_id: str) -> Response | None:
    if len(response_id) > MAX_RESPONSE_ID_CHARS:  # names no response: not a store key, and
        # not repeated back (a 10,000-character id came back whole in the 404)
        return json_error(404, f"No response has an id of {len(response_id)} characters "
                          f"(at most {MAX_RESPONSE_ID_CHARS}).", code="not_found",
                          param="response_id")
    return None


def _not_found(response_id: str) -> Response:  # OpenAI's words for it
    return json_error(404, f"Response with id '{response_id}' not found.",
                      code="not_found", param="response_id")


def _unavailable(exc: StoreUnavailable) -> Response:
    return json_error(503, str(exc), code=exc.code,
                      headers=dict(retry_after_header(exc.retry_after)))


async def delete_response(request: Request) -> Response:
    """``DELETE /v1/responses/{id}`` (the SDKs' ``responses.delete``): OpenAI's
    ``{"id", "object": "response", "deleted": true}``, or its 404 when the key's store has
    no such response (another key's is not there for it); a 503 while the shared store
    cannot be written."""
    response_id = request.path_params["response_id"]
    if (refusal := _too_long(response_id)) is not None:
        return refusal
    try:
        deleted = await response_store_of(request).delete(response_id)
    except StoreUnavailable as exc:
        return _unavailable(exc)
    if not deleted:
        return _not_found(response_id)
    return _json({"id": response_id, "object": "response", "deleted": True}, 200)


async def get_response(request: Request) -> Response:
    """The stored response object, or OpenAI's 404 when absent, expired or never stored
    (the message says so when it was too large to store); a 503 ``store_unavailable`` with
    ``Retry-After`` while the shared store cannot be read (it may well be there)."""
    response_id = request.path_params["response_id"]
    if (refusal := _too_long(response_id)) is not None:
        return refusal
    try:
        stored = await response_store_of(request).get(response_id)
    except ResponseNotStored as exc:
        return json_error(404, str(exc), code="not_found", param="response_id")
    except StoreUnavailable as exc:
        return _unavailable(exc)
    if stored is None:
        return _not_found(response_id)
    return _json(stored.response, 200)
