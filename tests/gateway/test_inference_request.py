"""The inference endpoints' request (``http/dispatch.py`` ``InferenceRequest``): its indexed
headers answer every lookup as Starlette's own ``Headers`` does, which is the oracle here."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.requests import Request

from tokenwire.gateway.http.dispatch import InferenceRequest

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
