"""Routing rules: client model name -> served model, the default, ids, and cached health."""

from __future__ import annotations

import asyncio

import pytest

from tokenwire.errors import ConfigError, RemoteProtocolError, UnknownModel
from tokenwire.gateway.ir import (
    Finish,
    FinishKind,
    GenerationRequest,
    IdsSource,
    PromptText,
    TokenDelta,
    Usage,
)
from tokenwire.gateway.routing.health import HealthMonitor, overall_status
from tokenwire.gateway.routing.router import Router, ServedModel
from tokenwire.gateway.upstreams.base import UpstreamHealth, UpstreamState

from .conftest import ScriptedUpstream

_TEXT = [(0.0, TokenDelta(text="Hello")), (0.0, TokenDelta(text=" world")),
         (0.0, Usage(prompt_tokens=1, completion_tokens=2)), (0.0, Finish(reason=FinishKind.EOS))]


def _model(name: str, **kw) -> ServedModel:
    return ServedModel(name=name, upstream=ScriptedUpstream(script=list(_TEXT)), **kw)


def _request(want_ids: bool) -> GenerationRequest:
    return GenerationRequest(prompt=PromptText(text="hi"), want_ids=want_ids)


def test_one_model_is_the_default_for_requests_without_model() -> None:
    r = Router([_model("a")])
    assert r.route(None).name == "a" and r.route("").name == "a" and r.route("a").name == "a"


def test_several_models_without_default_require_model_400_naming_them() -> None:
    r = Router([_model("a"), _model("b")])
    with pytest.raises(RemoteProtocolError) as info:
        r.route(None)
    assert info.value.status_hint == 400
    assert str(info.value) == "model is required: this server serves 2 models ('a', 'b')"


def test_configured_default_routes_requests_without_model() -> None:
    assert Router([_model("a"), _model("b")], default="b").route(None).name == "b"


def test_unknown_model_is_404_listing_served_models() -> None:
    with pytest.raises(UnknownModel) as info:
        Router([_model("a"), _model("b")]).route("c")
    assert info.value.status_hint == 404
    assert str(info.value) == ("the model 'c' does not exist on this server; served models: "
                               "'a', 'b'")


@pytest.mark.parametrize(("models", "default", "message"), [
    ([], None, "no models to serve"),
    (["a", "a"], None, "model 'a' is served twice; model names must be unique"),
    (["a"], "z", "default model 'z' is not served; served: 'a'"),
])
def test_bad_routers_are_config_errors(models, default, message) -> None:
    with pytest.raises(ConfigError) as info:
        Router([_model(n) for n in models], default=default)
    assert str(info.value) == message


def test_retokenized_needs_a_map() -> None:
    with pytest.raises(ConfigError, match="retokenized ids need a tokenizer map"):
        _model("a", ids_source=IdsSource.RETOKENIZED)


def test_has_ids_only_when_ids_have_a_source() -> None:
    assert not _model("a").has_ids
    assert _model("a", ids_source=IdsSource.UPSTREAM).has_ids


async def _drain(stream) -> list:
    events = [await stream.next_event()]
    while not isinstance(events[-1], Finish):
        events.append(await stream.next_event())
    return events


def test_retokenized_model_fills_ids_equal_to_the_maps_tokenization(smollm2_map) -> None:
    from tokenwire.codec.tokenizer import Tokenizer

    m = _model("a", tmap=smollm2_map, ids_source=IdsSource.RETOKENIZED)
    events = asyncio.run(_drain(m.submit(_request(want_ids=True))))
    ids = [i for e in events if isinstance(e, TokenDelta) for i in e.ids]
    assert ids == list(Tokenizer.from_map(smollm2_map).encode("Hello world"))
    assert "".join(e.text for e in events if isinstance(e, TokenDelta)) == "Hello world"


def test_ids_are_not_computed_when_the_client_does_not_want_them(smollm2_map) -> None:
    m = _model("a", tmap=smollm2_map, ids_source=IdsSource.RETOKENIZED)
    events = asyncio.run(_drain(m.submit(_request(want_ids=False))))
    assert all(not e.ids for e in events if isinstance(e, TokenDelta))


def test_upstream_ids_pass_through_unchanged(smollm2_map) -> None:
    up = ScriptedUpstream(script=[(0.0, TokenDelta(ids=(7, 8), text="x")),
                                  (0.0, Finish(reason=FinishKind.EOS))])
    m = ServedModel(name="a", upstream=up, tmap=smollm2_map, ids_source=IdsSource.UPSTREAM)
    events = asyncio.run(_drain(m.submit(_request(want_ids=True))))
    assert events[0] == TokenDelta(ids=(7, 8), text="x")


def test_overall_status_is_ok_degraded_or_down() -> None:
    up, down = UpstreamState.UP, UpstreamState.DOWN
    assert overall_status([up, up]) == "ok"
    assert overall_status([up, down]) == "degraded"
    assert overall_status([UpstreamState.DEGRADED]) == "degraded"
    assert overall_status([down]) == "down"


class _Probed:
    kind = "fake"

    def __init__(self, name: str) -> None:
        self.name, self.calls, self.state = name, 0, UpstreamState.UP

    async def probe(self) -> UpstreamHealth:
        self.calls += 1
        return UpstreamHealth(name=self.name, kind="fake", state=self.state)


def test_health_probes_at_most_once_per_interval_and_refreshes_after() -> None:
    now = [0.0]
    a = _Probed("a")
    mon = HealthMonitor((("a", a),), interval=5.0, clock=lambda: now[0])

    async def scenario() -> list[UpstreamState]:
        seen = [(await mon.snapshot())[0].state]  # first call waits for the first probe
        a.state = UpstreamState.DOWN
        for _ in range(10):
            seen.append((await mon.snapshot())[0].state)
        now[0] = 6.0
        await mon.snapshot()  # stale: a background refresh starts, the cached value answers
        for _ in range(20):  # let the background refresh finish
            await asyncio.sleep(0)
        seen.append((await mon.snapshot())[0].state)
        return seen

    seen = asyncio.run(scenario())
    assert a.calls == 2
    assert seen[:11] == [UpstreamState.UP] * 11 and seen[-1] is UpstreamState.DOWN


def test_a_probe_that_raises_reports_down_without_failing_health() -> None:
    class Broken(_Probed):
        async def probe(self) -> UpstreamHealth:
            raise OSError("boom")

    mon = HealthMonitor((("b", Broken("b")),))
    (h,) = asyncio.run(mon.snapshot())
    assert h.state is UpstreamState.DOWN and h.detail == "probe failed: OSError"


# -- the names a model answers to (issue 10) ----------------------------------------------------


def test_a_model_answers_to_its_aliases_in_any_case_and_is_listed_once() -> None:
    smol = ServedModel(name="SmolLM2-135M-Instruct", upstream=object(), aliases=(
        "HuggingFaceTB/SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2"))
    router = Router([smol])
    for name in ("SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct",
                 "huggingfacetb/smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf",
                 "smollm2"):
        assert router.route(name) is smol, name
    assert router.names == ("SmolLM2-135M-Instruct",)


def test_an_alias_two_models_claim_routes_to_neither() -> None:
    a = ServedModel(name="a", upstream=object(), aliases=("shared",))
    b = ServedModel(name="b", upstream=object(), aliases=("Shared", "b-only"))
    router = Router([a, b])
    assert router.route("b-only") is b and router.route("a") is a
    with pytest.raises(UnknownModel):
        router.route("shared")
