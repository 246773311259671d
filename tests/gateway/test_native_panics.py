"""No exception type from a native library takes a route down (issue 11 item 3).

pyo3's ``PanicException`` (what tiktoken raises when its Rust regex overflows the stack on
~1 MiB of spaces) is a ``BaseException``, so ``except Exception`` barriers let it through:
``/tokenize`` answered a plain-text 500 with a traceback in the log, and a retokenized
upstream stream became a retried 502. Every test here raises a *real* ``PanicException``:
the class is taken from a real panic of a tiny tiktoken encoding (or from ``pyo3_runtime``
once some pyo3 module has created it).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

import httpx
import msgspec
import pytest
import tiktoken

from tokenwire.gateway.http import tokenize_routes
from tokenwire.gateway.http.security import CrashBarrier
from tokenwire.gateway.ir import (
    Failure,
    FailureClass,
    Finish,
    FinishKind,
    GenerationRequest,
    PromptText,
    TokenDelta,
)
from tokenwire.gateway.retokenize import (
    RETOKENIZE_FAILED,
    Retokenizer,
    RetokenizingStream,
    UntokenizableText,
    encode_text,
)
from tokenwire.gateway.upstreams.base import ModelRoute, UpstreamConfig


def _panic_class() -> type[BaseException]:
    runtime = sys.modules.get("pyo3_runtime")
    if runtime is not None:
        return runtime.PanicException
    enc = tiktoken.Encoding(name="panic-probe", pat_str=r"\s+(?!\S)|\s+",
                            mergeable_ranks={bytes([i]): i for i in range(256)},
                            special_tokens={})
    try:
        enc.encode_ordinary(" " * (1 << 20))  # tiktoken 0.14: a Rust stack overflow
    except BaseException as exc:  # the panic we are after
        if type(exc).__name__ == "PanicException":
            return type(exc)
        raise
    runtime = sys.modules.get("pyo3_runtime")
    if runtime is None:
        pytest.skip("no pyo3 PanicException could be obtained on this machine")
    return runtime.PanicException


PanicException = _panic_class()


class PanickingTokenizer:
    """Raises a real PanicException, as tiktoken does on a long run of spaces."""

    calls = 0

    def encode(self, text: str, **kw: Any) -> list[int]:
        raise PanicException("called `Result::unwrap()` on an `Err` value: StackOverflow")


def test_the_panic_is_a_base_exception_not_an_exception() -> None:
    assert issubclass(PanicException, BaseException)
    assert not issubclass(PanicException, Exception)


def test_encode_text_turns_a_panic_into_a_typed_400_naming_the_field() -> None:
    with pytest.raises(UntokenizableText) as info:
        encode_text(PanickingTokenizer(), "x", param="prompt")  # type: ignore[arg-type]
    assert info.value.status_hint == 400 and info.value.param == "prompt"
    assert "PanicException" in str(info.value) and "StackOverflow" not in str(info.value)


def test_encode_text_lets_an_interrupt_through() -> None:
    class Interrupted:
        def encode(self, text: str) -> list[int]:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        encode_text(Interrupted(), "x")  # type: ignore[arg-type]


# -- /tokenize on a real server --------------------------------------------------------------


def test_tokenize_answers_a_json_400_and_logs_no_traceback(serve, monkeypatch, caplog,
                                                           smollm2_map) -> None:
    from .conftest import ScriptedUpstream

    served = serve(ScriptedUpstream([(0.0, Finish(reason=FinishKind.EOS))]))
    monkeypatch.setattr(tokenize_routes, "_tokenizer", lambda tmap: PanickingTokenizer())
    caplog.set_level(logging.DEBUG)
    resp = httpx.post(served.url + "/tokenize", json={"prompt": " " * 100}, timeout=30)
    assert resp.status_code == 400, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    err = resp.json()["error"]
    assert "cannot be tokenized" in err["message"] and err["type"] == "invalid_request_error"
    assert "Traceback" not in caplog.text
    monkeypatch.undo()
    ok = httpx.post(served.url + "/tokenize", json={"prompt": "hi"}, timeout=30)
    assert ok.status_code == 200  # still serving


# -- the crash barrier -----------------------------------------------------------------------


def _barrier(path: str) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def app(scope, receive, send) -> None:
        raise PanicException("secret detail")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    asyncio.run(CrashBarrier(app)({"type": "http", "path": path, "headers": []}, receive, send))
    return sent


def test_the_barrier_answers_a_panic_with_a_json_500_in_the_apis_shape(caplog) -> None:
    caplog.set_level(logging.DEBUG)
    openai_shape = msgspec.json.decode(_barrier("/v1/chat/completions")[1]["body"])
    assert openai_shape["error"]["type"] == "server_error"
    sent = _barrier("/v1/messages")
    assert sent[0]["status"] == 500
    anthropic = msgspec.json.decode(sent[1]["body"])
    assert anthropic["type"] == "error" and anthropic["error"]["type"] == "api_error"
    assert "PanicException" in caplog.text and "secret detail" not in caplog.text


# -- a retokenized upstream stream -----------------------------------------------------------


class _TextStream:
    def __init__(self) -> None:
        self.events = [TokenDelta(text="hello"), Finish(reason=FinishKind.EOS)]
        self.cancelled = False

    async def next_event(self):
        return self.events.pop(0)

    def cancel(self) -> None:
        self.cancelled = True


def test_a_retokenized_stream_ends_with_our_500_never_a_retryable_502(smollm2_map) -> None:
    inner = _TextStream()
    stream = RetokenizingStream(inner, Retokenizer(smollm2_map,
                                                   tokenizer=PanickingTokenizer()))  # type: ignore[arg-type]

    async def drain() -> list:
        out = [await stream.next_event()]
        while not isinstance(out[-1], Failure | Finish):
            out.append(await stream.next_event())
        return out

    events = asyncio.run(drain())
    failure = events[-1]
    assert isinstance(failure, Failure)
    assert failure.failure_class is FailureClass.INTERNAL  # never retried
    assert failure.status == 500 and failure.code == RETOKENIZE_FAILED
    assert inner.cancelled


def test_the_openai_adapter_fails_the_stream_and_its_prompt_bound_is_just_absent(
        smollm2_map, monkeypatch) -> None:
    from tokenwire.gateway import context_window
    from tokenwire.gateway.upstreams import openai_compat

    up = openai_compat.OpenAICompatUpstream.from_config(
        UpstreamConfig(name="u", kind="openai", base_url="http://127.0.0.1:9/v1",
                                     models=(ModelRoute(name="m"),)),
        maps={"m": smollm2_map})
    monkeypatch.setattr(context_window, "tokenizer_for", lambda tmap: PanickingTokenizer())
    req = GenerationRequest(prompt=PromptText(text=" " * 10), model="m", want_ids=True)
    assert up.prompt_lower_bound(req) is None
    parser = openai_compat.ChunkParser(req, up)
    retok = Retokenizer(smollm2_map, tokenizer=PanickingTokenizer())  # type: ignore[arg-type]
    parser._retok = retok
    events = parser._tokens("some text", None)
    assert isinstance(events[-1], Failure) and events[-1].code == RETOKENIZE_FAILED


# -- the embedded engine's worker ------------------------------------------------------------


@pytest.mark.slow
def test_the_embedded_worker_answers_400_and_keeps_serving(engine, serve, monkeypatch) -> None:
    served = serve(engine)
    real = engine._llm.tokenize

    def panicking(text: bytes, *a: Any, **kw: Any) -> list[int]:
        if text.startswith(b"PANIC"):
            raise PanicException("native failure")
        return real(text, *a, **kw)

    monkeypatch.setattr(engine._llm, "tokenize", panicking)
    for body in ({"prompt": "PANIC now"},):
        resp = httpx.post(served.url + "/v1/completions", json={**body, "max_tokens": 1},
                          timeout=120)
        assert resp.status_code == 400, resp.text
        assert "cannot be tokenized" in resp.json()["error"]["message"]
    chat = httpx.post(served.url + "/v1/chat/completions", timeout=120, json={
        "max_tokens": 1, "messages": [{"role": "user", "content": "PANIC"}]})
    assert chat.status_code == 200  # the chat fragment starts with the template, not PANIC
    ok = httpx.post(served.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1},
                    timeout=120)
    assert ok.status_code == 200, ok.text  # the worker thread survived
