"""The fault table: one row per upstream fault, with what each client API must see.

Issue 6, "How it must be shown": for each fault, the client-visible outcome on the Responses,
Chat Completions and Codec APIs (never a truncated answer presented as success), the number
of upstream attempts, and the elapsed time against the budget. ``test_faults.py`` runs every
row on every API; ``report.py`` prints the same rows as a markdown table.

Times are loop seconds from the client's request to the end of its response body. The
numbers come from the seed ("Provider failures and retry budgets"): one retry after 1 s for
5xx and a clean EOF without a terminal before output; 1, 2, 4, 8, 8 ... s (+-20%) for up to
120 s for transient connection failures and for throttles (or ``Retry-After``); nothing
replayed after output; quota, refused connections and malformed streams final.

Expected failure codes: ``responses`` is the ``response.failed`` ``error.code`` (or the
``response.incomplete`` reason) Codex acts on (gateway-research §2); ``chat`` is the Chat
error's ``code`` (OpenAI's own code where one exists, else the gateway's failure class) or
the ``finish_reason``;
``chat_status`` is the HTTP status when the failure comes before the response head (a
failure after a heartbeat went out is reported in-stream instead); ``codec`` is the final
frame's ``finish_reason``, ``error`` for any failure (an HTTP error status before the head
counts as ``error`` too).

**With a fallback configured** (issue 13) every row runs a second time with a second scripted
upstream serving model ``f``, the primary's ``fallbacks`` and ``context_fallbacks``. On the
APIs a row lists in ``falls_back``, the answer must be the fallback's, whole (its text, its
ids, its usage, ``model: f``), after the primary spent its own budget; on the others the
row's own expectation holds and the fallback is never asked. Rows marked ``fallback_only``
need the fallback (its refusal, its outage, its different map) and run only with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenwire.gateway.supervision.retry import THROTTLE_EXHAUSTED_MESSAGE

from .scripted_upstream import Fault

__all__ = ["ROWS", "Row"]

TEXT = "Hello there, world"
#: What the fallback upstream answers: never a word of the primary's.
FALLBACK_TEXT = "Fallback says hi"


@dataclass(frozen=True)
class Row:
    """One fault and what must follow from it (see the module docstring)."""

    id: str
    fault: str  # the table's description of the fault
    script: tuple[Fault, ...]
    attempts: tuple[int, int]  # upstream attempts seen per client request, inclusive bounds
    elapsed: tuple[float, float]  # loop seconds, inclusive bounds
    responses: str  # "completed", "failed:<code>" or "incomplete:<reason>"
    chat: str  # "finish:<reason>" or "error:<code>"
    codec: str  # final frame finish_reason ("error" for any failure)
    chat_status: int | None = None  # the HTTP status when the failure precedes the head
    partial: str | None = None  # text the client must have got before the failure
    message: str | None = None  # a substring of the Responses failure message
    budget: str = ""  # the table's "budget" column
    settings: dict[str, Any] = field(default_factory=dict)
    refused: bool = False
    cycle: bool = False
    requests: int = 1  # sequential client requests (a flapping upstream)
    gaps: tuple[tuple[float, float], ...] = ()  # bounds on the waits between attempts
    xfail: dict[str, str] = field(default_factory=dict)  # api -> reason (strict)
    kind: str = "openai"  # the upstream's kind: "openai" (Chat/Completions) or "responses"
    #: The APIs the row runs on: a Responses upstream is text-only (no map configured here),
    #: so the Codec API refuses its model with a 400 before anything happens.
    apis: tuple[str, ...] = ("responses", "chat", "codec")
    #: With a fallback: the APIs whose answer the fallback serves (module docstring).
    falls_back: tuple[str, ...] = ()
    #: The fallback upstream's script, and its attempts per client request when that is not
    #: simply "1 where it serves, 0 elsewhere".
    fallback_script: tuple[Fault, ...] = (Fault.ok(FALLBACK_TEXT),)
    fallback_attempts: tuple[int, int] | None = None
    #: Loop seconds with a fallback (default: ``elapsed``, when the primary gave up).
    fallback_elapsed: tuple[float, float] | None = None
    #: The row is about the fallback itself: it runs only with one.
    fallback_only: bool = False
    #: The fallback model's map: ``same`` as the primary's, or ``other`` (a Codec request
    #: cannot fall back to it).
    fallback_map: str = "same"
    #: A substring of the client's failure message on the APIs the fallback does not serve.
    fallback_message: str | None = None

    @property
    def success(self) -> bool:
        return self.responses == "completed"


def _overflow(message: str, **kw: Any) -> Fault:
    return Fault.status(400, message=message, **kw)


def _backoff(n: int) -> tuple[tuple[float, float], ...]:
    """The seed's waits 1, 2, 4, 8, 8 ... s, each +-20% (a little slack for the loop)."""
    return tuple((0.8 * min(8.0, 2.0 ** i) - 0.05, 1.2 * min(8.0, 2.0 ** i) + 0.3)
                 for i in range(n))


_VLLM_V09 = ("This model's maximum context length is 4096 tokens. However, you requested "
             "5000 tokens (4900 in the messages, 100 in the completion). Please reduce the "
             "length of the messages or completion.")
_VLLM_V011 = ("This model's maximum context length is 4096 tokens. However, your request has "
              "4900 input tokens. Please reduce the length of the input messages.")
_VLLM_V011_MAX = ("'max_tokens' or 'max_completion_tokens' is too large: 300. This model's "
                  "maximum context length is 4096 tokens and your request has 3900 input "
                  "tokens (300 > 4096 - 3900).")
_VLLM_V02X = ("This model's maximum context length is 4096 tokens. However, you requested "
              "100 output tokens and your prompt contains (at least) 4900 input tokens, for a "
              "total of (at least) 5000 tokens. Please reduce the length of the input prompt "
              "or the number of requested output tokens. (parameter=input_tokens, value=4900)")
_VLLM_PASSED = ("You passed 4900 input tokens and requested 100 output tokens. However, the "
                "model's context length is only 4096 tokens, resulting in a maximum input "
                "length of 3996 tokens. Please reduce the length of the input prompt.")
_LLAMA_CPP = ("request (4900 tokens) exceeds the available context size (4096 tokens), try "
              "increasing it")
_OPENAI = ("This model's maximum context length is 8192 tokens. However, your messages "
           "resulted in 9000 tokens. Please reduce the length of the messages.")

_TEXT_APIS = ("responses", "chat")
_ALL = ("responses", "chat", "codec")
_OK = dict(responses="completed", chat="finish:stop", codec="eos_token")
_OVERFLOW = dict(attempts=(1, 1), elapsed=(0.0, 0.5), responses="failed:context_length_exceeded",
                 chat="error:context_length_exceeded", chat_status=400, codec="error",
                 budget="final")
#: The upstream's throttle wait when a 429 has no Retry-After: 120 s of the seed's backoff
#: holds 1 + 2 + 4 + 8 * 13.6 s, so 14 to 22 attempts with jitter, and the last one at most
#: one 9.6 s wait before the 120 s mark.
_BUDGET_ATTEMPTS = (13, 22)

ROWS: tuple[Row, ...] = (
    Row("429-retry-after", "429 `rate_limit_exceeded`, `Retry-After: 5`, then OK",
        (Fault.status(429, retry_after=5, code="rate_limit_exceeded"), Fault.ok(TEXT)),
        attempts=(2, 2), elapsed=(5.0, 5.5), budget="throttle (Retry-After)",
        gaps=((5.0, 5.3),), **_OK),
    Row("429-unnamed-retry-after", "429 with no code, `Retry-After: 3`, then OK",
        (Fault.status(429, retry_after=3), Fault.ok(TEXT)),
        attempts=(2, 2), elapsed=(3.0, 3.5), budget="throttle (unnamed, <= 60 s)",
        gaps=((3.0, 3.3),), **_OK),
    Row("429-persistent", "429 `rate_limit_exceeded`, no `Retry-After`, persistent",
        (Fault.status(429, code="rate_limit_exceeded"),),
        attempts=_BUDGET_ATTEMPTS, elapsed=(100.0, 120.0), budget="throttle 120 s",
        responses="failed:rate_limit_exceeded", chat="error:rate_limit_exceeded", codec="error",
        message=THROTTLE_EXHAUSTED_MESSAGE, gaps=_backoff(4),
        falls_back=_ALL, fallback_elapsed=(100.0, 120.5)),
    Row("429-unnamed-final", "429 with no code and no `Retry-After`",
        (Fault.status(429),),
        attempts=(1, 1), elapsed=(0.0, 0.5), budget="final (usage limit)",
        responses="failed:invalid_prompt", chat="error:insufficient_quota", chat_status=429,
        codec="error", message="Provider credits or quota are exhausted",
        falls_back=_ALL),
    Row("429-unnamed-long", "429 with no code, `Retry-After: 90`",
        (Fault.status(429, retry_after=90),),
        attempts=(1, 1), elapsed=(0.0, 0.5), budget="final (Retry-After > 60 s)",
        responses="failed:invalid_prompt", chat="error:insufficient_quota", chat_status=429,
        codec="error",
        falls_back=_ALL),
    Row("429-named-long", "429 `rate_limit_exceeded`, `Retry-After: 90`, persistent",
        (Fault.status(429, retry_after=90, code="rate_limit_exceeded"),),
        attempts=(2, 2), elapsed=(90.0, 90.5), budget="throttle 120 s (2nd wait refused)",
        responses="failed:rate_limit_exceeded", chat="error:rate_limit_exceeded", codec="error",
        message=THROTTLE_EXHAUSTED_MESSAGE, gaps=((90.0, 90.3),),
        falls_back=_ALL),
    Row("throttle-then-reset", "429 `Retry-After: 60`, 429 `Retry-After: 50`, 2 resets, OK",
        (Fault.status(429, retry_after=60, code="rate_limit_exceeded"),
         Fault.status(429, retry_after=50, code="rate_limit_exceeded"),
         Fault.reset(), Fault.reset(), Fault.ok(TEXT)),
        attempts=(5, 5), elapsed=(112.4, 113.9),
        budget="throttle 110 s, then a fresh connection budget",
        gaps=((60.0, 60.3), (50.0, 50.3), *_backoff(2)), **_OK),
    Row("429-quota", "429 `insufficient_quota`",
        (Fault.status(429, code="insufficient_quota", type="insufficient_quota"),),
        attempts=(1, 1), elapsed=(0.0, 0.5), budget="final (quota)",
        responses="failed:insufficient_quota", chat="error:insufficient_quota", chat_status=429,
        codec="error", message="Provider credits or quota are exhausted",
        falls_back=_ALL),
    Row("500-once", "500 once, then OK",
        (Fault.status(500, code="server_error", type="server_error"), Fault.ok(TEXT)),
        attempts=(2, 2), elapsed=(1.0, 1.5), budget="single retry after 1 s",
        gaps=((1.0, 1.3),), **_OK),
    Row("503-persistent", "503 persistent",
        (Fault.status(503),),
        attempts=(2, 2), elapsed=(1.0, 1.5), budget="single retry after 1 s",
        responses="failed:server_is_overloaded", chat="error:capacity", chat_status=503,
        codec="error", gaps=((1.0, 1.3),),
        falls_back=_ALL),
    Row("refused", "connection refused (closed port: no attempt reaches a server)",
        (Fault.ok(TEXT),),
        attempts=(0, 0), elapsed=(0.0, 0.5), budget="final (refused)", refused=True,
        responses="failed:server_error", chat="error:connection", chat_status=502,
        codec="error",
        falls_back=_ALL),
    Row("reset-then-ok", "TCP reset before headers twice, then OK",
        (Fault.reset(), Fault.reset(), Fault.ok(TEXT)),
        attempts=(3, 3), elapsed=(2.4, 3.9), budget="connection 1, 2 s (+-20%)",
        gaps=_backoff(2), **_OK),
    Row("reset-persistent", "TCP reset before headers, persistent", (Fault.reset(),),
        attempts=_BUDGET_ATTEMPTS, elapsed=(100.0, 120.0), budget="connection 120 s",
        responses="failed:server_error", chat="error:connection", codec="error",
        gaps=_backoff(4),
        falls_back=_ALL, fallback_elapsed=(100.0, 120.5)),
    Row("no-response", "no response (request read, never answered)", (Fault.hang(),),
        attempts=(1, 1), elapsed=(300.0, 300.5),
        budget="read timeout 300 s, final (a retry would wait it again)",
        responses="failed:server_error", chat="error:timeout", codec="error",
        falls_back=_ALL),
    Row("slow-first-token", "first token after 30 s", (Fault.ok(TEXT, delay_s=30),),
        attempts=(1, 1), elapsed=(30.0, 30.5), budget="none (heartbeats)", **_OK),
    Row("request-cap", "a chunk every 30 s (`request_cap_s = 100`)",
        (Fault.ok("a b c d e f g h", gap_s=30),),
        attempts=(1, 1), elapsed=(100.0, 100.5), budget="request cap 100 s",
        partial="a b c d", settings={"request_cap_s": 100.0},
        responses="failed:request_timeout", chat="error:request_timeout", codec="error",
        message="100 s cap"),
    Row("cut-mid-answer", "connection closed after 2 chunks (no `[DONE]`)",
        (Fault.cut(TEXT, after=2),),
        attempts=(1, 1), elapsed=(0.0, 0.5), budget="none (output published)",
        partial="Hello there,", responses="failed:server_error", chat="error:upstream",
        codec="error"),
    Row("stall", "2 chunks, then silence (`idle_timeout_s = 60`)",
        (Fault.stall(TEXT, after=2),),
        attempts=(1, 1), elapsed=(60.0, 60.5), budget="idle 60 s", partial="Hello there,",
        settings={"idle_timeout_s": 60.0}, responses="failed:idle_timeout",
        chat="error:idle_timeout", codec="error", message="nothing happened for 60 s"),
    Row("malformed-first", "a chunk that is not JSON, before any output",
        (Fault.malformed(after=0),),
        attempts=(1, 1), elapsed=(0.0, 0.5), budget="final (malformed stream)",
        responses="failed:server_error", chat="error:upstream", chat_status=502,
        codec="error",
        falls_back=_ALL),
    Row("malformed-mid", "a chunk that is not JSON, after 1 chunk",
        (Fault.malformed(after=1), Fault.ok(TEXT)),
        attempts=(1, 1), elapsed=(0.0, 0.5), budget="none (output published)",
        partial="Hello", responses="failed:server_error", chat="error:upstream",
        codec="error"),
    Row("framing-first", "HTTP chunk framing broken (a size line that is not hex), before "
        "any output", (Fault.bad_framing(after=0), Fault.ok(TEXT)),
        attempts=(1, 1), elapsed=(0.0, 0.5), budget="final (malformed answer)",
        responses="failed:server_error", chat="error:upstream", chat_status=502,
        codec="error", message="malformed answer",
        falls_back=_ALL),
    Row("finish-abort", "`finish_reason: \"abort\"` (vLLM, SGLang) after the text",
        (Fault.ok(TEXT, finish_reason="abort"),),
        attempts=(1, 1), elapsed=(0.0, 0.5), budget="none (output published)",
        partial=TEXT, responses="failed:server_error", chat="error:upstream", codec="error",
        message="finish_reason 'abort'"),
    Row("finish-abort-first", "`finish_reason: \"abort\"` before any output, then OK",
        (Fault.ok("", finish_reason="abort"), Fault.ok(TEXT)),
        attempts=(2, 2), elapsed=(1.0, 1.5), budget="single retry after 1 s",
        gaps=((1.0, 1.3),), **_OK),
    Row("eof-no-terminal", "clean EOF without `finish_reason` / `[DONE]` (after output)",
        (Fault.no_terminal(TEXT),),
        attempts=(1, 1), elapsed=(0.0, 0.5), budget="none (output published)",
        partial=TEXT, responses="failed:server_error", chat="error:upstream", codec="error"),
    Row("eof-before-output", "clean EOF before any output, then OK",
        (Fault.no_terminal(TEXT, after=0), Fault.ok(TEXT)),
        attempts=(2, 2), elapsed=(1.0, 1.5), budget="single retry after 1 s",
        gaps=((1.0, 1.3),), **_OK),
    Row("overflow-vllm-0.9", "vLLM 0.9 overflow 400 (\"... (P in the messages, ...)\")",
        (_overflow(_VLLM_V09, type="BadRequestError", code=400),), **_OVERFLOW,
        falls_back=_ALL),
    Row("overflow-vllm-0.11", "vLLM 0.11 overflow 400 (\"your request has P input tokens\")",
        (_overflow(_VLLM_V011, type="BadRequestError", code=400),), **_OVERFLOW,
        falls_back=_ALL),
    Row("overflow-vllm-0.11-max", "vLLM 0.11 400 (\"'max_tokens' ... is too large\")",
        (_overflow(_VLLM_V011_MAX, type="BadRequestError", code=400),), **_OVERFLOW,
        falls_back=_ALL),
    Row("overflow-vllm-0.2x", "vLLM 0.2x 400 (\"prompt contains (at least) P ... "
        "(parameter=input_tokens)\")",
        (_overflow(_VLLM_V02X, type="BadRequestError", code=400),), **_OVERFLOW,
        falls_back=_ALL),
    Row("overflow-vllm-passed", "vLLM 400 (\"You passed P input tokens ... context length "
        "is only N\")",
        (_overflow(_VLLM_PASSED, type="BadRequestError", code=400),), **_OVERFLOW,
        falls_back=_ALL),
    Row("overflow-llama.cpp", "llama.cpp 400 `exceed_context_size_error`",
        (_overflow(_LLAMA_CPP, type="exceed_context_size_error", code=400,
                   extra={"n_prompt_tokens": 4900, "n_ctx": 4096}),), **_OVERFLOW,
        falls_back=_ALL),
    Row("overflow-openai", "OpenAI 400 `context_length_exceeded`",
        (_overflow(_OPENAI, type="invalid_request_error", code="context_length_exceeded"),),
        **_OVERFLOW,
        falls_back=_ALL),
    Row("overflow-vllm-stream", "vLLM overflow as a mid-stream `data: {\"error\": ...}` "
        "(integer `code` 400)",
        (Fault.stream_error({"message": _VLLM_V011, "type": "BadRequestError", "code": 400}),),
        attempts=(1, 1), elapsed=(0.0, 0.5), budget="final",
        responses="failed:context_length_exceeded", chat="error:context_length_exceeded",
        chat_status=400, codec="error",
        falls_back=_ALL),
    Row("stream-error-mid", "vLLM mid-stream error event (`code` 500) after 1 chunk",
        (Fault.stream_error({"message": "engine died", "type": "InternalServerError",
                             "code": 500}, after=1),),
        attempts=(1, 1), elapsed=(0.0, 0.5), budget="none (output published)",
        partial="Hello", responses="failed:server_error", chat="error:upstream",
        codec="error"),
    Row("content-filter-finish", "`finish_reason: content_filter`",
        (Fault.ok(TEXT, finish_reason="content_filter"),),
        attempts=(1, 1), elapsed=(0.0, 0.5), budget="none", partial=TEXT,
        responses="incomplete:content_filter", chat="finish:content_filter",
        codec="policy_violation"),
    Row("content-filter-400", "400 `content_filter`",
        (Fault.status(400, code="content_filter", type="invalid_request_error",
                       message="The response was filtered"),),
        attempts=(1, 1), elapsed=(0.0, 0.5), budget="final",
        responses="failed:content_filter", chat="error:content_filter", chat_status=400,
        codec="error"),
    Row("flapping-503", "flapping: 503 / OK alternating, 3 requests",
        (Fault.status(503), Fault.ok(TEXT)), cycle=True, requests=3,
        attempts=(2, 2), elapsed=(1.0, 1.5), budget="single retry per request",
        gaps=((1.0, 1.3),), **_OK),
    Row("flapping-reset", "flapping: reset / OK alternating, 3 requests",
        (Fault.reset(), Fault.ok(TEXT)), cycle=True, requests=3,
        attempts=(2, 2), elapsed=(0.8, 1.5), budget="connection 1 s (+-20%) per request",
        gaps=_backoff(1), **_OK),
    # -- about the fallback itself (issue 13): these run only with one ---------------------
    Row("fallback-rejects", "503 persistent; the fallback rejects the prompt (400)",
        (Fault.status(503),),
        attempts=(2, 2), elapsed=(1.0, 1.5), budget="single retry, then the fallback: 400",
        responses="failed:server_is_overloaded", chat="error:capacity", chat_status=503,
        codec="error", gaps=((1.0, 1.3),), fallback_only=True, fallback_attempts=(1, 1),
        fallback_script=(Fault.status(400, type="invalid_request_error", message=(
            "This model does not support assistant message prefill.")),)),
    Row("fallback-down", "503 persistent; the fallback resets every connection",
        (Fault.status(503),),
        attempts=(2, 2), elapsed=(1.0, 1.5), fallback_elapsed=(101.0, 121.5),
        budget="single retry, then the fallback's connection budget",
        responses="failed:server_is_overloaded", chat="error:capacity", chat_status=503,
        codec="error", gaps=((1.0, 1.3),), fallback_only=True,
        fallback_attempts=_BUDGET_ATTEMPTS, fallback_script=(Fault.reset(),)),
    Row("fallback-other-map", "503 persistent; the fallback has another tokenizer map",
        (Fault.status(503),),
        attempts=(2, 2), elapsed=(1.0, 1.5), budget="single retry, then the fallback "
        "(not for token ids of another map)",
        responses="failed:server_is_overloaded", chat="error:capacity", chat_status=503,
        codec="error", gaps=((1.0, 1.3),), fallback_only=True, falls_back=_TEXT_APIS,
        fallback_map="other", fallback_message="not tried as fallbacks"),
    # -- a Responses upstream (kind = "responses"): its own SSE shape, the same budgets ------
    Row("responses-ok", "Responses upstream: a whole answer", (Fault.ok(TEXT),),
        attempts=(1, 1), elapsed=(0.0, 0.5), budget="none", kind="responses", apis=_TEXT_APIS,
        **_OK),
    Row("responses-429", "Responses upstream: 429 `rate_limit_exceeded`, `Retry-After: 2`, "
        "then OK",
        (Fault.status(429, retry_after=2, code="rate_limit_exceeded"), Fault.ok(TEXT)),
        attempts=(2, 2), elapsed=(2.0, 2.5), budget="throttle (Retry-After)",
        gaps=((2.0, 2.3),), kind="responses", apis=_TEXT_APIS, **_OK),
    Row("responses-500-once", "Responses upstream: 500 once, then OK",
        (Fault.status(500), Fault.ok(TEXT)),
        attempts=(2, 2), elapsed=(1.0, 1.5), budget="single retry after 1 s",
        gaps=((1.0, 1.3),), kind="responses", apis=_TEXT_APIS, **_OK),
    Row("responses-cut", "Responses upstream: connection closed after 2 deltas",
        (Fault.cut(TEXT, after=2),),
        attempts=(1, 1), elapsed=(0.0, 0.5), budget="none (output published)",
        partial="Hello there,", responses="failed:server_error", chat="error:upstream",
        codec="error", kind="responses", apis=_TEXT_APIS),
    Row("responses-eof-before-output", "Responses upstream: EOF without "
        "`response.completed` before output, then OK",
        (Fault.no_terminal(TEXT, after=0), Fault.ok(TEXT)),
        attempts=(2, 2), elapsed=(1.0, 1.5), budget="single retry after 1 s",
        gaps=((1.0, 1.3),), kind="responses", apis=_TEXT_APIS, **_OK),
    Row("responses-eof-after-output", "Responses upstream: EOF without "
        "`response.completed` after the text",
        (Fault.no_terminal(TEXT),),
        attempts=(1, 1), elapsed=(0.0, 0.5), budget="none (output published)",
        partial=TEXT, responses="failed:server_error", chat="error:upstream", codec="error",
        kind="responses", apis=_TEXT_APIS),
    Row("responses-failed-overflow", "Responses upstream: `response.failed` "
        "`context_length_exceeded`",
        (Fault.stream_error({"code": "context_length_exceeded", "message":
                             "Your input exceeds the context window of this model."}),),
        attempts=(1, 1), elapsed=(0.0, 0.5), budget="final",
        responses="failed:context_length_exceeded", chat="error:context_length_exceeded",
        chat_status=400, codec="error", kind="responses", apis=_TEXT_APIS,
        falls_back=_TEXT_APIS),
)
