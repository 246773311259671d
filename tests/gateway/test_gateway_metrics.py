"""Metrics and the request log through the real app: what a request leaves behind.

The record lifecycle itself is tested in test_observability.py; here one request of each
kind goes through uvicorn, the supervisor and the response writer, and ``/metrics`` must
show it (outcome, tokens, wire bytes per encoding, time to first token), and ``/health``
the capacity counts and the feature list.
"""

from __future__ import annotations

import logging

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tokenwire.gateway.ir import Failure, FailureClass, Finish, FinishKind, TokenDelta

from .conftest import ScriptedUpstream

SCRIPT = [(0.0, TokenDelta(ids=(10,), text="a")), (0.0, TokenDelta(ids=(11,), text="b")),
          (0.0, Finish(reason=FinishKind.EOS))]


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _value(samples, name: str, **labels: str) -> float:
    return sum(v for (n, lab), v in samples.items()
               if n == name and all(dict(lab).get(k) == want for k, want in labels.items()))


def test_a_streamed_request_is_counted_with_its_tokens_bytes_and_first_token(serve) -> None:
    up = serve(ScriptedUpstream(SCRIPT))
    r = httpx.post(up.url + "/v1/chat/completions", timeout=10, headers={
        "accept-encoding": "gzip"}, json={"messages": [{"role": "user", "content": "x"}],
                                          "stream": True})
    assert r.status_code == 200
    r = httpx.post(up.url + "/v1/completions", json={"prompt": "x", "stream_format": "msgpack"},
                   timeout=10)
    assert r.status_code == 200
    s = _samples(up.url)
    assert _value(s, "tokenwire_requests_total", api="chat_completions",
                  outcome="completed") == 1
    assert _value(s, "tokenwire_requests_total", api="codec", outcome="completed") == 1
    assert _value(s, "tokenwire_completion_tokens_total", api="codec") == 2
    # (a generic client's event stream goes uncompressed: http/generation.py _UNCOMPRESSED)
    assert _value(s, "tokenwire_wire_bytes_total", api="chat_completions",
                  encoding="identity") > 0
    assert _value(s, "tokenwire_wire_bytes_total", api="codec") > 0  # httpx offers br, gzip
    assert _value(s, "tokenwire_time_to_first_token_seconds_count", api="codec") == 1
    assert _value(s, "tokenwire_upstream_attempts_total") == 2


def test_a_failure_is_counted_by_class_and_logged_without_its_message(serve, caplog) -> None:
    secret = "private upstream prose sk-live-123"
    up = serve(ScriptedUpstream([(0.0, Failure(failure_class=FailureClass.CONTEXT_LENGTH,
                                                message=secret, status=400))]))
    with caplog.at_level(logging.INFO, logger="tokenwire.requests"):
        r = httpx.post(up.url + "/v1/completions", json={"prompt": "x"}, timeout=10)
    assert r.status_code == 400
    s = _samples(up.url)
    assert _value(s, "tokenwire_request_failures_total",
                  failure_class="context_length_exceeded") == 1
    records = [rec for rec in caplog.records if rec.name == "tokenwire.requests"]
    assert records and all(secret not in rec.getMessage() for rec in records)
    assert all(secret not in str(rec.__dict__) for rec in records)


def test_health_shows_capacity_and_features(serve) -> None:
    up = serve(ScriptedUpstream(SCRIPT), max_concurrent=3, queue_size=5)
    body = httpx.get(up.url + "/health", timeout=10).json()
    assert body["running"] == 0 and body["queued"] == 0
    assert {"responses-ws-426", "openai-internal-strip"} <= set(body["features"])


def test_requests_refused_before_the_upstream_are_counted_by_reason(serve) -> None:
    up = serve(ScriptedUpstream(SCRIPT), max_body_bytes=100)
    assert httpx.post(up.url + "/v1/completions", content=b"{nope", timeout=10).status_code \
        == 400
    assert httpx.post(up.url + "/v1/chat/completions", json={"messages": "x" * 200},
                      timeout=10).status_code == 413
    s = _samples(up.url)
    assert _value(s, "tokenwire_requests_rejected_total", api="completions",
                  reason="invalid_request") == 1
    assert _value(s, "tokenwire_requests_rejected_total", api="chat_completions",
                  reason="body_too_large") == 1
    assert _value(s, "tokenwire_requests_total") == 0


def test_a_whole_body_sent_after_the_terminal_is_counted(serve) -> None:
    up = serve(ScriptedUpstream(SCRIPT))
    r = httpx.post(up.url + "/v1/completions", json={"prompt": "x"}, timeout=10,
                   headers={"accept-encoding": "identity"})
    assert r.status_code == 200
    s = _samples(up.url)
    assert _value(s, "tokenwire_wire_bytes_total", api="completions",
                  encoding="identity") == len(r.content)
