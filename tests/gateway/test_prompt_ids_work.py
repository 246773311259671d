"""Prompts of millions of token ids never hold the event loop.

A Path C body near the 8 MiB limit holds up to 8 million packed ids (and 8 KB of gzip
inflates to one): parsing it on the loop, then checking every id against the vocabulary in
Python, held every other client for 1.5-2 s per request; a Completions prompt of 4 million
ids held it ~1 s. Nothing here measures time: a large Path C body is shown to be parsed
while ``GET /health`` is still answered (the parse is blocked until then), and the id checks
are shown to run no Python line per id (``tests/interpreter_work.py``).
"""

from __future__ import annotations

import httpx
import msgspec
import pytest

from tokenwire.errors import InvalidRequest
from tokenwire.gateway.apis.completions import parse_completions_request
from tokenwire.gateway.http import app as app_mod
from tokenwire.gateway.http.generation import check_model_limits
from tokenwire.gateway.http.requests import INLINE_BODY_BYTES
from tokenwire.gateway.ir import (
    Finish,
    FinishKind,
    GenerationRequest,
    IdsSource,
    PromptIds,
)
from tokenwire.gateway.routing.router import ServedModel

from ..interpreter_work import lines_run
from .conftest import ScriptedUpstream
from .test_tokenize_routes import SAFETY_S, _Gate, _loop_stays_free


def test_a_large_path_c_body_is_parsed_off_the_event_loop(serve, monkeypatch) -> None:
    served = serve(ScriptedUpstream([(0.0, Finish(reason=FinishKind.EOS))]))
    gate = _Gate()
    real = app_mod.decode_request

    def blocking_decode(*args, **kw):
        gate.wait()
        return real(*args, **kw)

    monkeypatch.setattr(app_mod, "decode_request", blocking_decode)
    body = msgspec.msgpack.encode({"prompt_ids": [5] * (INLINE_BODY_BYTES + 1),
                                   "max_tokens": 4})
    resp = _loop_stays_free(served.url, gate, lambda: httpx.post(
        served.url + "/v1/completions/codec", content=body, timeout=SAFETY_S * 2,
        headers={"content-type": "application/x-msgpack"}))
    # parsed, then refused as any prompt longer than the window is, in the API's shape
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "context_length_exceeded"


def test_a_malformed_large_path_c_body_keeps_its_typed_400(serve) -> None:
    served = serve(ScriptedUpstream([(0.0, Finish(reason=FinishKind.EOS))]))
    body = msgspec.msgpack.encode({"prompt_ids": [5] * INLINE_BODY_BYTES + [-1]})
    resp = httpx.post(served.url + "/v1/completions/codec", content=body, timeout=30,
                      headers={"content-type": "application/x-msgpack"})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "codec_malformed_frame"


def _served(tmap) -> ServedModel:
    return ServedModel(name="m", upstream=ScriptedUpstream([]), tmap=tmap, max_model_len=1024,
                       ids_source=IdsSource.ENGINE, upstream_name="scripted")


def _ids_request(ids: list[int]) -> GenerationRequest:
    return GenerationRequest(prompt=PromptIds(ids=tuple(ids)), max_tokens=4)


def test_the_vocabulary_check_runs_no_python_line_per_id(smollm2_map) -> None:
    served = _served(smollm2_map)
    check_model_limits(served, _ids_request([5]))  # first calls build caches: not counted
    few = lines_run(check_model_limits, served, _ids_request([5] * 10))
    many = lines_run(check_model_limits, served, _ids_request([5] * 100_000))
    assert many == few


def test_an_id_outside_the_vocabulary_is_still_named_by_its_index(smollm2_map) -> None:
    top = smollm2_map.max_id
    with pytest.raises(InvalidRequest, match=r"prompt_ids\[2\]: token id") as info:
        check_model_limits(_served(smollm2_map), _ids_request([1, top, top + 1, 0]),
                           prompt_field="prompt_ids")
    assert info.value.param == "prompt_ids[2]"


def _parse(prompt: object) -> object:
    try:
        return parse_completions_request({"model": "m", "prompt": prompt}).request.prompt
    except InvalidRequest as exc:
        return str(exc)


@pytest.mark.parametrize("tail", [[], [True], [-1]], ids=["served", "boolean", "negative"])
def test_completions_prompt_ids_are_checked_without_a_python_line_per_id(tail) -> None:
    _parse([5, *tail])  # first calls build caches: not counted
    few = lines_run(_parse, [5] * 10 + tail)
    many = lines_run(_parse, [5] * 100_000 + tail)
    assert many == few
    assert _parse([5] * 3 + tail) == {
        (): PromptIds(ids=(5, 5, 5)), (True,): "prompt[3] is a boolean; token ids are integers",
        (-1,): "prompt token ids must be non-negative"}[tuple(tail)]
