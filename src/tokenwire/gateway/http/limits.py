"""Per-key limits at the door: a 429 before the admission queue and any upstream work.

:class:`KeyLimitsMiddleware` sits outside :class:`~.admission.AdmissionMiddleware`: for every
inference request it asks the :class:`~tokenwire.gateway.state.key_limiter.KeyLimiter` about
the key :class:`~.security.SecurityMiddleware` accepted (``KEY_SCOPE_KEY``). A refusal is a
429 with ``Retry-After`` (whole seconds, from the limiter's counts) in the API's own shape:

* OpenAI (Completions, Chat, Responses, and Codec's JSON errors before a stream):
  ``{"error": {"message": "... Please try again in 12s.", "type": "requests" | "tokens",
  "param": null, "code": "rate_limit_exceeded"}}``, what OpenAI itself sends for its RPM/TPM
  limits. ``rate_limit_exceeded`` with "try again in" is what the Codex CLI retries and paces
  by (it gives up only on ``usage_limit_reached`` / ``usage_not_included``);
* Anthropic (``/v1/messages``): ``{"type": "error", "error": {"type": "rate_limit_error",
  "message": ...}}``.

Both carry OpenAI's ``x-ratelimit-limit-*``, ``-remaining-*`` and ``-reset-*`` headers for the
limits the key has; admitted responses carry them too. The lease is released when the
exchange ends, however it ends (completed, failed, client disconnected), charging the tokens
its record reported; a response that completes releases it just before its last body
message, so the charge is counted before the client can send its next request. The
WebSocket transport does the same per ``response.create`` (:func:`limited_error`,
``http/responses_ws.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from tokenwire.gateway.http.admission import send_refusal
from tokenwire.gateway.http.asgi import ASGIApp, Message, Receive, Scope, Send
from tokenwire.gateway.observability.key_metrics import KeyMetrics
from tokenwire.gateway.state.api_keys import ANONYMOUS_KEY, KEY_SCOPE_KEY, ApiKey
from tokenwire.gateway.state.key_limiter import KeyLimiter, Lease
from tokenwire.gateway.state.limits import Limit, Verdict

__all__ = [
    "LEASE_SCOPE_KEY",
    "KeyLimitsMiddleware",
    "end_lease",
    "key_of",
    "limited_message",
    "rate_limit_headers",
    "start_lease",
]


#: Where the middleware leaves the request's :class:`Lease` (``http/state.py`` points it at
#: the request's record, whose usage is charged at release).
LEASE_SCOPE_KEY = "tokenwire.lease"
_WHAT = {Limit.REQUESTS: "requests per min (RPM)", Limit.TOKENS: "tokens per min (TPM)",
         Limit.CONCURRENT: "concurrent requests"}


def key_of(scope: Scope) -> ApiKey:
    """The key the request presented (security.py), or the anonymous loopback one."""
    key = scope.get(KEY_SCOPE_KEY)
    return key if isinstance(key, ApiKey) else ANONYMOUS_KEY


def limited_message(key: ApiKey, verdict: Verdict) -> str:
    """OpenAI's wording, with the key's name (never the key) and Codex's "try again in"."""
    assert verdict.refused is not None
    limits = key.limits
    limit = {Limit.REQUESTS: limits.rpm, Limit.TOKENS: limits.tpm,
             Limit.CONCURRENT: limits.max_concurrent}[verdict.refused]
    return (f"Rate limit reached for API key {key.name!r} on {_WHAT[verdict.refused]}: "
            f"Limit {limit}. Please try again in {verdict.retry_after}s.")


def _duration(seconds: float) -> bytes:
    """OpenAI's reset format: ``1s``, ``6m0s``."""
    s = max(0, math.ceil(seconds))
    return (f"{s // 60}m{s % 60}s" if s >= 60 else f"{s}s").encode()


def rate_limit_headers(key: ApiKey, verdict: Verdict) -> list[tuple[bytes, bytes]]:
    """``x-ratelimit-*`` for the limits ``key`` has (none for an unlimited key)."""
    out: list[tuple[bytes, bytes]] = []
    for kind, limit, remaining, reset in (
            ("requests", key.limits.rpm, verdict.remaining_requests, verdict.reset_requests_s),
            ("tokens", key.limits.tpm, verdict.remaining_tokens, verdict.reset_tokens_s)):
        if limit is None:
            continue
        out += [(f"x-ratelimit-limit-{kind}".encode(), str(limit).encode()),
                (f"x-ratelimit-remaining-{kind}".encode(), str(remaining or 0).encode()),
                (f"x-ratelimit-reset-{kind}".encode(), _duration(reset or 0.0))]
    return out


async def start_lease(limiter: KeyLimiter, metrics: KeyMetrics, key: ApiKey
                      ) -> tuple[Verdict, Lease | None]:
    """Ask the limiter; count the admission or the refusal in the per-key metrics."""
    verdict, lease = await limiter.acquire(key)
    if lease is None:
        assert verdict.refused is not None
        metrics.refused(key.name, verdict.refused.value)
    else:
        metrics.admitted(key.name)
    return verdict, lease


def end_lease(limiter: KeyLimiter, metrics: KeyMetrics, lease: Lease) -> None:
    """The request ended: charge its tokens and free its slot (idempotent)."""
    if lease.released:
        return
    tokens = lease.tokens()
    limiter.release(lease, tokens)
    metrics.ended(lease.key.name, tokens)


class KeyLimitsMiddleware:
    """Per-key limits for every inference request: :class:`~.dispatch.GatewayApp` mounts it
    in front of the inference routes only (:func:`~.admission.is_inference`).

    ``on_rejected(path, status, reason, None)`` hears of each refusal (``key_requests``,
    ``key_tokens``, ``key_concurrent``), as the admission middleware's refusals are heard."""

    def __init__(self, app: ASGIApp, limiter: KeyLimiter, metrics: KeyMetrics,
                 on_rejected: Callable[[str, int, str, str | None], None] | None = None,
                 ) -> None:
        self.app = app
        self.limiter = limiter
        self.metrics = metrics
        self._on_rejected = on_rejected

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = key_of(scope)
        verdict, lease = await start_lease(self.limiter, self.metrics, key)
        headers = rate_limit_headers(key, verdict)
        if lease is None:
            assert verdict.refused is not None
            if self._on_rejected is not None:
                self._on_rejected(scope["path"], 429, f"key_{verdict.refused.value}", None)
            await send_refusal(send, scope["path"], status=429,
                               retry_after_s=verdict.retry_after,
                               message=limited_message(key, verdict),
                               openai=(_openai_type(verdict.refused), "rate_limit_exceeded"),
                               anthropic_type="rate_limit_error", headers=headers)
            return
        scope[LEASE_SCOPE_KEY] = lease

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start" and headers:
                message = {**message, "headers": [*message.get("headers", ()), *headers]}
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                # Charge before the client can see the end: a client that sends its next
                # request the moment this one ends must be counted against it. After the
                # send, the server may already run that request while this task has not
                # reached its ``finally`` (CI saw a 4th request admitted past its TPM).
                end_lease(self.limiter, self.metrics, lease)
            await send(message)

        try:
            await self.app(scope, receive, with_headers)
        finally:
            end_lease(self.limiter, self.metrics, lease)


def _openai_type(limit: Limit) -> str:
    """OpenAI's ``error.type`` for its own limits: ``requests`` or ``tokens``."""
    return "tokens" if limit is Limit.TOKENS else "requests"
