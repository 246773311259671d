"""The inference endpoints' request (``http/dispatch.py`` ``InferenceRequest``): its indexed
headers answer every lookup as Starlette's own ``Headers`` does, which is the oracle here;
its JSON body's depth bound and its id (``http/requests.py``)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.requests import Request

from tokenwire.errors import InvalidRequest
from tokenwire.gateway.http.dispatch import InferenceRequest
from tokenwire.gateway.http.requests import MAX_JSON_DEPTH, decode_json, new_id

# Few names, so repeats (first value wins) and misses both happen often.
_NAMES = st.sampled_from([b"content-type", b"accept-encoding", b"x-dup", b"codec-client-version",
                          b"content-length"])
_VALUES = st.binary(max_size=6).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
_ASKED = st.sampled_from(["Content-Type", "content-type", "ACCEPT-ENCODING", "x-dup", "X-Dup",
                          "codec-client-version", "content-length", "missing", "x-api-key"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_NAMES, _VALUES), max_size=8), st.lists(_ASKED, min_size=1))
def test_indexed_headers_answer_as_starlettes(raw: list[tuple[bytes, bytes]],
                                              asked: list[str]) -> None:
    scope = {"type": "http", "headers": raw}
    ours, theirs = InferenceRequest(scope).headers, Request(scope).headers
    for name in asked:
        assert ours.get(name) == theirs.get(name)
        assert ours.get(name, "default") == theirs.get(name, "default")
        assert (name in ours) == (name in theirs)
        assert ours.getlist(name) == theirs.getlist(name)
        if name in theirs:
            assert ours[name] == theirs[name]
    assert dict(ours) == dict(theirs) and ours.raw == theirs.raw


def test_the_headers_are_made_once_per_request() -> None:
    request = InferenceRequest({"type": "http", "headers": [(b"x-dup", b"1")]})
    assert request.headers is request.headers


def _depth(value: object) -> int:
    if isinstance(value, dict):
        value = list(value.values())
    if not isinstance(value, list):
        return 0
    return 1 + max((_depth(child) for child in value), default=0)


def _nested(depth: int, leaf: object, *, dicts: bool) -> object:
    value = leaf
    for _ in range(depth):
        value = {"k": value} if dicts else [value]
    return value


@pytest.mark.parametrize("dicts", [False, True])
@pytest.mark.parametrize("depth", [1, 63, 64, 65, 200])
@pytest.mark.parametrize("leaf", [0, "[{" * 40, ["[", "{"] * 40])
def test_json_depth_is_refused_past_the_limit_whatever_the_brackets(
        depth: int, leaf: object, dicts: bool) -> None:
    """The bracket count only skips the walk when it cannot matter: brackets inside strings
    or a wide shallow body change nothing, one level past the limit is still a 400."""
    value = _nested(depth, leaf, dicts=dicts)
    body = json.dumps(value).encode()
    if _depth(value) > MAX_JSON_DEPTH:
        with pytest.raises(InvalidRequest) as caught:
            decode_json(body)
        assert caught.value.code == "invalid_json" and caught.value.status_hint == 400
    else:
        assert decode_json(body) == value


def test_request_ids_are_96_random_bits_in_hex() -> None:
    ids = {new_id("chatcmpl") for _ in range(100)}
    assert len(ids) == 100
    for rid in ids:
        prefix, _, tail = rid.partition("-")
        assert prefix == "chatcmpl" and len(tail) == 24 and int(tail, 16) >= 0
