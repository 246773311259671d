"""Upstream failures -> classified :class:`~tokenwire.gateway.ir.Failure` values, for every
HTTP adapter (OpenAI-compatible, Responses, Anthropic Messages, Codec-native).

The class comes from structured fields first: the error body's ``code`` / ``type`` (OpenAI,
vLLM, llama.cpp, Anthropic's ``{"type": "error", "error": {...}}``), then the HTTP status,
then ``Retry-After``. Context overflow is the one case many servers report only in prose, so
its wordings (gateway-research §3.2-3.4) are matched here, at the adapter boundary and as the
last resort, and only the counts are kept. Transport exceptions (httpx) are translated here
too (STYLE §6 item 3).
"""

from __future__ import annotations

import email.utils
import errno
import math
import re
import socket
import ssl
import time
from collections.abc import Mapping
from typing import Any

import httpx
import msgspec

from tokenwire.gateway.ir import Failure, FailureClass
from tokenwire.gateway.upstreams.http_heads import MalformedAnswer
from tokenwire.gateway.upstreams.http_transport import LeanAnswer
from tokenwire.gateway.upstreams.stream_post import body_pieces

__all__ = [
    "CODE_CLASSES",
    "MALFORMED",
    "MAX_ERROR_BODY_BYTES",
    "MAX_LISTING_BYTES",
    "MAX_MESSAGE_CHARS",
    "MAX_RETRY_AFTER_S",
    "classify_error",
    "connection_fault",
    "context_overflow_counts",
    "error_object",
    "failure_from_exception",
    "failure_from_response",
    "fetch_capped",
    "not_a_stream",
    "overflow_message",
    "read_capped",
    "retry_after_seconds",
]

#: The ``code`` of a stream that broke its own format: the seed's "malformed streams ...
#: never retry automatically" (the retry budget reads it as final).
MALFORMED = "protocol_error"
#: An error body is a small JSON object; a proxy's HTML error page can be large. 64 KiB keeps
#: every real error message and bounds what a broken upstream makes us buffer.
MAX_ERROR_BODY_BYTES = 64 * 1024
#: A model list is a few KB even for hundreds of models; more is not a model list.
MAX_LISTING_BYTES = 1024 * 1024
#: Longest upstream message we keep: enough for any real error, not a whole HTML page.
MAX_MESSAGE_CHARS = 1000

_C = FailureClass
#: HTTP status -> (class, status we answer with). Our own credentials being refused, or the
#: upstream failing, is the gateway's problem (502), not the client's.
_STATUS_CLASSES: dict[int, tuple[FailureClass, int]] = {
    400: (_C.INVALID_REQUEST, 400), 401: (_C.AUTHENTICATION, 502), 402: (_C.QUOTA, 402),
    403: (_C.AUTHENTICATION, 502), 404: (_C.INVALID_REQUEST, 404),
    405: (_C.INVALID_REQUEST, 400), 408: (_C.TIMEOUT, 504), 409: (_C.INVALID_REQUEST, 400),
    413: (_C.INVALID_REQUEST, 413), 415: (_C.INVALID_REQUEST, 400),
    422: (_C.INVALID_REQUEST, 400), 429: (_C.RATE_LIMITED, 429), 500: (_C.UPSTREAM, 502),
    502: (_C.UPSTREAM, 502), 503: (_C.CAPACITY, 503), 504: (_C.TIMEOUT, 504),
    529: (_C.CAPACITY, 503),  # Anthropic "overloaded"
}
#: The status we answer with for a class known from a code alone.
_ANSWER = {
    _C.INVALID_REQUEST: 400, _C.CONTEXT_LENGTH: 400, _C.AUTHENTICATION: 502,
    _C.RATE_LIMITED: 429, _C.QUOTA: 429, _C.CONTENT_FILTER: 400, _C.CAPACITY: 503,
    _C.CONNECTION: 502, _C.TIMEOUT: 504, _C.UPSTREAM: 502, _C.INTERNAL: 500,
}

#: The error body's ``code`` / ``type`` -> (class, status we answer with): OpenAI Chat and
#: Responses (gateway-research §2, §5.6), Anthropic's ``error.type``, llama.cpp, and a Codec
#: peer's own class names (``"capacity"``, ``"context_length"``, ...).
CODE_CLASSES: dict[str, tuple[FailureClass, int]] = {
    **{c.value: (c, _ANSWER[c]) for c in FailureClass},
    "context_length_exceeded": (_C.CONTEXT_LENGTH, 400),
    "exceed_context_size_error": (_C.CONTEXT_LENGTH, 400),
    "rate_limit_exceeded": (_C.RATE_LIMITED, 429),
    "rate_limit_error": (_C.RATE_LIMITED, 429),
    "insufficient_quota": (_C.QUOTA, 429),
    "usage_not_included": (_C.QUOTA, 429),
    "usage_limit_reached": (_C.QUOTA, 429),
    "billing_hard_limit_reached": (_C.QUOTA, 429),
    "billing_error": (_C.QUOTA, 402),
    "server_error": (_C.UPSTREAM, 502),
    "api_error": (_C.UPSTREAM, 502),
    "server_is_overloaded": (_C.CAPACITY, 503),
    "server_overloaded": (_C.CAPACITY, 503),
    "overloaded_error": (_C.CAPACITY, 503),
    "slow_down": (_C.CAPACITY, 503),
    "timeout_error": (_C.TIMEOUT, 504),
    "invalid_prompt": (_C.INVALID_REQUEST, 400),
    "invalid_request_error": (_C.INVALID_REQUEST, 400),
    "invalid_encrypted_content": (_C.INVALID_REQUEST, 400),
    "model_not_found": (_C.INVALID_REQUEST, 404),
    "not_found_error": (_C.INVALID_REQUEST, 404),
    "request_too_large": (_C.INVALID_REQUEST, 413),
    "invalid_api_key": (_C.AUTHENTICATION, 502),
    "authentication_error": (_C.AUTHENTICATION, 502),
    "permission_error": (_C.AUTHENTICATION, 502),
    "bio_policy": (_C.CONTENT_FILTER, 400),
    "cyber_policy": (_C.CONTENT_FILTER, 400),
    "misalignment_policy_violation": (_C.CONTENT_FILTER, 400),
    "image_content_policy_violation": (_C.CONTENT_FILTER, 400),
    "content_policy_violation": (_C.CONTENT_FILTER, 400),
    "content_filter": (_C.CONTENT_FILTER, 400),
}
#: Catch-all codes that say less than an HTTP status: with a status, the status decides
#: (OpenAI sends ``invalid_request_error`` with a 401; vLLM ``BadRequestError`` with a 500).
_GENERIC_CODES = frozenset({"invalid_request_error", "api_error", "server_error", "error"})

# Context-overflow wordings: vLLM (several releases), llama.cpp, Anthropic, Ollama, OpenAI.
_OVERFLOW = re.compile(
    r"maximum context length|context (?:length|window|size)|maximum context"
    r"|exceeds? (?:the )?(?:available )?context|prompt is too long|input length exceeds"
    r"|parameter=input_tokens|too many tokens|maximum input length", re.IGNORECASE)
#: The prompt's count, most specific wording first (OpenAI's "N in the messages" beats its
#: "requested N", which includes the completion).
_PROMPT = (
    re.compile(r"(\d+) in the messages|(\d+) input tokens|request \((\d+) tokens\)"
               r"|prompt is too long: (\d+) tokens|passed (\d+) input"
               r"|exceed context limit: (\d+) \+", re.IGNORECASE),
    re.compile(r"maximum context length is \d+ tokens.*?(?:resulted in|requested|has"
               r"|contains(?: \(at least\))?) (\d+)", re.IGNORECASE | re.DOTALL),
    re.compile(r"(?:has|contains(?: \(at least\))?|passed|prompt is|request \() ?(\d+)"
               r"(?: input)? tokens", re.IGNORECASE),
)
_CTX = (
    re.compile(r"prompt is too long: \d+ tokens > (\d+)|tokens > (\d+) maximum"
               r"|exceed context limit: \d+ \+ \d+ > (\d+)", re.IGNORECASE),
    re.compile(r"(?:maximum context length|context length|context size|context window)"
               r"(?: is)?(?: only)?\D{0,12}?(\d+)", re.IGNORECASE),
)


#: The longest wait an upstream's ``Retry-After`` is read as (a day): past the retry budget
#: either way, and what the client is told to wait in turn. A longer value, or one that is
#: not a finite number (``inf``, ``1e400``), would be a wait no one means.
MAX_RETRY_AFTER_S = 86_400.0


def retry_after_seconds(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds from ``Retry-After`` (delta-seconds or HTTP-date, RFC 9110 §10.2.3), or from
    the ``retry-after-ms`` header some OpenAI-compatible APIs send; at most
    :data:`MAX_RETRY_AFTER_S` (``inf`` too), None when neither is a number or a date."""
    ms = headers.get("retry-after-ms")
    if ms is not None and (seconds := _finite(ms, 1000)) is not None:
        return seconds
    value = headers.get("retry-after")
    if value is None:
        return None
    if (seconds := _finite(value, 1)) is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, OverflowError):
        return None
    return min(MAX_RETRY_AFTER_S, max(0.0, when - (time.time() if now is None else now)))


def _finite(value: str, per_second: int) -> float | None:
    """``value`` / ``per_second`` in [0, MAX_RETRY_AFTER_S] (NaN: 0), None if not a number."""
    try:
        seconds = float(value) / per_second
    except ValueError:
        return None
    if math.isinf(seconds):
        return None if seconds < 0 else MAX_RETRY_AFTER_S
    return min(MAX_RETRY_AFTER_S, max(0.0, seconds))


def context_overflow_counts(message: str, err: Mapping[str, Any] | None = None,
                            ) -> tuple[int | None, int | None] | None:
    """``(prompt_tokens, context_tokens)`` if ``message`` reports a context overflow (either
    count None when not stated), else None. See :func:`_counts`."""
    return _counts(err or {}, message) if _OVERFLOW.search(message) else None


def _counts(err: Mapping[str, Any], message: str) -> tuple[int | None, int | None]:
    """(prompt tokens, context tokens): llama.cpp's fields, else the message's numbers."""
    prompt, ctx = err.get("n_prompt_tokens"), err.get("n_ctx")
    if isinstance(prompt, int) and isinstance(ctx, int):
        return prompt, ctx
    return _first_number(_PROMPT, message), _first_number(_CTX, message)


def _first_number(patterns: tuple[re.Pattern[str], ...], message: str) -> int | None:
    for pattern in patterns:
        if m := pattern.search(message):
            return next(int(g) for g in m.groups() if g)
    return None


def error_object(body: bytes) -> dict[str, Any]:
    """The error object of an error body: OpenAI / vLLM / llama.cpp ``{"error": {...}}``,
    Anthropic ``{"type": "error", "error": {...}}``, FastAPI ``{"detail": ...}``, a bare
    object, or text (its start becomes the message)."""
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return {"message": body[:MAX_MESSAGE_CHARS].decode("utf-8", "replace").strip()}
    if not isinstance(doc, dict):
        return {"message": str(doc)[:MAX_MESSAGE_CHARS]}
    inner = doc.get("error", doc)
    err = dict(inner) if isinstance(inner, dict) else {"message": str(inner)}
    if not err.get("message") and doc.get("detail"):
        detail = doc["detail"]
        err["message"] = detail if isinstance(detail, str) else msgspec.json.encode(
            detail).decode()
    return err


def overflow_message(prompt_tokens: int | None, context_tokens: int | None) -> str:
    """The one wording of a context overflow, whichever upstream reported it: the counts
    when known, never the upstream's own prose (which can quote the prompt)."""
    if prompt_tokens is not None and context_tokens is not None:
        return (f"the prompt is {prompt_tokens} tokens, more than the model's context window "
                f"of {context_tokens} tokens allows")
    if context_tokens is not None:
        return f"the prompt does not fit the model's context window of {context_tokens} tokens"
    return "the prompt does not fit the model's context window"


def classify_error(err: Mapping[str, Any], *, status: int | None,
                   retry_after: float | None = None) -> Failure:
    """The Failure for an error object, from an HTTP error body (``status``) or from a
    mid-stream error event (``status`` None; vLLM puts the HTTP status in an integer
    ``code``, gateway-research §3.2).

    ``code``, then ``type``, decide the class when they are known and specific; else the
    status does. Overflow wording turns an invalid request into ``CONTEXT_LENGTH``.
    """
    raw_code, kind = err.get("code"), err.get("type")
    code = raw_code if isinstance(raw_code, str) else None
    kind = kind if isinstance(kind, str) and kind != "error" else None
    if status is None and isinstance(raw_code, int) and not isinstance(raw_code, bool):
        status = raw_code
    message = str(err.get("message") or (f"upstream answered HTTP {status}" if status
                                         else "the upstream reported an error"))
    cls, answer = _class_of(code, kind, status)
    prompt = ctx = None
    if cls is _C.INVALID_REQUEST and status in (None, 400, 413, 422) and _OVERFLOW.search(
            message):
        cls, answer = _C.CONTEXT_LENGTH, 400
    if cls is _C.CONTEXT_LENGTH:
        prompt, ctx = _counts(err, message)
        message = overflow_message(prompt, ctx)  # seed: "keeping only the token counts"
    return Failure(failure_class=cls, message=message[:MAX_MESSAGE_CHARS], status=answer,
                   retry_after=retry_after, code=code or kind, prompt_tokens=prompt,
                   context_tokens=ctx)


def _class_of(code: str | None, kind: str | None,
              status: int | None) -> tuple[FailureClass, int]:
    for key in (code, kind):
        if key in CODE_CLASSES and not (status is not None and key in _GENERIC_CODES):
            return CODE_CLASSES[key]
    if code and code.startswith(("invalid_", "image_")):  # OpenAI's per-field input errors
        return _C.INVALID_REQUEST, 400
    if status is None:
        return _C.UPSTREAM, 502  # a mid-stream error with no status: the engine failed
    if status in _STATUS_CLASSES:
        return _STATUS_CLASSES[status]
    return (_C.INVALID_REQUEST, 400) if status < 500 else (_C.UPSTREAM, 502)


def failure_from_response(status: int, headers: Mapping[str, str], body: bytes) -> Failure:
    """The Failure for an error status answered before the stream started."""
    return classify_error(error_object(body), status=status,
                          retry_after=retry_after_seconds(headers))


def not_a_stream(content_type: str, body: bytes) -> Failure:
    """The Failure for a 2xx answer to a streamed request that is not an event stream. An
    error object there (``{"error": {...}}``: a server or proxy that reports a failed stream
    with a 200) is the failure it names, classified as a mid-stream error is; it used to be
    a bare "expected text/event-stream" 502 that dropped the upstream's reason and class
    (a context overflow was retried). Anything else is a broken answer, final."""
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError:
        doc = None
    if isinstance(doc, dict) and (isinstance(doc.get("error"), dict)
                                  or doc.get("object") == "error"):
        return classify_error(error_object(body), status=None)
    # Final (README "When things go wrong"), as the Codec adapter's mismatch is: the same
    # request gets the same page. Without a code it was retried once as a 5xx.
    return Failure(failure_class=_C.UPSTREAM, status=502, code="content_type_mismatch",
                   message=f"expected text/event-stream, got {content_type!r}")


def failure_from_exception(exc: httpx.HTTPError, *, started: bool,
                           where: str = "upstream") -> Failure:
    """httpx's errors, translated at this boundary (STYLE §6 item 3). A connection that
    broke before any byte came back is CONNECTION (safe to retry elsewhere); after, UPSTREAM.
    CONNECTION failures carry a ``code`` naming the fault (:func:`connection_fault`), which is
    what the retry budget reads to tell transient faults from final ones.
    httpx messages name the URL at most, never headers, so no key can leak through them."""
    code = None
    if isinstance(exc, httpx.ConnectTimeout):
        cls, what, code = _C.CONNECTION, "could not connect", "connect_timeout"
    elif isinstance(exc, httpx.ConnectError):
        cls, what, code = _C.CONNECTION, "could not connect", connection_fault(exc)
    elif isinstance(exc, httpx.TimeoutException):
        # Final for the retry budget: a retry would wait the whole read timeout again.
        cls, what, code = _C.TIMEOUT, "timed out", "read_timeout"
    elif isinstance(exc, MalformedAnswer | httpx.DecodingError):
        # Broken framing or a body its Content-Encoding cannot decode: the same bytes
        # again, so final (they were retried as a lost connection for up to 120 s).
        cls, what, code = _C.UPSTREAM, "sent a malformed answer", MALFORMED
    elif started:
        cls, what = _C.UPSTREAM, "broke the stream"
    else:
        cls, what, code = _C.CONNECTION, "connection lost", "connection_reset"
    return Failure(failure_class=cls, status=_ANSWER[cls], code=code,
                   message=f"{where} {what}: {type(exc).__name__}: {exc}".rstrip(": ")[
                       :MAX_MESSAGE_CHARS])


#: getaddrinfo results that may clear by themselves (the seed's "temporary DNS failures").
_TEMPORARY_DNS = frozenset({socket.EAI_AGAIN})


def connection_fault(exc: BaseException) -> str:
    """Name the cause of a failed connect from the exception chain httpx keeps
    (``__cause__`` / ``__context__``): ``connection_reset`` and ``dns_temporary`` are the
    transient faults the seed retries on a budget; ``connection_refused``,
    ``certificate_error``, ``dns_permanent`` and ``unknown_network_fault`` are final."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ssl.SSLError | ssl.CertificateError):
            return "certificate_error"
        if isinstance(cause, socket.gaierror):
            return "dns_temporary" if cause.errno in _TEMPORARY_DNS else "dns_permanent"
        if isinstance(cause, ConnectionRefusedError) or getattr(cause, "errno", None) \
                == errno.ECONNREFUSED:
            return "connection_refused"
        if isinstance(cause, ConnectionResetError | ConnectionAbortedError | BrokenPipeError):
            return "connection_reset"
        cause = cause.__cause__ or cause.__context__
    return "unknown_network_fault"


async def read_capped(resp: httpx.Response | LeanAnswer, limit: int = MAX_ERROR_BODY_BYTES,
                      *, partial: bool = True) -> bytes:
    """At most ``limit`` bytes of a small answer's body (an error, a model listing, a
    count), decoded in bounded pieces. With ``partial``, what came before a read failed (a
    cut or undecodable body): an error's status alone still classifies it; without, the
    read's ``httpx.HTTPError`` is raised (a listing cut short is no listing). The caller
    closes the response."""
    out = bytearray()
    try:
        async for chunk in body_pieces(resp):
            out += chunk[: limit - len(out)]
            if len(out) >= limit:
                break
    except httpx.HTTPError:
        if not partial:
            raise
    return bytes(out)


async def fetch_capped(client: httpx.AsyncClient, method: str, url: str,
                       limit: int = MAX_LISTING_BYTES,
                       **kwargs: Any) -> tuple[int, httpx.Headers, bytes]:
    """A small request's status, headers and at most ``limit`` bytes of its body
    (:func:`read_capped` without ``partial``): ``client.request`` read the whole body,
    however large, and decoded it with httpx's unbounded decoders."""
    async with client.stream(method, url, **kwargs) as resp:
        return resp.status_code, resp.headers, await read_capped(resp, limit, partial=False)
