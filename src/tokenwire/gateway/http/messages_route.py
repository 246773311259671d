"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: the Anthropic Messages
routes over :mod:`tokenwire.gateway.apis.messages`.

The routed upstream's kind decides whether signed thinking may travel (only to and from an
Anthropic upstream, the only kind that can verify a signature). Every error of these routes
uses Anthropic's shape ``{"type": "error", "error": {"type", "message"}}``, never OpenAI's:
what they raise is rendered by :mod:`.errors`, which picks the shape by path.

``count_tokens`` answers ``{"input_tokens": N}``: the prompt exactly as the model would be
given it (system, tools and the chat template included), from the upstream that would
generate. The embedded engine counts the ids it would evaluate; an Anthropic upstream is
asked itself. Other upstream kinds cannot say (no counting endpoint, and tokenwire holds no
chat template for their models): a 400 says so instead of a guess.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tokenwire.gateway.apis.messages import MessagesRenderer, failure_response
from tokenwire.gateway.apis.messages_request import MessagesCall, parse_messages_request
from tokenwire.gateway.apis.params import bad_request
from tokenwire.gateway.http.generation import check_inputs, start_generation
from tokenwire.gateway.http.requests import decode_json, named, read_parsed, upgrade_response
from tokenwire.gateway.ir import Failure, kind_of
from tokenwire.gateway.routing.router import Router, ServedModel

__all__ = ["count_tokens_endpoint", "messages_endpoint"]

log = logging.getLogger(__name__)

_ANTHROPIC_KIND = "anthropic"


async def _parse(request: Request, *, counting: bool) -> tuple[ServedModel, MessagesCall]:
    """The routed model and the parsed body (raises what :mod:`.errors` renders)."""
    state = request.app.state.gateway
    rid = named(request, "msg_" + secrets.token_hex(12))
    return await read_parsed(request, state.settings.max_body_bytes, _routed_call,
                             state.router, rid, counting)


def _routed_call(raw: bytes, router: Router, rid: str,
                 counting: bool) -> tuple[ServedModel, MessagesCall]:
    """Decode, route and parse one body: the model decides whether signed thinking is kept,
    so routing sits between decoding and parsing. It may run on a worker thread
    (``read_parsed``): the router is read once, on the loop, and a lookup only reads it."""
    body = decode_json(raw)
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object", code="invalid_type")
    model = body.get("model")
    served = router.route(model if isinstance(model, str) else None)
    upstream = served.upstream
    signed_by = getattr(upstream, "name", served.upstream_name) \
        if kind_of(upstream) == _ANTHROPIC_KIND else None
    call = parse_messages_request(body, request_id=rid, encrypted_for=signed_by,
                                  counting=counting)
    return served, call


async def messages_endpoint(request: Request) -> Any:
    """``POST /v1/messages``; every error in Anthropic's shape."""
    state = request.app.state.gateway
    if (upgrade := upgrade_response(state, request)) is not None:
        return upgrade
    served, call = await _parse(request, counting=False)
    rid = call.request.request_id
    for note in call.notes:
        log.info("%s: %s", rid, note)
    signed_by = getattr(served.upstream, "name", served.upstream_name) \
        if kind_of(served.upstream) == _ANTHROPIC_KIND else None
    renderer = MessagesRenderer(message_id=rid, model=served.name, stream=call.stream,
                                signed_by=signed_by)
    return start_generation(state, request, served, call.request, renderer, "json",
                            streaming=call.stream, on_failure=failure_response)


async def count_tokens_endpoint(request: Request) -> Response:
    """``POST /v1/messages/count_tokens`` (the ``anthropic`` SDK's ``messages.count_tokens``)."""
    served, call = await _parse(request, counting=True)
    check_inputs(served, call.request)  # what generation would refuse is not counted
    counter = getattr(served.upstream, "count_tokens", None)
    if counter is None and served.usage is not None:  # the model's map and chat template
        counted = await asyncio.to_thread(served.usage.count, call.request)
        if counted is not None:
            return JSONResponse({"input_tokens": counted})
    if counter is None:
        kind = kind_of(served.upstream)
        raise bad_request(
            f"model {served.name!r} cannot count tokens here: its {kind} upstream has no "
            "token-counting endpoint, and tokenwire has no chat template for it",
            param="model", code="unsupported_value")
    counted = await counter(msgspec.structs.replace(call.request, model=served.name))
    if isinstance(counted, Failure):
        status, headers, body = failure_response(counted)
        return Response(body, status_code=status, headers=dict(headers))
    return JSONResponse({"input_tokens": counted})
