"""OpenAI's JSON error shape, the one every non-Anthropic 4xx/5xx of the gateway uses.

``{"error": {"message", "type", "param", "code"}}`` is what the ``openai`` SDK parses into
``APIError.message`` / ``.type`` / ``.param`` / ``.code``, so agents built on it show our
message and can branch on the code. ``type`` follows OpenAI: ``invalid_request_error`` for
every 4xx but 401/403/429, ``server_error`` for 5xx. ``code`` is OpenAI's own word where one
exists (``invalid_value``, ``invalid_type``, ``missing_required_parameter``,
``unsupported_value``, ``model_not_found``, ``context_length_exceeded``, ``unknown_url``,
...) and a stable, documented one of ours otherwise (README "Error codes"); ``param`` names
the request field at fault. The same object inside an SSE ``data:`` line is how a JSON
stream reports a failure after its headers were sent (the SDK raises ``APIError``). The 426
of codec-spec §5.4 is the one exception: its body is fixed by the spec.
"""

from __future__ import annotations

import json

__all__ = [
    "code_for_status",
    "error_body",
    "error_object",
    "error_type_for_status",
    "retry_after_header",
]

_TYPES: dict[int, str] = {
    401: "authentication_error",
    403: "permission_error",
    429: "rate_limit_error",
}
#: The code of an error that did not name one, by status: never a class name.
_CODES: dict[int, str] = {
    400: "invalid_value",
    401: "invalid_api_key",
    403: "permission_denied",
    404: "unknown_url",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    413: "request_too_large",
    415: "unsupported_media_type",
    422: "invalid_value",
    429: "rate_limit_exceeded",
    500: "internal_error",
    502: "upstream_error",
    503: "server_is_overloaded",
    504: "timeout",
}


def error_type_for_status(status: int) -> str:
    if status in _TYPES:
        return _TYPES[status]
    return "invalid_request_error" if 400 <= status < 500 else "server_error"


def code_for_status(status: int) -> str:
    """The code for an error raised without one (``invalid_value`` for an unknown 4xx)."""
    if status in _CODES:
        return _CODES[status]
    return "invalid_value" if 400 <= status < 500 else "internal_error"


def retry_after_header(retry_after: float | None) -> list[tuple[str, str]]:
    """``Retry-After`` (whole seconds, at least 1) when the failure carries a wait."""
    if retry_after is None:
        return []
    return [("Retry-After", str(max(1, round(retry_after))))]


def error_object(message: str, *, status: int, code: str | None = None,
                 param: str | None = None) -> dict[str, object]:
    """The ``{"error": {...}}`` mapping (for embedding in a stream event)."""
    return {"error": {"message": message, "type": error_type_for_status(status),
                      "param": param, "code": code or code_for_status(status)}}


def error_body(message: str, *, status: int, code: str | None = None,
               param: str | None = None) -> bytes:
    """The JSON bytes of :func:`error_object`."""
    return json.dumps(error_object(message, status=status, code=code, param=param)).encode()
