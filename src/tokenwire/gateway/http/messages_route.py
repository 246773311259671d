"""``POST /v1/messages``: the Anthropic Messages route over :mod:`tokenwire.gateway.apis.messages`.

The routed upstream's kind decides whether signed thinking may travel (only to and from an
Anthropic upstream, the only kind that can verify a signature). Every error of this route
uses Anthropic's shape ``{"type": "error", "error": {"type", "message"}}``, never OpenAI's.
"""

from __future__ import annotations

import logging
import secrets

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from tokenwire.errors import ProtocolError, TokenwireError, UnknownModel
from tokenwire.gateway.apis.messages import (
    MessagesRenderer,
    anthropic_error_body,
    failure_response,
    type_for_status,
)
from tokenwire.gateway.apis.messages_request import parse_messages_request
from tokenwire.gateway.apis.params import bad_request
from tokenwire.gateway.apis.sse import json_bytes
from tokenwire.gateway.http.generation import route_model, start_generation
from tokenwire.gateway.http.requests import read_json, upgrade_response

__all__ = ["messages_endpoint"]

log = logging.getLogger(__name__)

_ANTHROPIC_KIND = "anthropic"


def _error_response(status: int, message: str, *, type_: str | None = None,
                    headers: dict[str, str] | None = None) -> Response:
    body = json_bytes(anthropic_error_body(type_ or type_for_status(status), message))
    return Response(body, status_code=status, media_type="application/json", headers=headers)


async def messages_endpoint(request: Request) -> Response:
    """``POST /v1/messages``; every error in Anthropic's shape."""
    state = request.app.state.gateway
    try:
        if (upgrade := upgrade_response(state, request)) is not None:
            return upgrade
        body = await read_json(request, state.settings.max_body_bytes)
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        model = body.get("model")
        served = route_model(state, model if isinstance(model, str) else None, None)
        upstream = served.upstream
        signed_by = getattr(upstream, "name", served.upstream_name) \
            if getattr(upstream, "kind", None) == _ANTHROPIC_KIND else None
        rid = "msg_" + secrets.token_hex(12)
        call = parse_messages_request(body, request_id=rid, encrypted_for=signed_by)
        for note in call.notes:
            log.info("%s: %s", rid, note)
        renderer = MessagesRenderer(message_id=rid, model=served.name, stream=call.stream,
                                    signed_by=signed_by)
        resp = start_generation(state, request, served, call.request, renderer, "json",
                                    streaming=call.stream, on_failure=failure_response)
    except UnknownModel as exc:
        return _error_response(404, str(exc), type_="not_found_error")
    except ProtocolError as exc:
        status = exc.status_hint if 400 <= exc.status_hint <= 599 else 400
        return _error_response(status, str(exc))
    except HTTPException as exc:
        return _error_response(exc.status_code, str(exc.detail))
    except TokenwireError as exc:
        status = getattr(exc, "status_hint", 500)
        return _error_response(status if 400 <= status <= 599 else 500, str(exc))
    return resp  # type: ignore[return-value]  # an EventResponse is an ASGI app too

