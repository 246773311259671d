"""Per-key limits on the served stack (http/limits.py): the 429 of each API as the real
``openai`` and ``anthropic`` SDKs read it, before any upstream work; tokens charged from
the real usage; slots given back when a client disconnects; the WebSocket transport; and
``/metrics`` by key name, never the key. One process, local counts (the shared ones are
tests/gateway/test_key_limits_shared.py). The limiter's clock is pinned (``Clock``): a
window never turns during a test, whatever the machine's speed."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx
import openai
import pytest
from websockets.sync.client import connect

from tokenwire.gateway.http.security import harden
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.ir import (
    Event,
    Finish,
    FinishKind,
    GenerationRequest,
    IdsSource,
    TokenDelta,
    Usage,
)
from tokenwire.gateway.routing.router import Router, ServedModel
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.state.api_keys import ApiKey, digest
from tokenwire.gateway.state.key_limiter import KeyLimiter
from tokenwire.gateway.state.limits import WINDOW_S, KeyLimits

from .conftest import Served, start_server

SECRET = "sk-limited-0123456789abcdef"
OTHER = "sk-unlimited-0123456789abcdef"
#: The start of a window (nothing in the previous one): counts are exact.
T0 = 1_000 * WINDOW_S
#: A safety net for a loaded machine, never the thing measured.
WAIT_S = 30.0
PROMPT_TOKENS, COMPLETION_TOKENS = 7, 3


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass(eq=False)
class UsageUpstream:
    """Answers "Hi" with a fixed usage; a prompt containing "hold" waits (a long stream
    whose client will leave) until the request is cancelled. Records what reached it."""

    model_id: str = "scripted"
    requests: list[GenerationRequest] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)

    def submit(self, request: GenerationRequest) -> _Play:
        self.requests.append(request)
        return _Play(self, request)


class _Play:
    def __init__(self, up: UsageUpstream, request: GenerationRequest) -> None:
        self._up, self._req = up, request
        self._events: list[Event] = [
            TokenDelta(text="Hi"), Usage(prompt_tokens=PROMPT_TOKENS,
                                         completion_tokens=COMPLETION_TOKENS),
            Finish(reason=FinishKind.EOS)]
        self._hold = "hold" in repr(request.prompt)

    async def next_event(self) -> Event:
        if self._hold and len(self._events) < 3:
            await asyncio.sleep(WAIT_S)  # cancelled when the client goes away
        return self._events.pop(0)

    def cancel(self) -> None:
        self._up.cancelled.append(self._req.request_id)


def named(name: str, secret: str, **limits: int) -> ApiKey:
    return ApiKey(name=name, sha256=digest(secret), limits=KeyLimits(**limits))


@pytest.fixture
def gateway() -> Iterator[Callable[..., Served]]:
    """``gateway(*keys, upstream=None, limiter=None) -> Served``: the hardened stack (key
    checks, then limits) over a scripted upstream; ``OTHER`` is an unnamed flat key."""
    started: list[Served] = []

    def start(*keys: ApiKey, upstream: Any = None, limiter: KeyLimiter | None = None,
              **kw: Any) -> Served:
        upstream = upstream or UsageUpstream()
        settings = ServerSettings(api_keys=(OTHER,), named_keys=keys, auth="keys", **kw)
        router = Router([ServedModel(name="scripted", upstream=upstream,
                                     ids_source=IdsSource.NONE, upstream_name="scripted")],
                        default="scripted")
        state = GatewayState(settings=settings, router=router,
                             limiter=limiter or KeyLimiter(clock=Clock()))
        served = start_server(state, harden(_app(state), settings))
        served.upstream = upstream  # type: ignore[attr-defined]
        started.append(served)
        return served

    yield start
    for s in started:
        s.stop()


def _app(state: GatewayState) -> Any:
    from tokenwire.gateway.http.app import create_app

    return create_app(state)


#: SDK clients made by a test, closed when it ends: one left open keeps a pooled socket until
#: the garbage collector finds it, and its ResourceWarning then fails a later test.
_CLIENTS: list = []


@pytest.fixture(autouse=True)
def _close_sdk_clients():
    yield
    while _CLIENTS:
        _CLIENTS.pop().close()


def oai(served: Served, key: str = SECRET, retries: int = 0) -> openai.OpenAI:
    client = openai.OpenAI(base_url=served.url + "/v1", api_key=key, max_retries=retries,
                           timeout=WAIT_S)
    _CLIENTS.append(client)
    return client


def chat(client: openai.OpenAI, text: str = "Hello") -> Any:
    return client.chat.completions.create(model="scripted",
                                          messages=[{"role": "user", "content": text}])


def metric(served: Served, name: str, **labels: str) -> float:
    text = httpx.get(served.url + "/metrics", headers={"Authorization": f"Bearer {OTHER}"},
                     timeout=WAIT_S).text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} ") or (not labels and line.startswith(name + " ")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# -- the 429 in each API's shape ---------------------------------------------------------------


def test_openai_sdk_gets_rate_limit_error_with_retry_after_before_any_upstream_work(
        gateway) -> None:
    served = gateway(named("ci-bot", SECRET, rpm=2))
    client = oai(served)
    chat(client), chat(client)
    with pytest.raises(openai.RateLimitError) as info:
        chat(client)
    err = info.value
    assert err.status_code == 429 and err.code == "rate_limit_exceeded"
    assert err.type == "requests"  # what OpenAI sends for its own RPM limit
    # 2 in this window, none before: room for one more when 2 x (1 - f) <= 1 in the next
    # window, i.e. 30 s into it: 60 + 30.
    headers = err.response.headers
    assert headers["retry-after"] == "90"
    assert "try again in 90s" in err.message and "'ci-bot'" in err.message
    assert SECRET not in err.message
    assert headers["x-ratelimit-limit-requests"] == "2"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert len(served.upstream.requests) == 2  # the refused one never reached it
    # another key is counted apart, and an unnamed flat key has no limits
    for _ in range(3):
        assert chat(oai(served, OTHER)).choices[0].message.content == "Hi"


def test_the_openai_sdk_retries_a_429_and_each_try_is_counted(gateway, monkeypatch) -> None:
    # The SDK's own wait is computed (from Retry-After) and recorded, not slept: sleeping
    # it took 240 s of the suite for nothing the test checks.
    waits: list[float] = []

    def record_wait(self, *, retries_taken, max_retries, options, response) -> None:
        waits.append(self._calculate_retry_timeout(
            max_retries - retries_taken, options, response.headers if response else None))

    monkeypatch.setattr(openai._base_client.SyncAPIClient, "_sleep_for_retry", record_wait)
    served = gateway(named("ci-bot", SECRET, rpm=1))
    chat(oai(served))
    with pytest.raises(openai.RateLimitError):
        chat(oai(served, retries=2))
    assert len(waits) == 2 and all(w > 0 for w in waits)
    assert metric(served, "tokenwire_key_rate_limited_total", key="ci-bot",
                  limit="requests") == 3


def test_responses_429_is_what_codex_retries(gateway) -> None:
    served = gateway(named("codex", SECRET, rpm=1))
    client = oai(served)
    client.responses.create(model="scripted", input="Hi")
    with pytest.raises(openai.RateLimitError) as info:
        client.responses.create(model="scripted", input="Hi")
    body = info.value.body
    assert isinstance(body, dict)
    # Codex gives up only on usage_limit_reached / usage_not_included; this code with
    # "try again in" is its retryable rate limit, paced by Retry-After.
    assert body["code"] == "rate_limit_exceeded" and "try again in 120s" in body["message"]
    assert info.value.response.headers["retry-after"] == "120"


def test_anthropic_sdk_gets_its_rate_limit_error(gateway) -> None:
    served = gateway(named("claude", SECRET, rpm=1))
    client = anthropic.Anthropic(base_url=served.url, api_key=SECRET, max_retries=0,
                                 timeout=WAIT_S)
    _CLIENTS.append(client)
    client.messages.create(model="scripted", max_tokens=8,
                           messages=[{"role": "user", "content": "Hi"}])
    with pytest.raises(anthropic.RateLimitError) as info:
        client.messages.create(model="scripted", max_tokens=8,
                               messages=[{"role": "user", "content": "Hi"}])
    assert info.value.status_code == 429
    assert info.value.body == {"type": "error", "error": {
        "type": "rate_limit_error", "message": info.value.body["error"]["message"]}}
    assert "try again in 120s" in info.value.body["error"]["message"]
    assert info.value.response.headers["retry-after"] == "120"


def test_codec_routes_are_refused_before_their_body_is_read(gateway) -> None:
    served = gateway(named("codec", SECRET, max_concurrent=1, rpm=1))
    auth = {"Authorization": f"Bearer {SECRET}"}
    assert httpx.post(served.url + "/v1/completions", headers=auth, timeout=WAIT_S,
                      json={"model": "scripted", "prompt": "Hi"}).status_code == 200
    resp = httpx.post(served.url + "/v1/completions/codec", timeout=WAIT_S,
                      headers={**auth, "content-type": "application/x-msgpack"},
                      content=b"\xc1 not even msgpack")
    assert resp.status_code == 429 and resp.headers["retry-after"] == "120"
    assert resp.json()["error"] == {"message": resp.json()["error"]["message"],
                                    "type": "requests", "param": None,
                                    "code": "rate_limit_exceeded"}


# -- tokens, concurrency, the WebSocket, metrics ---------------------------------------------


def test_tpm_is_charged_from_the_usage_the_request_reported(gateway) -> None:
    served = gateway(named("tok", SECRET, tpm=25))
    client = oai(served)
    for _ in range(3):  # 0, 10, 20 tokens used before each: room left
        usage = chat(client).usage
        assert (usage.prompt_tokens, usage.completion_tokens) == (PROMPT_TOKENS,
                                                                   COMPLETION_TOKENS)
    with pytest.raises(openai.RateLimitError) as info:
        chat(client)
    assert info.value.type == "tokens"
    assert info.value.response.headers["x-ratelimit-remaining-tokens"] == "0"
    assert metric(served, "tokenwire_key_tokens_total", key="tok") == 30


def test_a_completed_response_is_charged_before_its_last_body_message() -> None:
    """The order, not a race: a client may send its next request the moment it reads the
    end of this one, and the server may run it before this request's task unwinds (CI
    admitted a 4th request past its TPM that way). So the tokens must already be counted
    when the last body message is handed to the server."""
    from prometheus_client import CollectorRegistry

    from tokenwire.gateway.http.limits import LEASE_SCOPE_KEY, KeyLimitsMiddleware
    from tokenwire.gateway.observability.key_metrics import KeyMetrics
    from tokenwire.gateway.state.api_keys import KEY_SCOPE_KEY

    class Record:
        def charged_tokens(self) -> int:
            return 25

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        scope[LEASE_SCOPE_KEY].usage = Record()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{", "more_body": True})
        await send({"type": "http.response.body", "body": b"}"})

    key = named("tok", SECRET, tpm=25)
    limiter = KeyLimiter(clock=Clock())
    seen: list[tuple[str, bool | None]] = []

    async def send(message: dict[str, Any]) -> None:
        _, lease = await limiter.acquire(key)  # "the next request", at this moment
        seen.append((message["type"], lease is not None))
        if lease is not None:
            limiter.release(lease, 0)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    middleware = KeyLimitsMiddleware(app, limiter, KeyMetrics(CollectorRegistry()))
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             KEY_SCOPE_KEY: key}
    asyncio.run(middleware(scope, receive, send))
    assert seen == [("http.response.start", True), ("http.response.body", True),
                    ("http.response.body", False)]


def test_tpm_charges_the_embedded_engines_real_usage(engine, smollm2_map) -> None:
    """The real engine: the tokens charged are the SDK's own usage numbers."""
    from tokenwire.gateway.http.app import create_app

    settings = ServerSettings(named_keys=(named("real", SECRET, tpm=100_000),), auth="keys")
    state = GatewayState(settings=settings, upstream=engine, tmap=smollm2_map,
                         max_model_len=1024, limiter=KeyLimiter(clock=Clock()))
    served = start_server(state, harden(create_app(state), settings))
    try:
        reply = oai(served).chat.completions.create(
            model=engine.model_id, max_tokens=4, temperature=0,
            messages=[{"role": "user", "content": "Say hi"}])
        total = reply.usage.prompt_tokens + reply.usage.completion_tokens
        assert reply.usage.completion_tokens >= 1
        text = httpx.get(served.url + "/metrics", timeout=WAIT_S,
                         headers={"Authorization": f"Bearer {SECRET}"}).text
        assert f'tokenwire_key_tokens_total{{key="real"}} {float(total)}' in text
    finally:
        served.stop()


def test_a_client_that_disconnects_gives_its_slot_back(gateway) -> None:
    served = gateway(named("conc", SECRET, max_concurrent=1))
    auth = {"Authorization": f"Bearer {SECRET}"}
    body = {"model": "scripted", "stream": True,
            "messages": [{"role": "user", "content": "hold on"}]}
    with httpx.Client(timeout=WAIT_S) as client:
        with client.stream("POST", served.url + "/v1/chat/completions", json=body,
                           headers=auth) as resp:
            assert resp.status_code == 200
            chunks = resp.iter_raw()  # kept: a dropped iterator would close the response
            assert next(chunks)  # the stream runs, holding the one slot
            with pytest.raises(openai.RateLimitError) as info:
                chat(oai(served))
            assert info.value.response.headers["retry-after"] == "1"
        # the client left mid-stream
    deadline = time.monotonic() + WAIT_S
    while metric(served, "tokenwire_key_requests_in_flight", key="conc") != 0:
        assert time.monotonic() < deadline, "the slot was never given back"
        time.sleep(0.05)
    assert chat(oai(served)).choices[0].message.content == "Hi"
    assert served.upstream.cancelled  # and the upstream stream was stopped


def test_each_websocket_response_create_is_limited(gateway) -> None:
    served = gateway(named("ws", SECRET, rpm=1))
    create = json.dumps({"type": "response.create", "model": "scripted", "input": "Hi",
                         "store": False})
    with connect(served.url.replace("http", "ws", 1) + "/v1/responses", proxy=None,
                 open_timeout=WAIT_S,
                 additional_headers={"Authorization": f"Bearer {SECRET}"}) as ws:
        ws.send(create)
        while json.loads(ws.recv(WAIT_S))["type"] != "response.completed":
            pass
        ws.send(create)
        error = json.loads(ws.recv(WAIT_S))
    assert error["type"] == "error" and error["status"] == 429
    assert error["error"]["code"] == "rate_limit_exceeded"
    assert "try again in 120s" in error["error"]["message"]
    assert len(served.upstream.requests) == 1


def test_metrics_name_keys_never_show_them(gateway) -> None:
    served = gateway(named("ci-bot", SECRET, rpm=1))
    chat(oai(served))
    with pytest.raises(openai.RateLimitError):
        chat(oai(served))
    chat(oai(served, OTHER))
    text = httpx.get(served.url + "/metrics", timeout=WAIT_S,
                     headers={"Authorization": f"Bearer {OTHER}"}).text
    assert 'tokenwire_key_requests_total{key="ci-bot"} 1.0' in text
    assert 'tokenwire_key_requests_total{key="unnamed"} 1.0' in text
    assert 'tokenwire_key_rate_limited_total{key="ci-bot",limit="requests"} 1.0' in text
    assert 'tokenwire_key_tokens_total{key="ci-bot"} 10.0' in text
    for secret in (SECRET, OTHER):
        assert secret not in text and digest(secret).hex() not in text


def test_key_metrics_are_scraped_from_counts_per_key_name() -> None:
    """The per-request families are plain counts read at scrape time (a custom collector):
    the same samples prometheus_client's own families gave, in-flight back to 0 when a
    request ends, no tokens series before a key is charged, and a second family of the same
    name refused at registration as prometheus_client refuses it."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.registry import DuplicateTimeseries

    from tokenwire.gateway.observability.key_metrics import KeyMetrics

    registry = CollectorRegistry()
    metrics = KeyMetrics(registry)

    def samples() -> set[str]:
        return {line for line in generate_latest(registry).decode().splitlines()
                if line.startswith("tokenwire_key_")}

    assert samples() == {"tokenwire_key_limits_local_only 0.0"}
    metrics.admitted("ci-bot")
    metrics.admitted("ci-bot")
    metrics.admitted("unnamed")
    assert samples() >= {'tokenwire_key_requests_total{key="ci-bot"} 2.0',
                         'tokenwire_key_requests_in_flight{key="ci-bot"} 2.0',
                         'tokenwire_key_requests_in_flight{key="unnamed"} 1.0'}
    assert not any(s.startswith("tokenwire_key_tokens_total") for s in samples())
    metrics.ended("ci-bot", 30)
    metrics.ended("ci-bot", 0)
    metrics.ended("unnamed", 12)
    assert samples() == {'tokenwire_key_requests_total{key="ci-bot"} 2.0',
                         'tokenwire_key_requests_total{key="unnamed"} 1.0',
                         'tokenwire_key_tokens_total{key="ci-bot"} 30.0',
                         'tokenwire_key_tokens_total{key="unnamed"} 12.0',
                         'tokenwire_key_requests_in_flight{key="ci-bot"} 0.0',
                         'tokenwire_key_requests_in_flight{key="unnamed"} 0.0',
                         "tokenwire_key_limits_local_only 0.0"}
    with pytest.raises(DuplicateTimeseries):
        KeyMetrics(registry)
