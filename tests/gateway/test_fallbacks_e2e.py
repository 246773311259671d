"""A gateway that falls back, seen through the real ``openai`` and ``anthropic`` SDKs.

The primary model's scripted upstream answers 503 (persistent), so its single retry is spent
and the fallback model (another scripted upstream on a real loopback socket) serves the
request. Each API must return the fallback's own answer, name it in ``model`` and in
``Tokenwire-Served-Model``, and count it in the metrics and the request log. The scripted
upstreams inject the fault; the clients are the real SDKs (no mock stands in for a peer).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import anthropic
import openai
import pytest

from tokenwire.gateway.observability.records import LOGGER_NAME
from tokenwire.gateway.settings import ServerSettings

from .faults.harness import FALLBACK, FALLBACK_PROMPT_TOKENS, MODEL, environment, run_in_looptime
from .faults.runner import _maps
from .faults.scripted_upstream import Fault
from .faults.table import FALLBACK_TEXT

PRIMARY_DOWN = [Fault.status(503)]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "event", None)
        if isinstance(event, dict):
            self.events.append(event)


async def _logged(records: _Records, n: int) -> list[dict[str, Any]]:
    """The request log lines, written when each exchange ends (after the body)."""
    for _ in range(200):
        if len(records.events) >= n:
            return records.events
        await asyncio.sleep(0.01)
    return records.events


def _with_records(fn: Any) -> Any:
    logger = logging.getLogger(LOGGER_NAME)
    records = _Records()
    logger.addHandler(records)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        return run_in_looptime(lambda: fn(records))
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)


@pytest.mark.parametrize("stream", [False, True])
def test_openai_sdk_chat_completions_and_responses_get_the_fallback_answer(stream: bool):
    async def go(records: _Records) -> None:
        async with environment(PRIMARY_DOWN, fallback=[Fault.ok(FALLBACK_TEXT)],
                               maps=_maps("same")) as env:
            async with openai.AsyncOpenAI(base_url=env.url + "/v1", api_key="unused",
                                          max_retries=0) as client:
                chat = await client.chat.completions.with_raw_response.create(
                    model=MODEL, messages=[{"role": "user", "content": "Hi"}], stream=stream)
                if stream:
                    chunks = [c async for c in chat.parse()]
                    assert {c.model for c in chunks} == {FALLBACK}
                    assert "".join(c.choices[0].delta.content or "" for c in chunks
                                   if c.choices) == FALLBACK_TEXT
                else:
                    body = chat.parse()
                    assert (body.model, body.choices[0].message.content) == (FALLBACK,
                                                                             FALLBACK_TEXT)
                    assert body.usage is not None
                    assert body.usage.prompt_tokens == FALLBACK_PROMPT_TOKENS
                assert chat.headers["tokenwire-served-model"] == FALLBACK
                assert chat.headers["tokenwire-fallback"] == (
                    f"{MODEL};to={FALLBACK};reason=capacity")

                comp = await client.completions.create(model=MODEL, prompt="Hi", max_tokens=8)
                assert (comp.model, comp.choices[0].text) == (FALLBACK, FALLBACK_TEXT)

                if stream:
                    async with client.responses.stream(model=MODEL, input="Hi") as events:
                        final = await events.get_final_response()
                else:
                    final = await client.responses.create(model=MODEL, input="Hi")
                assert (final.model, final.output_text) == (FALLBACK, FALLBACK_TEXT)
                assert final.usage is not None
                assert final.usage.input_tokens == FALLBACK_PROMPT_TOKENS
                assert env.fallbacks_counted() == 3
                body, _ = env.gateway.state.observability.metrics_response_body()
                assert (f'tokenwire_fallbacks_total{{from_model="{MODEL}",reason="capacity",'
                        f'to_model="{FALLBACK}"}} 3.0').encode() in body
                logged = await _logged(records, 3)
                assert [(e["model"], e["served_model"], e["fallbacks"], e["fallback_reason"],
                         e["upstream"]) for e in logged] == [(MODEL, FALLBACK, 1, "capacity",
                                                              "fallback")] * 3
    _with_records(go)


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_sdk_messages_name_the_fallback_model(stream: bool) -> None:
    async def go(records: _Records) -> None:
        async with environment(PRIMARY_DOWN, fallback=[Fault.ok(FALLBACK_TEXT)],
                               maps=_maps("same")) as env:
            async with anthropic.AsyncAnthropic(base_url=env.url, api_key="unused",
                                                max_retries=0) as client:
                kw: dict[str, Any] = dict(model=MODEL, max_tokens=16,
                                          messages=[{"role": "user", "content": "Hi"}])
                if stream:
                    async with client.messages.stream(**kw) as events:
                        message = await events.get_final_message()
                else:
                    message = await client.messages.create(**kw)
                assert message.model == FALLBACK
                assert "".join(b.text for b in message.content if b.type == "text") == \
                    FALLBACK_TEXT
                assert message.usage.input_tokens == FALLBACK_PROMPT_TOKENS
                assert env.fallbacks_counted() == 1
    _with_records(go)


def test_a_prompt_the_primary_cannot_hold_goes_to_the_context_fallback() -> None:
    """A certain overflow (known window, counted with the model's map) is refused before
    any attempt; with a context fallback the longer model serves it instead of a 400."""
    async def go(records: _Records) -> None:
        async with environment([Fault.ok("never")], fallback=[Fault.ok(FALLBACK_TEXT)],
                               maps=_maps("same"), context_length=64) as env:
            assert env.fallback is not None
            # The longer model reads the whole prompt (a count below the certain one is a
            # truncation the gateway reports: gateway/context_window.py).
            env.fallback.prompt_tokens = 500
            async with openai.AsyncOpenAI(base_url=env.url + "/v1", api_key="unused",
                                          max_retries=0) as client:
                long = "the quick brown fox jumps over the lazy dog " * 40
                chat = await client.chat.completions.with_raw_response.create(
                    model=MODEL, messages=[{"role": "user", "content": long}])
                body = chat.parse()
                assert (body.model, body.choices[0].message.content) == (FALLBACK, FALLBACK_TEXT)
                assert chat.headers["tokenwire-fallback"] == (
                    f"{MODEL};to={FALLBACK};reason=context_length_exceeded")
                assert env.upstream.attempts == []  # the primary never saw it
                assert len(env.fallback.attempts) == 1
    _with_records(go)


def test_without_a_fallback_the_same_prompt_is_refused_as_before() -> None:
    async def go(records: _Records) -> None:
        async with environment([Fault.ok("never")], context_length=64) as env:
            async with openai.AsyncOpenAI(base_url=env.url + "/v1", api_key="unused",
                                          max_retries=0) as client:
                # Without a map nothing is certain: the primary's own 400 is what a client sees,
                # so send ids (counted exactly) through Completions.
                with pytest.raises(openai.BadRequestError) as info:
                    await client.completions.create(model=MODEL, prompt=list(range(100)),
                                                    max_tokens=8)
                assert info.value.code == "context_length_exceeded"
                assert "tokenwire-served-model" not in info.value.response.headers
                assert env.upstream.attempts == []
    _with_records(go)


def test_a_conversation_continued_by_previous_response_id_falls_back_whole() -> None:
    """The gateway keeps Responses conversations itself and replays them, so the state is
    portable: the fallback receives the earlier turns (its own answer included)."""
    async def go(records: _Records) -> None:
        async with environment(PRIMARY_DOWN, fallback=[Fault.ok(FALLBACK_TEXT)],
                               maps=_maps("same")) as env:
            async with openai.AsyncOpenAI(base_url=env.url + "/v1", api_key="unused",
                                          max_retries=0) as client:
                assert env.fallback is not None
                env.fallback.prompt_tokens = 100  # the replayed turns count (no truncation)
                first = await client.responses.create(model=MODEL, input="Hi")
                second = await client.responses.create(model=MODEL, input="And then?",
                                                       previous_response_id=first.id)
                assert (second.model, second.output_text) == (FALLBACK, FALLBACK_TEXT)
                body = env.fallback.attempts[-1].body
                said = [(m["role"], m["content"]) for m in body["messages"]]
                assert ("assistant", FALLBACK_TEXT) in said
                assert said[-1] == ("user", "And then?")
                assert ("user", "Hi") in said
    _with_records(go)


@pytest.mark.parametrize("stream", [False, True])
def test_a_responses_stream_names_the_fallback_from_response_created_on(stream: bool) -> None:
    """After a fallback before any output, ``response.created`` and every later event name
    the model that served, as the ``Tokenwire-Served-Model`` header does (the head waits
    for the first event when a fallback is configured). Before, ``response.created`` named
    the requested model and only the final events the fallback."""
    async def go(records: _Records) -> None:
        async with environment(PRIMARY_DOWN, fallback=[Fault.ok(FALLBACK_TEXT)],
                               maps=_maps("same")) as env:
            async with openai.AsyncOpenAI(base_url=env.url + "/v1", api_key="unused",
                                          max_retries=0) as client:
                raw = await client.responses.with_raw_response.create(
                    model=MODEL, input="Hi", stream=stream)
                assert raw.headers["tokenwire-served-model"] == FALLBACK
                if not stream:
                    body = raw.parse()
                    assert (body.model, body.output_text) == (FALLBACK, FALLBACK_TEXT)
                    return
                events = [e async for e in raw.parse()]
                assert events[0].type == "response.created"
                models = [e.response.model for e in events if getattr(e, "response", None)]
                assert len(models) >= 3 and set(models) == {FALLBACK}
                assert "".join(e.delta for e in events
                               if e.type == "response.output_text.delta") == FALLBACK_TEXT
                assert [e.sequence_number for e in events] == list(range(len(events)))
    _with_records(go)


#: A short heartbeat (injected): one fires while the primary's retry waits and while the
#: fallback's first token is slow, so the stream opens before the fallback answers.
_QUICK_HEARTBEAT = ServerSettings(heartbeat_s=0.5)
_SLOW_FALLBACK = [Fault.ok(FALLBACK_TEXT, delay_s=3.0)]


def test_a_messages_stream_opened_by_a_heartbeat_names_the_fallback_model() -> None:
    """A heartbeat before any output is a ``ping``, and ``message_start`` waits for the
    first real event: the model it names (which the ``anthropic`` SDK keeps, message_delta
    cannot change it) is the fallback that served. Before, the first heartbeat opened
    ``message_start`` with the requested model."""
    async def go(records: _Records) -> None:
        async with environment(PRIMARY_DOWN, fallback=_SLOW_FALLBACK, maps=_maps("same"),
                               settings=_QUICK_HEARTBEAT) as env:
            async with anthropic.AsyncAnthropic(base_url=env.url, api_key="unused",
                                                max_retries=0) as client:
                async with client.messages.stream(
                        model=MODEL, max_tokens=16,
                        messages=[{"role": "user", "content": "Hi"}]) as events:
                    message = await events.get_final_message()
                assert message.model == FALLBACK
                assert "".join(b.text for b in message.content if b.type == "text") == \
                    FALLBACK_TEXT
            logged = await _logged(records, 1)
            assert logged[0]["heartbeats"] >= 2 and logged[0]["served_model"] == FALLBACK
            # on the wire: pings first, then one message_start naming the fallback
            async with env.client.stream("POST", env.url + "/v1/messages", json={
                    "model": MODEL, "max_tokens": 16, "stream": True,
                    "messages": [{"role": "user", "content": "Hi"}]}) as resp:
                lines = [line async for line in resp.aiter_lines()]
            names = [line[7:] for line in lines if line.startswith("event: ")]
            start = names.index("message_start")
            assert start >= 2 and set(names[:start]) == {"ping"}
            assert names.count("message_start") == 1
            data = json.loads(lines[lines.index("event: message_start") + 1][6:])
            assert data["message"]["model"] == FALLBACK
    _with_records(go)


def test_a_responses_stream_opened_by_a_heartbeat_ends_naming_the_fallback_model() -> None:
    """A heartbeat opens a Responses stream (``response.created`` and an in-progress event:
    Codex's idle timer needs data events) before the fallback is known. Every event from
    the fallback on, ``response.completed`` included (the ``openai`` SDK's final response),
    names the model that served; the head's ``Tokenwire-Served-Model`` cannot (it went
    out first), which README "Fallbacks" says."""
    async def go(records: _Records) -> None:
        async with environment(PRIMARY_DOWN, fallback=_SLOW_FALLBACK, maps=_maps("same"),
                               settings=_QUICK_HEARTBEAT) as env:
            async with openai.AsyncOpenAI(base_url=env.url + "/v1", api_key="unused",
                                          max_retries=0) as client:
                async with client.responses.stream(model=MODEL, input="Hi") as stream:
                    events = [e async for e in stream]
                    final = await stream.get_final_response()
            assert (final.model, final.output_text) == (FALLBACK, FALLBACK_TEXT)
            models = [e.response.model for e in events if getattr(e, "response", None)]
            assert models[0] == MODEL  # opened by a heartbeat, before the fallback
            assert models[-1] == FALLBACK and events[-1].type == "response.completed"
            first_text = next(i for i, e in enumerate(events)
                              if e.type == "response.output_text.delta")
            assert {getattr(e, "response", None) and e.response.model
                    for e in events[first_text:]} <= {None, FALLBACK}
            logged = await _logged(records, 1)
            assert logged[0]["heartbeats"] >= 2 and logged[0]["served_model"] == FALLBACK
            stored = await env.client.get(f"{env.url}/v1/responses/{final.id}")
            assert stored.json()["model"] == FALLBACK
    _with_records(go)
