"""The one failure classification every HTTP upstream adapter uses (``upstreams/failures``)."""

from __future__ import annotations

import asyncio
import email.utils
import json
import socket
import ssl

import httpx
import pytest

from tokenwire.gateway.ir import FailureClass
from tokenwire.gateway.upstreams.failures import (
    MALFORMED,
    MAX_RETRY_AFTER_S,
    classify_error,
    context_overflow_counts,
    error_object,
    failure_from_exception,
    failure_from_response,
    read_capped,
    retry_after_seconds,
)
from tokenwire.gateway.upstreams.http_heads import MalformedAnswer


def test_retry_after_is_read_as_seconds_as_an_http_date_and_as_milliseconds() -> None:
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert retry_after_seconds({"retry-after": "7"}) == 7.0
    assert retry_after_seconds({"retry-after": date}, now=now) == pytest.approx(30.0)
    assert retry_after_seconds({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({}) is None


@pytest.mark.parametrize(("value", "seconds"), [
    ("inf", MAX_RETRY_AFTER_S), ("1e400", MAX_RETRY_AFTER_S), ("99999999999", MAX_RETRY_AFTER_S),
    ("Fri, 31 Dec 9999 23:59:59 GMT", MAX_RETRY_AFTER_S), ("nan", 0.0), ("-5", 0.0),
    ("-inf", None)])
def test_an_absurd_retry_after_is_read_as_at_most_a_day(value: str, seconds: float | None,
                                                        ) -> None:
    """``inf`` used to reach the client's ``Retry-After`` as ``round(inf)``: a 500."""
    assert retry_after_seconds({"retry-after": value}) == seconds


def test_an_absurd_retry_after_ms_is_read_as_at_most_a_day() -> None:
    for value in ("inf", "1e400", "1e15"):
        assert retry_after_seconds({"retry-after-ms": value}) == MAX_RETRY_AFTER_S


def test_anthropic_error_shape_is_classified_by_its_type() -> None:
    body = json.dumps({"type": "error", "error": {"type": "overloaded_error",
                                                  "message": "Overloaded"}}).encode()
    f = failure_from_response(529, {}, body)
    assert (f.failure_class, f.status, f.code, f.message) == (
        FailureClass.CAPACITY, 503, "overloaded_error", "Overloaded")


def test_generic_type_does_not_override_the_status() -> None:
    # OpenAI answers a bad key with 401 and type invalid_request_error.
    f = failure_from_response(401, {}, b'{"error": {"message": "bad key", '
                                       b'"type": "invalid_request_error"}}')
    assert (f.failure_class, f.status) == (FailureClass.AUTHENTICATION, 502)


def test_vllm_integer_code_mid_stream_is_the_http_status() -> None:
    f = classify_error({"message": "CUDA out of memory", "type": "InternalServerError",
                        "code": 500}, status=None)
    assert f.failure_class is FailureClass.UPSTREAM
    overflow = classify_error({"message": "This model's maximum context length is 2048 "
                                          "tokens. However, you requested 3000 tokens.",
                               "code": 400}, status=None)
    assert (overflow.failure_class, overflow.context_tokens) == (
        FailureClass.CONTEXT_LENGTH, 2048)


@pytest.mark.parametrize(("message", "counts"), [
    ("prompt is too long: 208310 tokens > 200000 maximum", (208310, 200000)),
    ("input length and `max_tokens` exceed context limit: 197000 + 8192 > 200000",
     (197000, 200000)),
    ("This model's maximum context length is 8192 tokens. However, your messages resulted "
     "in 9000 tokens.", (9000, 8192)),
    ("request (9000 tokens) exceeds the available context size (4096 tokens)", (9000, 4096)),
    ("the context window was exceeded", (None, None)),
    ("messages: field required", None),
])
def test_context_overflow_wordings_yield_their_counts(message, counts) -> None:
    assert context_overflow_counts(message) == counts


def test_overflow_wording_does_not_turn_a_rate_limit_into_context_length() -> None:
    f = failure_from_response(429, {"retry-after": "3"}, b'{"error": {"message": '
                                                         b'"too many tokens per minute"}}')
    assert (f.failure_class, f.retry_after) == (FailureClass.RATE_LIMITED, 3.0)


def test_fastapi_detail_and_plain_text_bodies_become_the_message() -> None:
    assert error_object(b'{"detail": "boom"}')["message"] == "boom"
    assert error_object(b"<html>Bad Gateway</html>")["message"] == "<html>Bad Gateway</html>"
    assert failure_from_response(502, {}, b"").message == "upstream answered HTTP 502"


@pytest.mark.parametrize(("exc", "started", "cls"), [
    (httpx.ConnectError("refused"), False, FailureClass.CONNECTION),
    (httpx.ConnectTimeout("slow"), False, FailureClass.CONNECTION),
    (httpx.ReadTimeout("slow"), True, FailureClass.TIMEOUT),
    (httpx.ReadError("reset"), False, FailureClass.CONNECTION),
    (httpx.ReadError("reset"), True, FailureClass.UPSTREAM),
])
def test_transport_errors_are_connection_before_output_and_upstream_after(
        exc, started, cls) -> None:
    assert failure_from_exception(exc, started=started).failure_class is cls


def _chained(outer: Exception, cause: BaseException) -> Exception:
    outer.__cause__ = cause
    return outer


@pytest.mark.parametrize(("cause", "code"), [
    (ConnectionRefusedError(111, "refused"), "connection_refused"),
    (ConnectionResetError(104, "reset"), "connection_reset"),
    (socket.gaierror(socket.EAI_AGAIN, "try again"), "dns_temporary"),
    (socket.gaierror(socket.EAI_NONAME, "no such host"), "dns_permanent"),
    (ssl.SSLCertVerificationError("certificate verify failed"), "certificate_error"),
    (OSError("something else"), "unknown_network_fault"),
])
def test_connect_failures_name_their_fault_for_the_retry_budget(cause, code) -> None:
    """Seed, retry budgets: resets and temporary DNS failures are transient; certificate
    failures, permanent DNS failures, refused connections and unknown faults are final. The
    adapter names which, from the exception chain httpx keeps."""
    exc = _chained(httpx.ConnectError("could not connect"), cause)
    failure = failure_from_exception(exc, started=False)
    assert failure.failure_class is FailureClass.CONNECTION and failure.code == code


def test_a_real_refused_connection_is_named_refused() -> None:
    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        try:
            httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
        except httpx.ConnectError as exc:
            assert failure_from_exception(exc, started=False).code == "connection_refused"
        else:  # pragma: no cover
            raise AssertionError("the connection should have been refused")


@pytest.mark.parametrize(("cause", "budget"), [
    (ConnectionResetError(104, "reset"), "CONNECTION"),
    (socket.gaierror(socket.EAI_AGAIN, "try again"), "CONNECTION"),
    (ConnectionRefusedError(111, "refused"), "FINAL"),
    (ssl.SSLCertVerificationError("certificate verify failed"), "FINAL"),
])
def test_the_retry_budget_reads_the_named_fault(cause, budget) -> None:
    from tokenwire.gateway.supervision.retry import Budget, budget_for

    failure = failure_from_exception(_chained(httpx.ConnectError("x"), cause), started=False)
    assert budget_for(failure) is Budget[budget]


def test_an_overflow_keeps_only_the_counts_never_the_upstreams_prose() -> None:
    """Seed: context overflow "keeping only the token counts": upstream prose can quote
    the prompt, so it never reaches the client."""
    prose = ("This model's maximum context length is 4096 tokens. However, you requested 5000 "
             "tokens (4900 in the messages, 100 in the completion). Prompt began: 'my secret'")
    f = classify_error({"message": prose}, status=400)
    assert f.failure_class is FailureClass.CONTEXT_LENGTH
    assert (f.prompt_tokens, f.context_tokens) == (4900, 4096)
    assert "secret" not in f.message and "4900" in f.message and "4096" in f.message
    bare = classify_error({"message": "context length exceeded: quote 'my secret'"}, status=400)
    assert bare.failure_class is FailureClass.CONTEXT_LENGTH and "secret" not in bare.message


def test_broken_framing_and_an_undecodable_body_are_final_malformed_answers() -> None:
    """They were read as a connection lost before the answer and retried for 120 s: the
    same bytes come back every time."""
    for exc in (MalformedAnswer("bad chunk-size line"), httpx.DecodingError("bad gzip")):
        failure = failure_from_exception(exc, started=False)
        assert (failure.failure_class, failure.status, failure.code) == (
            FailureClass.UPSTREAM, 502, MALFORMED)
    lost = failure_from_exception(httpx.RemoteProtocolError(
        "Server disconnected without sending a response."), started=False)
    assert (lost.failure_class, lost.code) == (FailureClass.CONNECTION, "connection_reset")


def test_read_capped_keeps_what_came_before_the_body_broke() -> None:
    import zlib

    class Broken(httpx.AsyncByteStream):
        def __init__(self, *parts: bytes) -> None:
            self.parts = parts

        async def __aiter__(self):
            for part in self.parts:
                yield part
            raise httpx.ReadError("cut")

    gzip = zlib.compressobj(wbits=31)
    coded = gzip.compress(b"partial ") + gzip.flush(zlib.Z_SYNC_FLUSH)
    for headers, parts in [({}, [b"partial "]), ({"content-encoding": "gzip"}, [coded]),
                           ({"content-encoding": "gzip"}, [coded, b"\xff not gzip"])]:
        resp = httpx.Response(200, headers=headers, stream=Broken(*parts))
        assert asyncio.run(read_capped(resp)) == b"partial "
        with pytest.raises(httpx.HTTPError):  # a listing cut short is no listing
            asyncio.run(read_capped(httpx.Response(200, headers=headers,
                                                   stream=Broken(*parts)), partial=False))
