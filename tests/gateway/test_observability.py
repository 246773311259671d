"""Metrics and private request logs (issue 6 item 5), driven directly, on a simulated clock.

Metric values are read back from the app's own registry; log lines are captured from a
private logger carrying the production formatter, so each test sees exactly the lines the
gateway would write. The privacy rules get a hypothesis test: whatever strings reach the
identifier fields, a line is one bounded JSON object, and a secret passed anywhere else
never appears, in the log or in the scrape.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import logging
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tokenwire.gateway.ir import FailureClass
from tokenwire.gateway.observability import records as obs_mod
from tokenwire.gateway.observability.bounds import (
    API_BY_PATH,
    APIS,
    MAX_ID_CHARS,
    MAX_LABEL_CHARS,
    MAX_LABEL_VALUES,
    api_for_path,
    bounded_id,
    safe_code,
)
from tokenwire.gateway.observability.records import (
    DURATION_BUCKETS_S,
    LOGGER_NAME,
    MAX_NOTES,
    METRICS_CONTENT_TYPE,
    TOKEN_FLUSH_EVERY,
    Observability,
    RequestRecord,
)
from tokenwire.gateway.observability.request_log import JsonLineFormatter, configure_request_logging

_logger_ids = itertools.count()


@dataclass
class Harness:
    """One Observability with a settable clock and its captured log lines."""

    obs: Observability
    stream: io.StringIO
    now: float = 1000.0  # an arbitrary start: nothing may assume the clock starts at zero

    def clock(self) -> float:
        return self.now

    def lines(self) -> list[str]:
        return self.stream.getvalue().splitlines()

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.lines()]

    def value(self, name: str, **labels: str) -> float | None:
        return self.obs.registry.get_sample_value(name, labels)

    def request(self, **kw: object) -> RequestRecord:
        args: dict = {"api": "responses", "model": "m1", "upstream": "up1",
                      "request_id": "resp_1", "stream": True}
        args.update(kw)
        return self.obs.new_request(**args)


def _private_logger(stream: io.StringIO) -> logging.Logger:
    """A logger of its own per test (never the global one), with the production formatter."""
    logger = logging.getLogger(f"tests.observability.{next(_logger_ids)}")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLineFormatter())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


def _harness() -> Harness:
    stream = io.StringIO()
    h = Harness(obs=None, stream=stream)  # type: ignore[arg-type]
    h.obs = Observability(registry=CollectorRegistry(), logger=_private_logger(stream),
                          clock=h.clock)
    return h


@pytest.fixture(autouse=True)
def finished_closes(monkeypatch) -> None:
    """Most tests here read the record right after ``finished``: in the gateway the exchange
    ends (``close``) just after, so here ``finished`` closes at once. The deferral itself
    is tested in ``test_the_last_bytes_after_finished_still_count``."""
    finished = RequestRecord.finished

    def finished_and_closed(self, **kw) -> None:
        finished(self, **kw)
        self.close()

    monkeypatch.setattr(RequestRecord, "finished", finished_and_closed)


@pytest.fixture
def h() -> Harness:
    return _harness()


# -- a request's lifecycle -------------------------------------------------------------------


def test_completed_request_moves_every_metric_and_logs_one_line(h: Harness) -> None:
    r = h.request()
    h.now += 0.25
    r.admitted(0.25)
    r.attempt_started(1)
    r.retry_scheduled("throttle", 2.0, "rate_limited", "rate_limit_exceeded")
    r.retry_scheduled("connection", 1.0, "connection", None)
    r.attempt_started(2)
    r.heartbeat()
    h.now += 3.0
    r.first_output()
    for _ in range(5):
        r.tokens(1)
    r.tokens(3)
    r.wire_bytes("gzip", 120)
    r.wire_bytes("gzip", 30)
    r.usage(42, 8, "upstream")
    h.now += 1.75
    r.finished(outcome="completed", status=200)

    assert h.value("tokenwire_requests_total", api="responses", model="m1",
                   outcome="completed") == 1
    assert h.value("tokenwire_upstream_attempts_total", upstream="up1") == 2
    assert h.value("tokenwire_retries_total", upstream="up1", budget="throttle") == 1
    assert h.value("tokenwire_retries_total", upstream="up1", budget="connection") == 1
    assert h.value("tokenwire_retry_wait_seconds_total", budget="throttle") == 2.0
    assert h.value("tokenwire_heartbeats_total", api="responses") == 1
    assert h.value("tokenwire_completion_tokens_total", api="responses", model="m1") == 8
    assert h.value("tokenwire_prompt_tokens_total", model="m1") == 42
    assert h.value("tokenwire_wire_bytes_total", api="responses", encoding="gzip") == 150
    assert h.value("tokenwire_queue_wait_seconds_count") == 1
    assert h.value("tokenwire_queue_wait_seconds_sum") == 0.25
    assert h.value("tokenwire_time_to_first_token_seconds_sum", api="responses",
                   model="m1") == pytest.approx(3.25)
    assert h.value("tokenwire_time_to_first_token_seconds_bucket", api="responses",
                   model="m1", le="2.5") == 0
    assert h.value("tokenwire_time_to_first_token_seconds_bucket", api="responses",
                   model="m1", le="5.0") == 1
    assert h.value("tokenwire_request_duration_seconds_sum", api="responses",
                   outcome="completed") == pytest.approx(5.0)
    assert h.value("tokenwire_request_failures_total", api="responses", model="m1",
                   failure_class="rate_limited") is None

    [rec] = h.records()
    assert rec.pop("ts").endswith("Z")
    assert rec == {
        "event": "request_completed", "request_id": "resp_1", "api": "responses",
        "model": "m1", "upstream": "up1", "stream": True, "outcome": "completed",
        "status": 200, "elapsed_ms": 5000.0, "queue_wait_ms": 250.0, "ttft_ms": 3250.0,
        "attempts": 2, "retries": {"connection": 1, "single": 0, "throttle": 1},
        "retry_wait_ms": 3000.0, "heartbeats": 1, "completion_tokens": 8,
        "usage_prompt_tokens": 42, "usage_completion_tokens": 8, "usage_source": "upstream",
        "wire_bytes": 150,
        "encoding": "gzip", "retried_failure_class": "connection", "retried_code": None,
    }


def test_a_request_with_no_output_logs_nulls_not_zeros(h: Harness) -> None:
    h.request(stream=False).finished(outcome="completed", status=200)
    [rec] = h.records()
    assert rec["ttft_ms"] is None and rec["queue_wait_ms"] is None
    assert rec["usage_prompt_tokens"] is None and rec["encoding"] is None
    assert rec["stream"] is False
    assert "retried_failure_class" not in rec and "failure_class" not in rec


def test_usage_counts_once_and_only_what_streaming_did_not(h: Harness) -> None:
    # Non-streamed: only usage arrives; streamed: usage repeats cumulatively. Either way the
    # counter ends at max(streamed, reported) and prompt tokens count once.
    a = h.request()
    a.usage(10, 4)
    a.usage(10, 9)  # the last report wins
    a.finished(outcome="completed", status=200)
    b = h.request()
    b.tokens(12)
    b.usage(5, 7)  # fewer than streamed: nothing added
    b.finished(outcome="completed", status=200)
    assert h.value("tokenwire_completion_tokens_total", api="responses", model="m1") == 21
    assert h.value("tokenwire_prompt_tokens_total", model="m1") == 15


def test_streamed_tokens_reach_the_counter_in_small_batches(h: Harness) -> None:
    r = h.request()
    r.wire_bytes("identity", 100)  # the stream's head and first body went out

    def counted() -> float | None:
        return h.value("tokenwire_completion_tokens_total", api="responses", model="m1")

    for _ in range(TOKEN_FLUSH_EVERY - 1):
        r.tokens(1)
    assert counted() == 0  # batched: one locked increment per TOKEN_FLUSH_EVERY tokens
    r.tokens(1)
    assert counted() == TOKEN_FLUSH_EVERY
    r.tokens(2)
    r.heartbeat()  # a quiet stream's tokens show up within a heartbeat interval
    assert counted() == TOKEN_FLUSH_EVERY + 2
    r.tokens(1)
    r.finished(outcome="cancelled", status=499)
    assert counted() == TOKEN_FLUSH_EVERY + 3


def test_finished_is_idempotent_and_later_calls_are_ignored(h: Harness) -> None:
    r = h.request()
    r.finished(outcome="completed", status=200)
    r.finished(outcome="failed", status=502, failure_class="upstream", code="bad_gateway")
    r.tokens(5)
    r.heartbeat()
    r.attempt_started(2)
    r.first_output()
    assert r.done
    assert len(h.lines()) == 1
    assert h.value("tokenwire_requests_total", api="responses", model="m1",
                   outcome="completed") == 1
    assert h.value("tokenwire_requests_total", api="responses", model="m1",
                   outcome="failed") is None
    assert h.value("tokenwire_completion_tokens_total", api="responses", model="m1") == 0
    assert h.value("tokenwire_heartbeats_total", api="responses") == 0
    assert h.value("tokenwire_request_duration_seconds_count", api="responses",
                   outcome="completed") == 1


def test_first_output_and_admission_count_once(h: Harness) -> None:
    r = h.request()
    r.admitted(0.5)
    r.admitted(9.0)
    h.now += 1.0
    r.first_output()
    h.now += 1.0
    r.first_output()
    r.finished(outcome="completed", status=200)
    assert h.value("tokenwire_queue_wait_seconds_count") == 1
    assert h.value("tokenwire_time_to_first_token_seconds_count", api="responses",
                   model="m1") == 1
    assert h.records()[0]["ttft_ms"] == 1000.0


def test_failed_request_logs_class_and_code(h: Harness) -> None:
    r = h.request(api="chat_completions")
    r.finished(outcome="failed", status=400, failure_class=FailureClass.CONTEXT_LENGTH,
               code="context_length_exceeded")
    [rec] = h.records()
    assert rec["event"] == "request_failed"
    assert (rec["failure_class"], rec["code"], rec["status"]) == (
        "context_length_exceeded", "context_length_exceeded", 400)
    assert h.value("tokenwire_request_failures_total", api="chat_completions", model="m1",
                   failure_class="context_length_exceeded") == 1
    assert h.value("tokenwire_requests_total", api="chat_completions", model="m1",
                   outcome="failed") == 1


@pytest.mark.parametrize(("failure_class", "code", "logged_class", "logged_code"), [
    (None, None, "unspecified", None),
    ("no such class", "Bad Code!", "other", "other"),
    ("upstream", "x" * 65, "upstream", "other"),
    ("timeout", "exceed_context_size_error", "timeout", "exceed_context_size_error"),
])
def test_failure_fields_are_bounded(h: Harness, failure_class: str | None, code: str | None,
                                    logged_class: str, logged_code: str | None) -> None:
    h.request().finished(outcome="failed", status=502, failure_class=failure_class, code=code)
    rec = h.records()[0]
    assert (rec["failure_class"], rec["code"]) == (logged_class, logged_code)
    assert h.value("tokenwire_request_failures_total", api="responses", model="m1",
                   failure_class=logged_class) == 1


def test_cancelled_is_a_failed_record_but_not_a_failure_metric(h: Harness) -> None:
    h.request().finished(outcome="cancelled", status=499)
    [rec] = h.records()
    assert (rec["event"], rec["outcome"], rec["failure_class"], rec["code"]) == (
        "request_failed", "cancelled", "cancelled", "client_disconnected")
    assert h.value("tokenwire_requests_total", api="responses", model="m1",
                   outcome="cancelled") == 1
    assert h.value("tokenwire_request_failures_total", api="responses", model="m1",
                   failure_class="cancelled") is None


def test_an_unknown_outcome_is_never_reported_as_success(h: Harness) -> None:
    h.request().finished(outcome="succeeded-ish", status=200)
    assert h.records()[0]["event"] == "request_failed"
    assert h.value("tokenwire_requests_total", api="responses", model="m1",
                   outcome="failed") == 1


def test_closed_vocabularies_fold_unknown_values_into_other(h: Harness) -> None:
    r = h.request(api="graphql")
    r.wire_bytes("deflate", 10)
    r.retry_scheduled("forever", 1.0, "upstream", None)
    r.finished(outcome="completed", status=200)
    assert h.value("tokenwire_wire_bytes_total", api="other", encoding="other") == 10
    assert h.value("tokenwire_retries_total", upstream="up1", budget="other") == 1
    rec = h.records()[0]
    assert rec["api"] == "other" and rec["encoding"] == "other"
    assert rec["retries"] == {"connection": 0, "single": 0, "throttle": 0}


def test_notes_add_bounded_facts_to_the_log_line_only(h: Harness) -> None:
    r = h.request()
    r.note("turn_state_echoed", True)
    r.note("dropped_control_items", 2)
    r.note("translation_reason", "unsupported_compaction")
    r.note("free_text", "The user said: my password is hunter2")
    r.note("status", 999)  # a standard field is never replaced
    r.note("ts", "x")
    r.note("Bad-Key", 1)
    for i in range(2 * MAX_NOTES):
        r.note(f"extra_{i}", i)
    r.finished(outcome="failed", status=400, failure_class="invalid_request")
    rec = h.records()[0]
    assert rec["turn_state_echoed"] is True and rec["dropped_control_items"] == 2
    assert rec["translation_reason"] == "unsupported_compaction"
    assert rec["free_text"] == "other" and "hunter2" not in h.stream.getvalue()
    assert rec["status"] == 400 and rec["ts"].endswith("Z") and "Bad-Key" not in rec
    assert len([k for k in rec if k.startswith("extra_")]) == MAX_NOTES - 4
    # Every standard field is reserved, so a note never shadows one.
    r2 = h.request()
    r2.retry_scheduled("single", 1.0, "upstream", None)
    r2.finished(outcome="failed", status=502)
    assert set(h.records()[1]) <= obs_mod._RESERVED_NOTE_KEYS


# -- rejections and capacity -----------------------------------------------------------------


def test_rejections_count_and_log(h: Harness) -> None:
    h.obs.rejected(api="responses", status=429, reason="queue_full")
    h.obs.rejected(api="messages", status=401, reason="Bearer sk-LEAKED", request_id="r\n1")
    assert h.value("tokenwire_requests_rejected_total", api="responses",
                   reason="queue_full") == 1
    assert h.value("tokenwire_requests_rejected_total", api="messages", reason="other") == 1
    first, second = h.records()
    assert first["event"] == "request_rejected" and first["status"] == 429
    assert "request_id" not in first
    assert second["reason"] == "other" and second["request_id"] == "r?1"
    assert "LEAKED" not in h.stream.getvalue()


def test_middleware_rejections_name_the_api_from_the_path() -> None:
    assert api_for_path("/v1/chat/completions") == "chat_completions"
    assert api_for_path("/v1/completions/codec") == "codec"
    assert api_for_path("/v1/responses/resp_1") == "other"
    assert api_for_path(None) == "other"
    assert set(API_BY_PATH.values()) <= APIS


def test_capacity_gauges_are_read_at_scrape_time(h: Harness) -> None:
    assert h.value("tokenwire_requests_running") is None  # no source: absent, not 0
    state = {"running": 2, "queued": 7}
    h.obs.set_capacity_source(lambda: (state["running"], state["queued"]))
    assert (h.value("tokenwire_requests_running"), h.value("tokenwire_requests_queued")) == (
        2, 7)
    state["queued"] = 0
    assert h.value("tokenwire_requests_queued") == 0


def test_a_failing_capacity_source_never_breaks_the_scrape(h: Harness) -> None:
    def broken() -> tuple[int, int]:
        raise RuntimeError("secret detail")

    h.obs.set_capacity_source(broken)
    body, _ = h.obs.metrics_response_body()
    assert b"tokenwire_requests_running " not in body
    assert h.value("tokenwire_observability_errors_total") == 1


# -- the exposition --------------------------------------------------------------------------


def test_text_exposition_parses_and_names_every_metric() -> None:
    h = _harness()
    h.obs.set_capacity_source(lambda: (1, 0))
    r = h.request()
    r.admitted(0.0)
    r.attempt_started(1)
    r.retry_scheduled("single", 1.0, "upstream", "server_error")
    r.heartbeat()
    r.first_output()
    r.tokens(2)
    r.usage(3, 2)
    r.wire_bytes("br", 9)
    r.finished(outcome="failed", status=502, failure_class="upstream")
    h.obs.rejected(api="responses", status=413, reason="body_too_large")

    body, content_type = h.obs.metrics_response_body()
    assert content_type == METRICS_CONTENT_TYPE
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert {
        "tokenwire_requests", "tokenwire_request_failures", "tokenwire_requests_rejected",
        "tokenwire_upstream_attempts", "tokenwire_retries", "tokenwire_retry_wait_seconds",
        "tokenwire_heartbeats", "tokenwire_completion_tokens", "tokenwire_prompt_tokens",
        "tokenwire_wire_bytes", "tokenwire_time_to_first_token_seconds",
        "tokenwire_queue_wait_seconds", "tokenwire_request_duration_seconds",
        "tokenwire_requests_running", "tokenwire_requests_queued",
    } <= set(families)
    assert families["tokenwire_request_duration_seconds"].type == "histogram"
    assert not [n for n in families if n.endswith("_created")]  # dropped from the scrape
    buckets = [s.labels["le"] for s in families["tokenwire_queue_wait_seconds"].samples
               if s.name.endswith("_bucket")]
    assert [float(b) for b in buckets[:-1]] == list(DURATION_BUCKETS_S)
    assert buckets[-1] == "+Inf"
    # Request ids are never labels.
    assert b"resp_1" not in body


def test_default_registry_is_private_per_instance() -> None:
    a, b = Observability(), Observability()
    a.new_request(api="responses", model="m", upstream="u", request_id="r",
                  stream=False).finished(outcome="completed", status=200)
    labels = {"api": "responses", "model": "m", "outcome": "completed"}
    assert a.registry.get_sample_value("tokenwire_requests_total", labels) == 1
    assert b.registry.get_sample_value("tokenwire_requests_total", labels) is None


# -- cardinality -----------------------------------------------------------------------------


def test_model_labels_are_capped_in_length_and_count(h: Harness) -> None:
    for i in range(3 * MAX_LABEL_VALUES):
        h.request(model=f"client-invented-{i}").finished(outcome="completed", status=200)
    long_name = "m" * 500
    h.request(model=long_name, upstream="u" * 500).finished(outcome="completed", status=200)
    h.request(model="client-invented-0").finished(outcome="completed", status=200)

    models = {s.labels["model"] for m in h.obs.registry.collect()
              if m.name == "tokenwire_requests" for s in m.samples}
    assert len(models) == MAX_LABEL_VALUES + 1  # the first 64, and "other"
    assert "other" in models and "client-invented-0" in models
    assert h.value("tokenwire_requests_total", api="responses", model="client-invented-0",
                   outcome="completed") == 2  # an admitted value keeps its own series
    assert h.value("tokenwire_requests_total", api="responses", model="other",
                   outcome="completed") == 2 * MAX_LABEL_VALUES + 1
    # Logs keep the (bounded) real name even when the label folded into "other".
    last_but_one = h.records()[-2]
    assert last_but_one["model"] == "m" * MAX_ID_CHARS
    assert last_but_one["upstream"] == "u" * MAX_ID_CHARS


def test_long_label_values_are_cut(h: Harness) -> None:
    h.request(model="x" * 200, upstream="y\n" * 100).finished(outcome="completed", status=200)
    assert h.value("tokenwire_requests_total", api="responses", model="x" * MAX_LABEL_CHARS,
                   outcome="completed") == 1
    assert h.value("tokenwire_upstream_attempts_total", upstream="y?" * 32) is None
    r = h.request(upstream="y\n" * 100)
    r.attempt_started(1)
    r.finished(outcome="completed", status=200)
    assert h.value("tokenwire_upstream_attempts_total",
                   upstream="y?" * (MAX_LABEL_CHARS // 2)) == 1


# -- never raise -----------------------------------------------------------------------------


class _ExplodingLogger(logging.Logger):
    def log(self, *args: object, **kwargs: object) -> None:  # type: ignore[override]
        raise RuntimeError("sk-SECRET in a message")


def test_bad_inputs_and_internal_errors_never_raise() -> None:
    h = _harness()
    r = h.request(model=None, upstream=42, request_id=object())
    for bad in (None, "7", -5, math.nan, math.inf, -math.inf, 2**80, object()):
        r.admitted(bad)  # type: ignore[arg-type]
        r.attempt_started(bad)  # type: ignore[arg-type]
        r.retry_scheduled(bad, bad, bad, bad)  # type: ignore[arg-type]
        r.tokens(bad)  # type: ignore[arg-type]
        r.usage(bad, bad)  # type: ignore[arg-type]
        r.wire_bytes(bad, bad)  # type: ignore[arg-type]
    r.finished(outcome=None, status="200")  # type: ignore[arg-type]
    [rec] = h.records()  # still valid JSON: no NaN, no Infinity
    assert rec["model"] == "" and rec["status"] == 0
    # Huge values are clamped (2**80 bytes -> 2**53), never infinite or negative.
    assert math.isfinite(rec["retry_wait_ms"]) and rec["wire_bytes"] == 2**53
    assert rec["completion_tokens"] == 2**53 and rec["usage_prompt_tokens"] == 0

    def broken_clock() -> float:
        raise OSError("no clock")

    obs = Observability(registry=CollectorRegistry(), logger=_ExplodingLogger("boom"),
                        clock=broken_clock)
    rec2 = obs.new_request(api="responses", model="m", upstream="u", request_id="r",
                           stream=True)
    rec2.first_output()
    rec2.finished(outcome="failed", status=500)
    obs.rejected(api="responses", status=429, reason="queue_full")
    assert obs.registry.get_sample_value("tokenwire_observability_errors_total") >= 2


# -- log rendering and privacy ---------------------------------------------------------------


def test_identifiers_and_codes_are_bounded() -> None:
    assert bounded_id("a" * 300) == "a" * MAX_ID_CHARS
    assert bounded_id("é\r\nok\x00") == "???ok?"
    assert bounded_id(b"bytes") == "" and bounded_id(None) == ""
    assert safe_code("rate_limit_exceeded") == "rate_limit_exceeded"
    assert safe_code(FailureClass.QUOTA) == "quota"
    assert type(safe_code(FailureClass.QUOTA)) is str
    for bad in ("Rate limited, retry", "", "x" * 65, "a\nb", 5):
        assert safe_code(bad) == "other"
    assert safe_code(None) is None


def _record(msg: object, *args: object, exc: bool = False, **extra: object) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("sk-SECRET-in-exception")
        except ValueError as e:
            exc_info = (type(e), e, e.__traceback__)
    rec = logging.LogRecord("tokenwire.requests", logging.WARNING, __file__, 1, msg, args,
                            exc_info, sinfo="stack sk-SECRET-in-stack")
    rec.__dict__.update(extra)
    rec.created = datetime(2026, 11, 29, 6, 49, 0, 123456, tzinfo=UTC).timestamp()
    return rec


def test_formatter_renders_events_with_a_utc_timestamp() -> None:
    line = JsonLineFormatter().format(_record("x", event={"event": "request_completed",
                                                         "status": 200}))
    assert line == '{"ts":"2026-11-29T06:49:00.123Z","event":"request_completed","status":200}'


def test_formatter_never_writes_arguments_exceptions_or_stacks() -> None:
    line = JsonLineFormatter().format(_record("failed for %s", "sk-SECRET-in-arg", exc=True))
    assert json.loads(line) == {"ts": "2026-11-29T06:49:00.123Z", "event": "log",
                                "level": "WARNING", "logger": "tokenwire.requests",
                                "msg": "failed for %s"}
    assert "SECRET" not in line and "Traceback" not in line


def test_formatter_turns_unrenderable_or_huge_events_into_a_short_error_line() -> None:
    for event in ({"event": "x", "v": math.nan}, {"event": "x", "v": object()},
                  {"event": "x", "v": "a" * 10_000}):
        line = JsonLineFormatter().format(_record("x", event=event))
        assert json.loads(line)["event"] == "log_format_error"
        assert len(line) < 200


@pytest.fixture
def restore_request_logger() -> Iterator[logging.Logger]:
    logger = logging.getLogger(LOGGER_NAME)
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield logger
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


def test_configure_request_logging_replaces_its_handler(
    restore_request_logger: logging.Logger,
) -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_request_logging(first)
    configure_request_logging(second)
    obs = Observability(registry=CollectorRegistry())
    obs.new_request(api="codec", model="m", upstream="u", request_id="r",
                    stream=True).finished(outcome="completed", status=200)
    assert first.getvalue() == ""
    [line] = second.getvalue().splitlines()
    assert json.loads(line)["event"] == "request_completed"
    assert restore_request_logger.propagate is False


# -- the privacy property --------------------------------------------------------------------

# Looks like a credential: an API-key prefix and mixed-case base62, so it is never
# code-shaped. It is passed in every field that is not an identifier or a code.
_secret = st.builds(lambda body: f"sk-proj-{body}Q",
                    st.text(alphabet="ABCDEFGHJKabcdefgh0123456789", min_size=16, max_size=40))
_anything = st.text(max_size=400) | st.text(alphabet=st.characters(codec="ascii"),
                                            max_size=400)
_LINE_BOUND = 2048  # three 128-char identifiers, doubled by escaping, plus fixed fields


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=_anything, upstream=_anything, request_id=_anything, code=_anything,
       retry_code=_anything, secret=_secret,
       outcome=st.sampled_from(["completed", "failed", "cancelled"]))
def test_log_lines_are_bounded_json_and_never_carry_secrets(
    model: str, upstream: str, request_id: str, code: str, retry_code: str, secret: str,
    outcome: str,
) -> None:
    for value in (model, upstream, request_id, code, retry_code):
        assume(secret not in value)
    h = _harness()
    r = h.obs.new_request(api=secret, model=model, upstream=upstream, request_id=request_id,
                          stream=True)
    r.retry_scheduled(secret, 1.0, secret, retry_code)
    r.wire_bytes(secret, 10)
    r.note("detail", secret)
    r.tokens(3)
    r.finished(outcome=outcome, status=500, failure_class=secret, code=code)
    h.obs.rejected(api=secret, status=401, reason=secret, request_id=request_id)

    text = h.stream.getvalue()
    lines = text.split("\n")
    assert lines[-1] == "" and len(lines) == 3  # exactly two lines, each newline-terminated
    for line in lines[:-1]:
        assert len(line) <= _LINE_BOUND
        assert line.isascii() and line.isprintable()
        assert isinstance(json.loads(line), dict)
    rec = json.loads(lines[0])
    assert rec["model"] == bounded_id(model) and len(rec["model"]) <= MAX_ID_CHARS
    assert rec["request_id"] == bounded_id(request_id)
    if outcome != "completed":
        assert rec["code"] is None or re.fullmatch(r"[a-z0-9_.-]{1,64}", rec["code"])
    assert secret not in text
    assert secret.encode() not in h.obs.metrics_response_body()[0]


def test_the_suggested_metrics_route_serves_a_parsable_scrape() -> None:
    # The wiring the report suggests for app.py, exercised as written.
    obs = Observability(registry=CollectorRegistry())
    obs.set_capacity_source(lambda: (1, 2))

    async def metrics(request: Request) -> Response:
        body, content_type = obs.metrics_response_body()
        return Response(body, headers={"content-type": content_type,
                                       "cache-control": "no-store"})

    app = Starlette(routes=[Route("/metrics", metrics, methods=["GET"])])

    async def scrape() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.get("/metrics")

    resp = asyncio.run(scrape())
    assert resp.status_code == 200
    assert resp.headers["content-type"] == METRICS_CONTENT_TYPE
    families = {f.name: f for f in text_string_to_metric_families(resp.text)}
    assert families["tokenwire_requests_queued"].samples[0].value == 2


def test_the_last_bytes_after_finished_still_count(h: Harness, monkeypatch) -> None:
    """The supervisor knows the outcome before the writer sends the terminal (or a whole
    non-streamed body): bytes until ``close`` count, and the log line waits for it."""
    monkeypatch.undo()  # the real finished(): record only
    r = h.request(stream=False)
    r.finished(outcome="completed", status=200)
    assert h.lines() == []
    r.wire_bytes("gzip", 300)
    r.close()
    r.close()  # once
    (line,) = h.records()
    assert line["wire_bytes"] == 300 and line["outcome"] == "completed"
    silent = h.request()
    silent.close()  # never said how it ended: the client went away
    assert h.records()[-1]["outcome"] == "cancelled"


def _early_metrics(h: Harness, upstream: str = "up1") -> tuple[float, ...]:
    """Queue waits, attempts and first tokens counted so far (0: none, or no series yet)."""
    return (h.value("tokenwire_queue_wait_seconds_count") or 0,
            h.value("tokenwire_upstream_attempts_total", upstream=upstream) or 0,
            h.value("tokenwire_time_to_first_token_seconds_count", api="responses",
                    model="m1") or 0)


def test_what_precedes_the_first_write_is_posted_with_its_count(h: Harness) -> None:
    """Queue wait, attempts and time to first token are held until the first write's bytes
    are counted (they would delay the first token): none shows before, each once after."""
    r = h.request()
    r.admitted(0.25)
    r.attempt_started(1)
    h.now += 0.5
    r.first_output()
    r.tokens(1)
    assert _early_metrics(h) == (0, 0, 0)
    r.wire_bytes("identity", 120)
    assert _early_metrics(h) == (1, 1, 1)
    assert h.value("tokenwire_queue_wait_seconds_sum") == 0.25
    assert h.value("tokenwire_time_to_first_token_seconds_sum", api="responses",
                   model="m1") == 0.5
    r.wire_bytes("identity", 10)
    r.attempt_started(2)  # after the hold: counted at once
    assert _early_metrics(h) == (1, 2, 1)
    r.finished(outcome="completed", status=200)
    assert _early_metrics(h) == (1, 2, 1)
    assert h.records()[0]["queue_wait_ms"] == 250.0


def test_held_metrics_are_posted_by_a_request_that_never_wrote(h: Harness) -> None:
    r = h.request()
    r.admitted(0.0)
    r.attempt_started(1)
    assert _early_metrics(h) == (0, 0, 0)
    r.finished(outcome="cancelled", status=499)  # the client left before any byte
    assert _early_metrics(h) == (1, 1, 0)


def test_a_fallback_posts_the_attempts_held_for_the_routed_upstream(h: Harness) -> None:
    r = h.request()
    r.admitted(0.0)
    r.attempt_started(1)
    r.retry_scheduled("single", 0.1, FailureClass.UPSTREAM.value, "bad_gateway")
    assert _early_metrics(h)[1] == 1  # a retry is no fast path: what was held is posted
    r.attempt_started(2)
    r.fallback("m1", "m2", FailureClass.UPSTREAM.value, "up2")
    r.attempt_started(3)
    assert h.value("tokenwire_upstream_attempts_total", upstream="up1") == 2
    assert h.value("tokenwire_upstream_attempts_total", upstream="up2") == 1
