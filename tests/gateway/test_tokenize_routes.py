"""``POST /tokenize`` and ``POST /detokenize`` keep the event loop free while they work.

They encoded and decoded on the loop: one body near the 8 MiB limit held every other client
(``GET /health`` included) for seconds. Nothing here measures speed: the encoder (or
decoder) blocks on an event that is set only after ``GET /health`` has been answered, so a
route that runs it on the loop cannot answer the health check at all (the health request
times out; the blocked call gives up after its own safety timeout, so nothing hangs).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tokenwire.gateway.http import tokenize_routes
from tokenwire.gateway.ir import Finish, FinishKind

#: How long the blocked tokenizer waits at most, and how long the health check may take:
#: generous on a slow machine, yet a route on the loop fails here, never hangs the suite.
SAFETY_S = 10.0


class _Gate:
    """``entered`` is set once the work started; the work waits for ``release``."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def wait(self) -> None:
        self.entered.set()
        self.release.wait(SAFETY_S)


def _loop_stays_free(url: str, gate: _Gate, send: Callable[[], httpx.Response]) -> httpx.Response:
    """Send the blocking request from a thread, show ``GET /health`` is answered while it
    is blocked, then let it finish; its response."""
    got: dict[str, Any] = {}
    sender = threading.Thread(target=lambda: got.update(resp=send()), daemon=True)
    sender.start()
    try:
        assert gate.entered.wait(SAFETY_S), "the route never reached the tokenizer"
        health = httpx.get(url + "/health", timeout=SAFETY_S / 2)
        assert health.status_code == 200
        assert not gate.release.is_set()  # answered while the work was still blocked
    finally:
        gate.release.set()
        sender.join(SAFETY_S * 2)
    return got["resp"]


def test_tokenize_runs_off_the_event_loop(serve, monkeypatch: pytest.MonkeyPatch) -> None:
    from .conftest import ScriptedUpstream

    served = serve(ScriptedUpstream([(0.0, Finish(reason=FinishKind.EOS))]))
    gate = _Gate()

    class BlockingTokenizer:
        def encode(self, text: str, **_: Any) -> list[int]:
            gate.wait()
            return [1, 2, 3]

    monkeypatch.setattr(tokenize_routes, "_tokenizer", lambda tmap: BlockingTokenizer())
    resp = _loop_stays_free(served.url, gate, lambda: httpx.post(
        served.url + "/tokenize", json={"prompt": "big", "return_token_strs": True},
        timeout=SAFETY_S * 2))
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["tokens"] == [1, 2, 3] and body["count"] == 3 and len(body["token_strs"]) == 3
    assert resp.headers["codec-tokenizer-map"] == served.state.tmap.hash


def test_detokenize_runs_off_the_event_loop(serve, monkeypatch: pytest.MonkeyPatch) -> None:
    from .conftest import ScriptedUpstream

    served = serve(ScriptedUpstream([(0.0, Finish(reason=FinishKind.EOS))]))
    gate = _Gate()
    real = tokenize_routes.Detokenizer

    class BlockingDetokenizer(real):  # type: ignore[misc, valid-type]
        def decode(self, ids: Any, **kw: Any) -> str:
            gate.wait()
            return super().decode(ids, **kw)

    monkeypatch.setattr(tokenize_routes, "Detokenizer", BlockingDetokenizer)
    resp = _loop_stays_free(served.url, gate, lambda: httpx.post(
        served.url + "/detokenize", json={"tokens": [28, 29]}, timeout=SAFETY_S * 2))
    assert resp.status_code == 200, resp.text
    assert resp.json()["prompt"] == real(served.state.tmap).decode([28, 29],
                                                                   render_special=True)


def test_refusals_from_the_worker_thread_keep_their_shape(serve) -> None:
    # The id checks run on the worker thread now: their 400s must still be typed errors.
    from .conftest import ScriptedUpstream

    served = serve(ScriptedUpstream([(0.0, Finish(reason=FinishKind.EOS))]))
    top = served.state.tmap.max_id
    for tokens, code in (([1, "x"], "invalid_type"), ([1, True], "invalid_type"),
                         ([top + 1], None)):
        resp = httpx.post(served.url + "/detokenize", json={"tokens": tokens}, timeout=30)
        assert resp.status_code == 400, resp.text
        err = resp.json()["error"]
        assert err["param"] == "tokens" and err["type"] == "invalid_request_error"
        if code is not None:
            assert err["code"] == code
    bad_flag = httpx.post(served.url + "/tokenize", timeout=30,
                          json={"prompt": "hi", "return_token_strs": "yes"})
    assert bad_flag.status_code == 400 and bad_flag.json()["error"]["param"] == \
        "return_token_strs"


def test_a_gateway_without_a_map_refuses_tokenize_and_detokenize_with_a_400() -> None:
    # An upstream configured without a tokenizer map (an OpenAI-compatible one serving text)
    # leaves the server-wide routes no map to use: they answered the gateway's own 500.
    from tokenwire.gateway.http.state import GatewayState
    from tokenwire.gateway.settings import ServerSettings

    from .conftest import ScriptedUpstream, start_server

    up = ScriptedUpstream([(0.0, Finish(reason=FinishKind.EOS))])
    served = start_server(GatewayState(settings=ServerSettings(), upstream=up, tmap=None))
    try:
        for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1]})):
            resp = httpx.post(served.url + path, json=body, timeout=30)
            assert resp.status_code == 400, (path, resp.text)
            err = resp.json()["error"]
            assert err["code"] == "unsupported_value" and "tokenizer map" in err["message"]
    finally:
        served.stop()
