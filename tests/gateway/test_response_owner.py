"""Stored responses belong to the API key that made them (``state/response_store.py``,
``OwnedStore``): another key's ``GET /v1/responses/{id}`` or ``previous_response_id``, over
HTTP or the WebSocket, finds nothing, exactly as for an unknown id.

Before, the store was one namespace for every key: with two keys configured, key B read key
A's stored response with ``GET`` (200, A's whole output) and continued A's conversation
(A's input and answer were sent to the model as B's prompt)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tokenwire.gateway.ir import GenerationRequest
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.state.api_keys import (
    ANONYMOUS_KEY,
    UNNAMED,
    ApiKey,
    digest,
    response_owner,
)
from tokenwire.gateway.state.response_store import (
    OwnedStore,
    ResponseNotStored,
    SQLiteResponseStore,
)

from .test_hardening import serve_stack, stop_stacks
from .test_responses_ws import (
    KEY,
    WAIT_S,
    PacedUpstream,
    Stack,
    _router,
    create,
    open_ws,
    text_reply,
    until_terminal,
)

OTHER = "tw-ws-key-other-0123456789ab"


@pytest.fixture
def two_keys() -> Iterator[Callable[[], Stack]]:
    """``serve_gateway`` over a scripted model, with two flat keys (``KEY``, ``OTHER``)."""
    running: list[tuple[Any, Any]] = []
    patch = pytest.MonkeyPatch()

    def start() -> Stack:
        upstream = PacedUpstream(text_reply("Hi ", "there."))
        settings = ServerSettings(api_keys=(KEY, OTHER), auth="keys")
        served = serve_stack(patch, running, settings, router=_router(upstream))
        return Stack(f"ws://127.0.0.1:{served.port}", upstream, served.state, served.server)

    yield start
    stop_stacks(patch, running)


def _http(stack, key: str) -> httpx.Client:
    return httpx.Client(base_url=stack.url.replace("ws://", "http://"), timeout=WAIT_S,
                        headers={"authorization": f"Bearer {key}"})


def _prompt_texts(request: GenerationRequest) -> list[str]:
    return [str(m.content) for m in request.prompt.messages]  # type: ignore[union-attr]


def test_another_keys_get_and_continuation_are_not_found(two_keys) -> None:
    stack = two_keys()
    with _http(stack, KEY) as a, _http(stack, OTHER) as b:
        made = a.post("/v1/responses", json={"model": "scripted", "input": "A's secret"})
        rid = made.json()["id"]
        assert a.get(f"/v1/responses/{rid}").json()["id"] == rid  # its own key reads it
        got = b.get(f"/v1/responses/{rid}")
        assert got.status_code == 404
        assert got.json()["error"] == {"message": f"Response with id '{rid}' not found.",
                                       "type": "invalid_request_error",
                                       "param": "response_id", "code": "not_found"}
        cont = b.post("/v1/responses", json={"model": "scripted", "input": "and then?",
                                             "previous_response_id": rid})
        assert cont.status_code == 400
        assert cont.json()["error"]["code"] == "previous_response_not_found"
        assert cont.json()["error"]["param"] == "previous_response_id"
        # Its own key continues it: the conversation is all there.
        ok = a.post("/v1/responses", json={"model": "scripted", "input": "and then?",
                                           "previous_response_id": rid})
        assert ok.status_code == 200
    assert len(stack.upstream.requests) == 2  # B's continuation never reached the model
    assert _prompt_texts(stack.upstream.requests[1]) == ["A's secret", "Hi there.",
                                                          "and then?"]


def test_delete_forgets_a_response_for_its_own_key_only(two_keys) -> None:
    """``DELETE /v1/responses/{id}`` (the SDKs' ``responses.delete``) was a 405: a stored
    conversation could not be removed before its 30 days."""
    stack = two_keys()
    with _http(stack, KEY) as a, _http(stack, OTHER) as b:
        rid = a.post("/v1/responses", json={"model": "scripted", "input": "A's secret"}
                     ).json()["id"]
        refused = b.delete(f"/v1/responses/{rid}")  # another key's: not there for it
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "not_found"
        assert a.get(f"/v1/responses/{rid}").status_code == 200
        done = a.delete(f"/v1/responses/{rid}")
        assert done.status_code == 200
        assert done.json() == {"id": rid, "object": "response", "deleted": True}
        assert a.get(f"/v1/responses/{rid}").status_code == 404
        assert a.delete(f"/v1/responses/{rid}").status_code == 404
        cont = a.post("/v1/responses", json={"model": "scripted", "input": "more",
                                             "previous_response_id": rid})
        assert cont.json()["error"]["code"] == "previous_response_not_found"
    import openai  # the SDK's own call: it accepts the answer

    sdk = openai.OpenAI(base_url=stack.url.replace("ws://", "http://") + "/v1", api_key=KEY,
                        max_retries=0)
    made = sdk.responses.create(model="scripted", input="again")
    sdk.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(made.id)
    sdk.close()


def test_another_keys_socket_cannot_continue_a_stored_response(two_keys) -> None:
    stack = two_keys()
    with _http(stack, KEY) as a:
        rid = a.post("/v1/responses", json={"model": "scripted", "input": "A's secret"}
                     ).json()["id"]
    with open_ws(stack, Authorization=f"Bearer {OTHER}") as ws:
        ws.send(create(previous_response_id=rid))
        [error] = until_terminal(ws)
    assert error["type"] == "error" and error["status"] == 400
    assert error["error"]["code"] == "previous_response_not_found"
    with open_ws(stack) as ws:  # KEY's socket does
        ws.send(create(previous_response_id=rid, input="more"))
        assert until_terminal(ws)[-1]["type"] == "response.completed"
    assert len(stack.upstream.requests) == 2
    # And what a socket stores is its key's too.
    with open_ws(stack, Authorization=f"Bearer {OTHER}") as ws:
        ws.send(create(store=True, input="B's own"))
        b_rid = until_terminal(ws)[-1]["response"]["id"]
    with _http(stack, KEY) as a, _http(stack, OTHER) as b:
        assert a.get(f"/v1/responses/{b_rid}").status_code == 404
        assert b.get(f"/v1/responses/{b_rid}").status_code == 200


def test_owners_named_flat_and_anonymous() -> None:
    named = ApiKey(name="ci-bot", sha256=digest("s1"))
    rotated = ApiKey(name="ci-bot", sha256=digest("s2"))
    flat1, flat2 = (ApiKey(name=UNNAMED, sha256=digest(k)) for k in ("k1", "k2"))
    owners = [response_owner(k) for k in (named, flat1, flat2, ANONYMOUS_KEY)]
    assert len(set(owners)) == 4 and not any("/" in o for o in owners)
    assert response_owner(rotated) == response_owner(named)  # a named key is its name
    assert digest("k1").hex() not in response_owner(flat1)  # not the digest keys check


def test_an_owned_view_keeps_the_clients_id_in_what_it_returns_and_raises() -> None:
    inner = SQLiteResponseStore(max_bytes=2_000)
    mine, theirs = OwnedStore(inner, "key-a"), OwnedStore(inner, "key-b")
    resp = {"id": "resp_1", "output": []}
    asyncio.run(mine.put("resp_1", input_items=[], response=resp))
    got = asyncio.run(mine.get("resp_1"))
    assert got is not None and got.id == "resp_1" and got.response == resp
    assert asyncio.run(theirs.get("resp_1")) is None
    with pytest.raises(Exception, match="resp_big"):
        asyncio.run(mine.put("resp_big", input_items=[{"x": "y" * 5_000}], response=resp))
    with pytest.raises(ResponseNotStored) as exc:
        asyncio.run(mine.get("resp_big"))
    assert "'resp_big'" in str(exc.value) and "key-a" not in str(exc.value)
    assert asyncio.run(theirs.get("resp_big")) is None  # not even "too large" for another
    with pytest.raises(ValueError):
        OwnedStore(inner, "a/b")


def test_serialized_ids_never_cross_owners_through_a_slash() -> None:
    # An id holding "/" cannot reach into another owner's namespace: the owner is always
    # the first segment of what is stored.
    inner = SQLiteResponseStore()
    asyncio.run(OwnedStore(inner, "key-a").put("resp_1", input_items=[],
                                               response={"output": []}))
    assert asyncio.run(OwnedStore(inner, "anonymous").get("../key-a/resp_1")) is None
    assert asyncio.run(OwnedStore(inner, "key").get("a/resp_1")) is None
