"""HTTP upstream failures -> classified :class:`~tokenwire.gateway.ir.Failure` values.

Used by the OpenAI-compatible adapter (and usable by the Responses / Anthropic ones): the
class comes from structured fields first (HTTP status, the error body's ``type`` / ``code``,
``Retry-After``). Context overflow is the one case that many servers report only in prose,
so its wordings (gateway-research §3.2-3.4) are matched here, at the adapter boundary and
as the last resort, and only the counts are kept.
"""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Mapping
from typing import Any

import httpx
import msgspec

from tokenwire.gateway.ir import Failure, FailureClass

__all__ = [
    "failure_from_error_object",
    "failure_from_exception",
    "failure_from_response",
    "parse_retry_after",
]

#: Longest upstream message we keep: enough for any real error, not a whole HTML page.
MAX_MESSAGE_CHARS = 1000

#: The status the gateway answers with (before any response header is sent), per class.
#: An upstream's 401/403 is about *our* credentials, so the client sees a 502, not a 401.
_STATUS = {
    FailureClass.INVALID_REQUEST: 400, FailureClass.CONTEXT_LENGTH: 400,
    FailureClass.AUTHENTICATION: 502, FailureClass.RATE_LIMITED: 429,
    FailureClass.QUOTA: 503, FailureClass.CONTENT_FILTER: 400,
    FailureClass.CAPACITY: 503, FailureClass.CONNECTION: 502,
    FailureClass.TIMEOUT: 504, FailureClass.UPSTREAM: 502, FailureClass.INTERNAL: 500,
}
_CODES = {  # the error body's ``code`` / ``type`` strings that decide the class
    "context_length_exceeded": FailureClass.CONTEXT_LENGTH,
    "exceed_context_size_error": FailureClass.CONTEXT_LENGTH,
    "insufficient_quota": FailureClass.QUOTA,
    "billing_hard_limit_reached": FailureClass.QUOTA,
    "rate_limit_exceeded": FailureClass.RATE_LIMITED,
    "rate_limit_error": FailureClass.RATE_LIMITED,
    "overloaded_error": FailureClass.CAPACITY,
    "server_overloaded": FailureClass.CAPACITY,
    "content_filter": FailureClass.CONTENT_FILTER,
    "content_policy_violation": FailureClass.CONTENT_FILTER,
    "authentication_error": FailureClass.AUTHENTICATION,
    "invalid_api_key": FailureClass.AUTHENTICATION,
    "permission_error": FailureClass.AUTHENTICATION,
    "timeout": FailureClass.TIMEOUT,
}

# Context-overflow wordings: vLLM (several releases), llama.cpp, Anthropic, Ollama, OpenAI.
_OVERFLOW = re.compile(
    r"maximum context length|context length is only|exceeds the available context size"
    r"|prompt is too long|context window|input length exceeds|parameter=input_tokens"
    r"|too many tokens|maximum input length", re.IGNORECASE)
_CTX = re.compile(r"(?:maximum context length|context length|context size|context window)"
                  r"(?: is)?(?: only)?\D{0,12}?(\d+)", re.IGNORECASE)
_PROMPT = re.compile(r"(\d+) input tokens|(\d+) in the messages|request \((\d+) tokens\)"
                     r"|prompt is too long: (\d+) tokens|passed (\d+) input", re.IGNORECASE)
_ANTHROPIC_MAX = re.compile(r"tokens > (\d+) maximum")


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds from ``Retry-After`` (delta-seconds or HTTP-date, RFC 9110 §10.2.3), or from
    the ``retry-after-ms`` header some OpenAI-compatible APIs send."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


def failure_from_response(status: int, headers: Mapping[str, str], body: bytes) -> Failure:
    """The Failure for an error status answered before the stream started."""
    err: dict[str, Any] = {}
    try:
        parsed = msgspec.json.decode(body)
    except msgspec.DecodeError:
        parsed = None
    if isinstance(parsed, dict):
        inner = parsed.get("error", parsed)
        err = inner if isinstance(inner, dict) else {"message": str(inner)}
        if "detail" in parsed and "message" not in err:  # FastAPI-style {"detail": ...}
            err = {**err, "message": str(parsed["detail"])}
    if not err.get("message"):
        err = {**err, "message": body[:MAX_MESSAGE_CHARS].decode("utf-8", "replace")
               or f"HTTP {status}"}
    return failure_from_error_object(err, status=status, retry_after=parse_retry_after(headers))


def failure_from_error_object(err: Mapping[str, Any], *, status: int | None,
                              retry_after: float | None = None) -> Failure:
    """The Failure for an OpenAI-style error object (``{"message", "type", "code", ...}``),
    from an HTTP error body or a mid-stream ``data: {"error": ...}`` (``status`` None)."""
    message = str(err.get("message") or "upstream error")[:MAX_MESSAGE_CHARS]
    code_s = err.get("code") if isinstance(err.get("code"), str) else None
    type_s = err.get("type") if isinstance(err.get("type"), str) else None
    if status is None and isinstance(err.get("code"), int):
        status = err["code"]  # vLLM puts the HTTP status in ``code`` (gateway-research §3.2)
    cls = _CODES.get(code_s or "") or _CODES.get(type_s or "") or _from_status(status)
    prompt = ctx = None
    if cls is not FailureClass.CONTEXT_LENGTH and (status in (None, 400, 413, 422)) \
            and _OVERFLOW.search(message):
        cls = FailureClass.CONTEXT_LENGTH
    if cls is FailureClass.CONTEXT_LENGTH:
        prompt, ctx = _counts(err, message)
    return Failure(failure_class=cls, message=message, status=_STATUS[cls],
                   retry_after=retry_after, code=code_s or type_s,
                   prompt_tokens=prompt, context_tokens=ctx)


def failure_from_exception(exc: httpx.HTTPError, *, started: bool) -> Failure:
    """httpx's errors, translated at this boundary (STYLE §6 item 3)."""
    if isinstance(exc, httpx.ConnectTimeout | httpx.ConnectError):
        cls = FailureClass.CONNECTION
    elif isinstance(exc, httpx.TimeoutException):
        cls = FailureClass.TIMEOUT
    elif started:
        cls = FailureClass.UPSTREAM  # the stream broke after output began
    else:
        cls = FailureClass.CONNECTION
    return Failure(failure_class=cls, status=_STATUS[cls],
                   message=f"upstream {type(exc).__name__}: {exc}"[:MAX_MESSAGE_CHARS])


def _from_status(status: int | None) -> FailureClass:
    if status is None:
        return FailureClass.UPSTREAM  # a mid-stream error with no status: the engine failed
    if status in (401, 403):
        return FailureClass.AUTHENTICATION
    if status == 402:
        return FailureClass.QUOTA
    if status == 429:
        return FailureClass.RATE_LIMITED
    if status in (408, 504):
        return FailureClass.TIMEOUT
    if status in (503, 529):
        return FailureClass.CAPACITY
    if 400 <= status < 500:
        return FailureClass.INVALID_REQUEST
    return FailureClass.UPSTREAM


def _counts(err: Mapping[str, Any], message: str) -> tuple[int | None, int | None]:
    """(prompt tokens, context tokens): llama.cpp's fields, else the message's numbers."""
    prompt, ctx = err.get("n_prompt_tokens"), err.get("n_ctx")
    if isinstance(prompt, int) and isinstance(ctx, int):
        return prompt, ctx
    m = _PROMPT.search(message)
    p = next((int(g) for g in m.groups() if g), None) if m else None
    c_match = _ANTHROPIC_MAX.search(message) or _CTX.search(message)
    return p, int(c_match.group(1)) if c_match else None
