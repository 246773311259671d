"""The embedded response store: what ``previous_response_id`` and ``GET /v1/responses/{id}``
read (issue 5 item 4). Expiry and eviction are driven by an injected clock, never by waiting."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenwire.gateway.state.response_store import (
    ResponseNotStored,
    ResponseStore,
    ResponseTooLarge,
    SQLiteResponseStore,
    StoredResponse,
    decode_record,
)


def put(store: ResponseStore, rid: str, **kw: object) -> None:
    asyncio.run(store.put(rid, **kw))  # type: ignore[arg-type]


def get(store: ResponseStore, rid: str) -> StoredResponse | None:
    return asyncio.run(store.get(rid))


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def response(rid: str, text: str = "hi") -> dict:
    return {"id": rid, "object": "response", "status": "completed",
            "output": [{"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": text}]}]}


def test_sqlite_store_implements_the_protocol() -> None:
    store: ResponseStore = SQLiteResponseStore()
    assert get(store, "resp_missing") is None


def test_a_stored_response_reads_back_with_its_input_and_output() -> None:
    store = SQLiteResponseStore()
    items = [{"type": "message", "role": "user", "content": "hello"}]
    put(store, "resp_1", input_items=items, response=response("resp_1"))
    got = get(store, "resp_1")
    assert got is not None
    assert got.response == response("resp_1")
    assert got.input == tuple(items)
    assert got.conversation() == [*items, *response("resp_1")["output"]]


def test_an_unknown_id_reads_as_absent() -> None:
    assert get(SQLiteResponseStore(), "resp_nope") is None


def test_a_response_past_its_ttl_reads_as_absent() -> None:
    clock = Clock()
    store = SQLiteResponseStore(ttl_s=60, clock=clock)
    put(store, "resp_1", input_items=[], response=response("resp_1"))
    clock.now += 59
    assert get(store, "resp_1") is not None
    clock.now += 2
    assert get(store, "resp_1") is None


def test_expired_rows_are_deleted_on_the_next_put() -> None:
    clock = Clock()
    store = SQLiteResponseStore(ttl_s=60, clock=clock)
    put(store, "resp_old", input_items=[], response=response("resp_old"))
    clock.now += 120
    put(store, "resp_new", input_items=[], response=response("resp_new"))
    assert len(store) == 1


def test_rows_are_bounded_and_the_oldest_go_first() -> None:
    clock = Clock()
    store = SQLiteResponseStore(max_rows=3, clock=clock)
    for i in range(5):
        clock.now += 1
        put(store, f"resp_{i}", input_items=[], response=response(f"resp_{i}"))
    assert len(store) == 3
    assert [get(store, f"resp_{i}") is not None for i in range(5)] == [False, False, True,
                                                                       True, True]


def test_putting_the_same_id_replaces_it() -> None:
    store = SQLiteResponseStore()
    put(store, "resp_1", input_items=[], response=response("resp_1", "a"))
    put(store, "resp_1", input_items=[], response=response("resp_1", "b"))
    got = get(store, "resp_1")
    assert got is not None and got.output[0]["content"][0]["text"] == "b"
    assert len(store) == 1


def test_a_response_without_an_id_is_refused() -> None:
    with pytest.raises(ValueError):
        put(SQLiteResponseStore(), "", input_items=[], response={"object": "response"})


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError):
        SQLiteResponseStore(max_rows=0)
    with pytest.raises(ValueError):
        SQLiteResponseStore(ttl_s=0)


def test_a_file_store_survives_reopening(tmp_path: Path) -> None:
    path = str(tmp_path / "responses.sqlite3")
    first = SQLiteResponseStore(path)
    put(first, "resp_1", input_items=[{"role": "user", "content": "x"}],
              response=response("resp_1"))
    first.close()
    second = SQLiteResponseStore(path)
    got = get(second, "resp_1")
    assert got is not None and got.input == ({"role": "user", "content": "x"},)
    second.close()


def test_the_store_is_safe_to_share_between_threads() -> None:
    store = SQLiteResponseStore(max_rows=10_000)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(50):
                put(store, f"resp_{t}_{i}", input_items=[{"n": i}],
                          response=response(f"resp_{t}_{i}"))
                assert get(store, f"resp_{t}_{i}") is not None
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert len(store) == 200


_json = st.recursive(st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.text(),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=10)


@settings(max_examples=100, deadline=None)
@given(items=st.lists(st.dictionaries(st.text(max_size=5), _json, max_size=3), max_size=4),
       extra=st.dictionaries(st.text(max_size=5), _json,
                                                                 max_size=3))
def test_stored_json_round_trips_exactly(items: list, extra: dict) -> None:
    # Items are objects (the request parser refuses any other), so only objects are stored.
    store = SQLiteResponseStore()
    resp = {**extra, "id": "resp_x", "output": []}
    put(store, "resp_x", input_items=items, response=resp)
    got = get(store, "resp_x")
    assert got is not None and got.response == resp and list(got.input) == items


def test_a_response_over_the_byte_cap_is_not_stored_and_reads_say_why() -> None:
    store = SQLiteResponseStore(max_bytes=2_000)
    with pytest.raises(ResponseTooLarge) as too_large:
        put(store, "resp_big", input_items=[{"role": "user", "content": "x" * 5_000}],
            response=response("resp_big"))
    assert too_large.value.cap == 2_000 and too_large.value.size > 5_000
    with pytest.raises(ResponseNotStored, match="over the store's cap of 2000 bytes"):
        get(store, "resp_big")
    put(store, "resp_small", input_items=[], response=response("resp_small"))
    assert get(store, "resp_small") is not None


def test_the_producing_replica_is_stored_with_the_response() -> None:
    store = SQLiteResponseStore()
    put(store, "resp_1", input_items=[], response=response("resp_1"), replica=("pool", "r2"))
    got = get(store, "resp_1")
    assert got is not None and (got.pool, got.replica) == ("pool", "r2")


@pytest.mark.parametrize("data", [
    b"{", b"[1, 2]", b"7", b'{"created": 1}', b'{"input": 3}',
    # Shaped like a record, with fields of other types: GET served the list as the stored
    # response (200 "[1, 2]"), a continuation was a 500 (AttributeError), or a 400 blaming
    # the client's previous_response_id ("must be an object, got integer").
    b'{"created": 1, "input": [], "response": [1, 2]}',
    b'{"created": 1, "input": "abc", "response": {"output": []}}',
    b'{"created": 1, "input": [1, null], "response": {"output": []}}',
    b'{"created": 1, "input": [], "response": {"output": "zz"}}',
    b'{"created": 1, "input": [], "response": {"output": [7]}}',
    b'{"created": "x", "input": [], "response": {}}',
    b'{"created": 1, "input": [], "response": {}, "pool": 3}',
    b'{"created": 1, "too_large": "big", "cap": null}',
    # Nested past the decoder's depth: a RecursionError, a 500 on GET and continuation.
    b'{"created": 1, "input": [], "response": {"x": ' + b"[" * 100_000 + b"]" * 100_000
    + b"}}",
])
def test_a_value_that_is_not_our_record_reads_as_absent(data: bytes) -> None:
    # Corrupt, or written under our prefix by something else (another app, another
    # version): "not found", never a 500 and never served as if it were ours.
    assert decode_record("resp_x", data) is None
