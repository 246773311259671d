"""Large JSON request bodies are parsed off the event loop; small ones inline, as before.

A Chat body of 270,000 tiny messages (8.1 MB, under the 8 MiB limit) held the event loop
~0.9 s while it was decoded and parsed, and every other client (``GET /health`` included)
waited; the same on every JSON route. Now a body over ``INLINE_BODY_BYTES`` is decoded and
parsed on a worker thread (``requests.read_parsed``). Nothing here measures time: the
parser of a large body is held at a gate while ``GET /health`` is answered, and the thread
each step ran on is recorded. A large body here is a small one padded with JSON whitespace,
so both must get the very same answer, errors included.
"""

from __future__ import annotations

import json
import threading
from types import ModuleType
from typing import Any

import httpx
import pytest

from tokenwire.gateway.http import app as app_mod
from tokenwire.gateway.http import messages_route, requests, responses_routes, tokenize_routes
from tokenwire.gateway.http.requests import INLINE_BODY_BYTES
from tokenwire.gateway.ir import Finish, FinishKind

from .conftest import ScriptedUpstream
from .test_tokenize_routes import SAFETY_S, _Gate, _loop_stays_free

_HI = [{"role": "user", "content": "hi"}]

#: route -> (module holding its steps, the steps in order (the last is held at the gate),
#: a valid body, a refused one)
ROUTES: dict[str, tuple[ModuleType, tuple[str, ...], dict[str, Any], Any]] = {
    "/v1/completions": (app_mod, ("decode_json", "parse_completions_request"),
                        {"prompt": "hi", "max_tokens": 1}, {"prompt": "hi", "max_tokens": "x"}),
    "/v1/chat/completions": (app_mod, ("decode_json", "parse_chat_request"),
                             {"messages": _HI, "max_tokens": 1},
                             {"messages": [{"role": "wizard", "content": "hi"}]}),
    "/v1/messages": (messages_route, ("decode_json", "parse_messages_request"),
                     {"messages": _HI, "max_tokens": 1}, {"messages": _HI}),
    "/v1/messages/count_tokens": (messages_route, ("decode_json", "parse_messages_request"),
                                  {"messages": _HI}, {"messages": []}),
    "/v1/responses": (responses_routes, ("decode_json", "parse_responses_request"),
                      {"input": "hi", "max_output_tokens": 16}, {"input": []}),
    "/tokenize": (tokenize_routes, ("decode_json",), {"prompt": "hi"}, {"prompt": 5}),
    "/detokenize": (tokenize_routes, ("decode_json",), {"tokens": [28, 29]},
                    {"tokens": [1, "x"]}),
}


def _raw(body: Any, *, large: bool) -> bytes:
    raw = json.dumps(body).encode()
    return raw + b" " * (INLINE_BODY_BYTES + 1 - len(raw)) if large else raw


@pytest.fixture(scope="module")
def served(serve):
    return serve(ScriptedUpstream([(0.0, Finish(reason=FinishKind.EOS))]))


class _Steps:
    """Wraps a route's steps: records the thread each ran on; the last one can wait at a
    gate."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module: ModuleType,
                 names: tuple[str, ...], gate: _Gate | None = None) -> None:
        self.threads: dict[str, int] = {}
        for name in names:
            held = gate if name == names[-1] else None
            # decode_json is also wrapped where it is defined: the routes once called it
            # from there (read_json), and this test must fail on that code, not break.
            for owner in (module, requests) if name == "decode_json" else (module,):
                real = getattr(owner, name, None)
                if real is not None:
                    monkeypatch.setattr(owner, name, self._wrap(name, real, held))

    def _wrap(self, name: str, real: Any, gate: _Gate | None) -> Any:
        def step(*args: Any, **kw: Any) -> Any:
            self.threads[name] = threading.get_ident()
            if gate is not None:
                gate.wait()
            return real(*args, **kw)
        return step


def _post(url: str, raw: bytes) -> httpx.Response:
    return httpx.post(url, content=raw, timeout=SAFETY_S * 2,
                      headers={"content-type": "application/json"})


@pytest.mark.parametrize("path", list(ROUTES))
def test_a_large_body_is_parsed_while_the_loop_serves_others(served, monkeypatch, path) -> None:
    module, names, body, _ = ROUTES[path]
    small = _post(served.url + path, _raw(body, large=False))
    gate = _Gate()
    steps = _Steps(monkeypatch, module, names, gate)
    resp = _loop_stays_free(served.url, gate, lambda: _post(served.url + path,
                                                            _raw(body, large=True)))
    assert resp.status_code == small.status_code, resp.text
    assert steps.threads.keys() == set(names)
    assert served.thread.ident not in steps.threads.values()  # every step off the loop


@pytest.mark.parametrize("path", list(ROUTES))
def test_a_small_body_is_still_parsed_on_the_loop(served, monkeypatch, path) -> None:
    module, names, body, _ = ROUTES[path]
    steps = _Steps(monkeypatch, module, names)
    resp = _post(served.url + path, _raw(body, large=False))
    assert resp.status_code < 500, resp.text
    assert steps.threads == dict.fromkeys(names, served.thread.ident)


#: Bodies every JSON route refuses alike: not JSON; nested too deep for the depth walk;
#: too deep for the decoder itself (its RecursionError, here on a worker thread).
_BROKEN = (b"not json", b"[" * 100 + b"]" * 100, b"[" * 5_000 + b"]" * 5_000)


@pytest.mark.parametrize("path", list(ROUTES))
def test_refusals_are_the_same_from_either_thread(served, path) -> None:
    for raw in (json.dumps(ROUTES[path][3]).encode(), *_BROKEN):
        inline = _post(served.url + path, raw)
        assert 400 <= inline.status_code < 500, inline.text
        off_loop = _post(served.url + path, raw + b" " * (INLINE_BODY_BYTES + 1 - len(raw)))
        assert (off_loop.status_code, off_loop.json()) == (inline.status_code, inline.json())


@pytest.mark.parametrize("large", [False, True])
def test_a_large_websocket_message_is_parsed_off_the_loop(served, monkeypatch,
                                                          large: bool) -> None:
    """The Responses WebSocket's ``response.create`` messages follow the same rule as HTTP
    bodies: one of megabytes is decoded (and re-encoded) on a worker thread."""
    from websockets.sync.client import connect

    from tokenwire.gateway.http import responses_ws

    message = json.dumps({"type": "response.create", "model": "m", "input": "hi",
                          "max_output_tokens": 1}).encode()
    gate = _Gate() if large else None
    steps = _Steps(monkeypatch, responses_ws, ("decode_json",), gate)
    url = served.url.replace("http://", "ws://") + "/v1/responses"
    with connect(url, open_timeout=SAFETY_S, max_size=None) as ws:
        def send() -> httpx.Response:
            ws.send(_raw(json.loads(message), large=large).decode())
            while json.loads(ws.recv(SAFETY_S))["type"] not in (
                    "response.completed", "response.incomplete", "response.failed", "error"):
                pass
            return httpx.Response(200)

        if gate is not None:
            _loop_stays_free(served.url, gate, send)
        else:
            send()
    loop = served.thread.ident
    assert (steps.threads["decode_json"] == loop) is not large
