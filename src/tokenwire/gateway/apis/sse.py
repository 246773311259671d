"""Server-sent events as the OpenAI APIs write them, and their finish_reason vocabulary."""

from __future__ import annotations

from typing import Any

import msgspec

from tokenwire.gateway.apis.errors import error_object
from tokenwire.gateway.ir import GATEWAY_FAILURE_CODES, Failure, FailureClass, FinishKind
from tokenwire.gateway.supervision.retry import Budget, budget_for

__all__ = [
    "SSE_CONTENT_TYPE",
    "SSE_DONE",
    "SSE_KEEPALIVE",
    "failure_output",
    "internal_error_output",
    "json_bytes",
    "openai_error_code",
    "openai_finish_reason",
    "sse_data",
]

SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"
#: The sentinel the ``openai`` SDK stops on (it never JSON-decodes it).
SSE_DONE = b"data: [DONE]\n\n"
#: The Chat / Completions keep-alive: an SSE comment, which every SSE parser skips (a data
#: chunk with no choices would break clients that read ``choices[0]``).
SSE_KEEPALIVE = b": keep-alive\n\n"

_encode = msgspec.json.Encoder().encode

_OPENAI_REASONS: dict[FinishKind, str] = {
    FinishKind.EOS: "stop",
    FinishKind.STOP_SEQUENCE: "stop",
    FinishKind.LENGTH: "length",
    FinishKind.POLICY_VIOLATION: "content_filter",
    FinishKind.TOOL_CALLS: "tool_calls",
    FinishKind.CONTENT_FILTER: "content_filter",
    FinishKind.ABORT: "stop",  # only seen when the client has already gone
}


def openai_finish_reason(kind: FinishKind, *, chat: bool) -> str:
    """OpenAI's words; Completions has no ``tool_calls`` value, so it says ``stop``."""
    reason = _OPENAI_REASONS[kind]
    return "stop" if reason == "tool_calls" and not chat else reason


def sse_data(obj: Any) -> bytes:
    """One ``data:`` event. JSON never contains a raw newline, so one line is enough."""
    return b"data: " + _encode(obj) + b"\n\n"


def json_bytes(obj: Any) -> bytes:
    return _encode(obj)


#: OpenAI's own codes where one exists (agents and SDK users match on these); the gateway's
#: own failures by their code (``server_shutting_down``, ``idle_timeout``, ...); every other
#: class by its name (``capacity``, ``timeout``, ``upstream``, ...; README "Error codes").
_OPENAI_CODES = {
    FailureClass.CONTEXT_LENGTH: "context_length_exceeded",
    FailureClass.RATE_LIMITED: "rate_limit_exceeded",
    FailureClass.QUOTA: "insufficient_quota",
}


def openai_error_code(failure: Failure) -> str:
    """The ``error.code`` of a failure on the OpenAI APIs: a 429 the retry budgets treat
    as final (a named quota, a long ``Retry-After``) is ``insufficient_quota``, not a
    throttle the client should retry."""
    if failure.failure_class is FailureClass.RATE_LIMITED and \
            budget_for(failure) is Budget.FINAL:
        return "insufficient_quota"
    if failure.code in GATEWAY_FAILURE_CODES:
        return failure.code  # type: ignore[return-value]  # checked just above
    if failure.failure_class is FailureClass.INVALID_REQUEST and failure.param is not None \
            and failure.code:
        return failure.code  # a field the engine refused, named like the parsers name it
    return _OPENAI_CODES.get(failure.failure_class, failure.failure_class.value)


def failure_output(failure: Failure, *, stream: bool) -> list[bytes]:
    """A failure as the OpenAI APIs report it: an ``{"error": ...}`` event then ``[DONE]``
    in a stream (the ``openai`` SDK raises on it), the error body otherwise."""
    err = error_object(failure.message, status=failure.status, code=openai_error_code(failure),
                       param=failure.param)
    return [sse_data(err), SSE_DONE] if stream else [json_bytes(err)]


def internal_error_output(exc: BaseException, *, stream: bool) -> list[bytes]:
    """An exception after the response started: its type and message stay in the server
    log (seed privacy rules); the client learns that the gateway, not the model, failed."""
    del exc
    err = error_object("the generation failed inside the gateway", status=500,
                       code="internal_error")
    return [sse_data(err), SSE_DONE] if stream else [json_bytes(err)]
