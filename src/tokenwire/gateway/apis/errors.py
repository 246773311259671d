"""The one JSON error shape every gateway 4xx/5xx uses: OpenAI's.

``{"error": {"message": ..., "type": ..., "code": ...}}`` is what the ``openai`` SDK parses
into ``APIError.message`` / ``.type`` / ``.code``, so agents built on it show our message
instead of a bare status line. The same object, inside an SSE ``data:`` line, is how a
JSON stream reports a failure after its headers were sent (the SDK raises ``APIError``).
The 426 of codec-spec §5.4 is the one exception: its body is fixed by the spec.
"""

from __future__ import annotations

import json

__all__ = ["error_body", "error_object", "error_type_for_status", "retry_after_header"]

_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "request_too_large",
    415: "unsupported_media_type",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_busy",
}


def error_type_for_status(status: int) -> str:
    if status in _TYPES:
        return _TYPES[status]
    return "invalid_request_error" if 400 <= status < 500 else "server_error"


def retry_after_header(retry_after: float | None) -> list[tuple[str, str]]:
    """``Retry-After`` (whole seconds, at least 1) when the failure carries a wait."""
    if retry_after is None:
        return []
    return [("Retry-After", str(max(1, round(retry_after))))]


def error_object(message: str, *, status: int, code: str | None = None) -> dict[str, object]:
    """The ``{"error": {...}}`` mapping (for embedding in a stream event)."""
    return {"error": {"message": message, "type": error_type_for_status(status), "code": code}}


def error_body(message: str, *, status: int, code: str | None = None) -> bytes:
    """The JSON bytes of :func:`error_object`."""
    return json.dumps(error_object(message, status=status, code=code)).encode("utf-8")
