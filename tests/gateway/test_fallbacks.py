"""Opt-in fallbacks between models (issue 13): the pure rules, the supervisor, the config.

The supervisor runs on a ``looptime`` loop over in-memory scripted models (the scripts of
``test_supervisor.py``); the same behaviour over real sockets and the three client APIs is
the fault table with a fallback (``tests/gateway/faults``), and ``test_fallbacks_e2e.py``
runs the ``openai`` and ``anthropic`` SDKs against a gateway that falls back.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from tokenwire.codec.maps import bundled_map_path, load_map_file
from tokenwire.errors import ConfigError
from tokenwire.gateway.config import parse_config, with_fallback_flags
from tokenwire.gateway.ir import (
    ChatMessage,
    ChatPrompt,
    Failure,
    FailureClass,
    Finish,
    GenerationRequest,
    Heartbeat,
    IdsSource,
    ImagePart,
    PromptIds,
    PromptText,
    ResponseMeta,
    TextPart,
    TokenDelta,
    ToolSpec,
    Usage,
)
from tokenwire.gateway.routing.fallbacks import (
    FALLBACK_CLASSES,
    Candidate,
    FallbackKind,
    FallbackPlan,
    FallbackTable,
    fallback_kind,
    incompatibility,
    plan_for,
)
from tokenwire.gateway.routing.router import ServedModel
from tokenwire.gateway.supervision.admission import Admission
from tokenwire.gateway.supervision.supervisor import SupervisedStream, Timing

from .test_supervisor import EOS, REQUEST, Script, collect, fail, now, scenario, tokens

SMOL = load_map_file(bundled_map_path("huggingfacetb/smollm2"))


# -- which failures fall back ----------------------------------------------------------------


@pytest.mark.parametrize("cls", list(FailureClass))
def test_each_failure_class_has_one_documented_fate(cls: FailureClass) -> None:
    kind = fallback_kind(fail(cls, 500))
    if cls is FailureClass.CONTEXT_LENGTH:
        assert kind is FallbackKind.CONTEXT
    elif cls in FALLBACK_CLASSES:
        assert kind is FallbackKind.GENERAL
    else:  # caused by the request, a key, moderation, or the gateway: to the client as is
        assert cls in {FailureClass.INVALID_REQUEST, FailureClass.AUTHENTICATION,
                       FailureClass.CONTENT_FILTER, FailureClass.INTERNAL}
        assert kind is None


def test_the_table_refuses_self_duplicates_and_unknown_models() -> None:
    table = FallbackTable(general={"a": ("a", "b", "b")}, context={"a": ("zzz",)})
    problems = table.problems(["a", "b"])
    assert any("cannot fall back to itself" in p for p in problems)
    assert any("'b' is listed twice" in p for p in problems)
    assert any("'zzz' is not a served model" in p for p in problems)
    with pytest.raises(ConfigError, match="itself"):
        table.validate(["a", "b"])


def test_two_models_may_back_each_other_up() -> None:
    """Lists are not transitive: a -> b and b -> a is two providers of one model, not a loop."""
    FallbackTable(general={"a": ("b",), "b": ("a",)}).validate(["a", "b"])


# -- compatibility ---------------------------------------------------------------------------


class _Kind:
    def __init__(self, kind: str, images: bool = True) -> None:
        self.kind, self.accepts_images, self.model_id = kind, images, "x"


def _model(name: str, *, tmap: Any = SMOL, kind: str = "openai", images: bool = True,
           ids: IdsSource = IdsSource.UPSTREAM, max_len: int | None = None) -> ServedModel:
    return ServedModel(name=name, upstream=_Kind(kind, images), tmap=tmap,  # type: ignore[arg-type]
                       ids_source=ids if tmap is not None or ids is IdsSource.NONE
                       else IdsSource.NONE, max_model_len=max_len)


OTHER_MAP = load_map_file("tests/fixtures/maps/microsoft/phi-3.json")


def test_prompt_ids_fall_back_only_to_the_same_map() -> None:
    req = GenerationRequest(prompt=PromptIds(ids=(1, 2, 3)))
    assert incompatibility(_model("a"), _model("b"), req) is None
    why = incompatibility(_model("a"), _model("c", tmap=OTHER_MAP), req)
    assert why is not None and "different tokenizer map" in why
    assert incompatibility(_model("a"), _model("d", tmap=None), req) is not None


def test_a_codec_stream_of_ids_needs_the_same_map_even_for_a_text_prompt() -> None:
    req = GenerationRequest(prompt=PromptText(text="hi"), want_ids=True, want_text=False)
    assert incompatibility(_model("a"), _model("c", tmap=OTHER_MAP), req) is not None
    text = GenerationRequest(prompt=PromptText(text="hi"))
    assert incompatibility(_model("a"), _model("c", tmap=OTHER_MAP), text) is None


def test_tools_go_only_where_the_upstream_kind_honours_them() -> None:
    req = GenerationRequest(prompt=ChatPrompt(messages=(ChatMessage(role="user",
                                                                    content="hi"),)),
                            tools=(ToolSpec(name="f", parameters={"type": "object"}),),
                            api="chat")
    assert incompatibility(_model("a"), _model("b", kind="openai"), req) is None
    why = incompatibility(_model("a"), _model("b", kind="embedded"), req)
    # Whatever the embedded engine decides for tools, the answer is refusal()'s own.
    from tokenwire.gateway.request_fields import refusal
    assert (why is None) == (refusal(req, "embedded") is None)


def test_images_never_go_to_a_text_only_model() -> None:
    req = GenerationRequest(prompt=ChatPrompt(messages=(ChatMessage(role="user", content=(
        TextPart(text="what is it"), ImagePart(url="data:image/png;base64,AA=="))),)))
    why = incompatibility(_model("a"), _model("b", images=False), req)
    assert why is not None and "text only" in why


def test_the_plan_prepares_each_target_request_and_names_the_skipped() -> None:
    models = {"a": _model("a"), "b": _model("b", max_len=100),
              "c": _model("c", tmap=OTHER_MAP)}
    table = FallbackTable(general={"a": ("c", "b")})
    req = GenerationRequest(prompt=PromptIds(ids=(5,)), model="a", max_tokens=4096,
                            passthrough_body=b'{"model": "a"}')
    plan = plan_for(table, models, models["a"], req)
    assert plan is not None
    (only,) = plan.candidates[FallbackKind.GENERAL]
    assert only.served.name == "b"
    assert (only.request.model, only.request.max_tokens, only.request.passthrough_body) == (
        "b", 100, None)
    note = plan.skipped_note(fail(FailureClass.CAPACITY, 503))
    assert "'c' has a different tokenizer map" in note
    assert plan.skipped_note(fail(FailureClass.CONTEXT_LENGTH, 400)) == ""
    assert plan_for(table, models, models["b"], req) is None  # b lists nothing


# -- the supervisor --------------------------------------------------------------------------


@dataclass
class Model(Script):
    """A scripted model with a name (and, optionally, a preflight refusal)."""

    name: str = "m"
    refuse: Failure | None = None
    requests: list[GenerationRequest] = field(default_factory=list)

    def submit(self, request: GenerationRequest) -> Any:
        self.requests.append(request)
        return super().submit(request)

    def preflight(self, request: GenerationRequest) -> Failure | None:
        return self.refuse


class Observer:
    def __init__(self) -> None:
        self.fallbacks: list[tuple[str, str, str, str]] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None

    def fallback(self, from_model: str, to_model: str, reason: str, upstream: str) -> None:
        self.fallbacks.append((from_model, to_model, reason, upstream))


def _plan(*targets: Model, context: tuple[Model, ...] = ()) -> FallbackPlan:
    def cands(ms: tuple[Model, ...]) -> tuple[Candidate, ...]:
        return tuple(Candidate(m, REQUEST) for m in ms)  # type: ignore[arg-type]
    return FallbackPlan(candidates={FallbackKind.GENERAL: cands(targets),
                                    FallbackKind.CONTEXT: cands(context)},
                        listed={FallbackKind.GENERAL: tuple(m.name for m in targets),
                                FallbackKind.CONTEXT: tuple(m.name for m in context)})


_TIMING = Timing()


def _supervise(primary: Model, plan: FallbackPlan | None, *, timing: Timing = _TIMING,
               observer: Any = None) -> SupervisedStream:
    ticket = Admission().reserve(now())
    assert ticket is not None
    return SupervisedStream(primary, REQUEST, ticket, timing=timing, rng=random.Random(1),
                            fallbacks=plan, observer=observer)


def _events(out: list[tuple[float, Any]]) -> list[Any]:
    return [e for _, e in out if not isinstance(e, Heartbeat)]


def test_after_the_primary_budget_the_fallback_serves_and_none_of_the_primary_facts_leak():
    async def go():
        primary = Model([[(0.0, ResponseMeta(turn_state="primary-state")),
                          (0.0, Usage(prompt_tokens=99, completion_tokens=None)),
                          (0.0, fail(FailureClass.CAPACITY, 503))]], name="m")
        fb = Model([[*tokens("from", " f"),
                     (0.0, Usage(prompt_tokens=7, completion_tokens=2)), (0.0, EOS)]], name="f")
        obs = Observer()
        stream = _supervise(primary, _plan(fb), observer=obs)
        out = await collect(stream)
        return out, primary, fb, obs, stream
    out, primary, fb, obs, stream = scenario(go)
    events = _events(out)
    assert len(primary.started_at) == 2  # its own single retry first
    assert fb.started_at == [pytest.approx(1.0)]
    assert events[0] == ResponseMeta(model="f")
    assert [e.text for e in events if isinstance(e, TokenDelta)] == ["from", " f"]
    assert [e for e in events if isinstance(e, Usage)] == [Usage(prompt_tokens=7,
                                                                 completion_tokens=2)]
    assert not any(isinstance(e, ResponseMeta) and e.turn_state for e in events)
    assert isinstance(events[-1], Finish)
    assert obs.fallbacks == [("m", "f", "capacity", "f")]
    assert stream.fallbacks == [("m", "f", "capacity")]
    assert dict(stream.served_headers())["Tokenwire-Served-Model"] == "f"
    assert dict(stream.served_headers())["Tokenwire-Fallback"] == "m;to=f;reason=capacity"


def test_never_after_output() -> None:
    async def go():
        primary = Model([[*tokens("half"), (0.0, fail(FailureClass.UPSTREAM, 502))]])
        fb = Model([[*tokens("x"), (0.0, EOS)]], name="f")
        return await collect(_supervise(primary, _plan(fb))), fb
    out, fb = scenario(go)
    assert isinstance(out[-1][1], Failure) and fb.started_at == []
    assert [e.text for e in _events(out) if isinstance(e, TokenDelta)] == ["half"]


@pytest.mark.parametrize("cls", [FailureClass.INVALID_REQUEST, FailureClass.AUTHENTICATION,
                                 FailureClass.CONTENT_FILTER])
def test_a_failure_the_request_caused_reaches_the_client_unchanged(cls: FailureClass) -> None:
    refused = fail(cls, 400, code="nope")

    async def go():
        primary = Model([[(0.0, refused)]])
        fb = Model([[*tokens("x"), (0.0, EOS)]], name="f")
        return await collect(_supervise(primary, _plan(fb))), fb
    out, fb = scenario(go)
    assert out[-1][1] == refused and fb.started_at == []


def test_when_every_model_fails_the_client_gets_the_primary_failure() -> None:
    primary_failure = fail(FailureClass.CAPACITY, 503, code="primary_busy")

    async def go():
        primary = Model([[(0.0, primary_failure)]])
        fb = Model([[(0.0, fail(FailureClass.INVALID_REQUEST, 400, code="no_prefill"))]],
                   name="f")
        return await collect(_supervise(primary, _plan(fb))), fb
    out, fb = scenario(go)
    assert out[-1][1] == primary_failure
    assert len(fb.started_at) == 1
    assert not any(isinstance(e, ResponseMeta) for e in _events(out))


def test_a_certain_overflow_goes_to_the_context_fallback_without_an_attempt() -> None:
    overflow = fail(FailureClass.CONTEXT_LENGTH, 400, code="context_length_exceeded")

    async def go():
        primary = Model([[*tokens("never"), (0.0, EOS)]], refuse=overflow)
        general = Model([[*tokens("wrong"), (0.0, EOS)]], name="g")
        long = Model([[*tokens("long"), (0.0, EOS)]], name="long")
        out = await collect(_supervise(primary, _plan(general, context=(long,))))
        return out, primary, general, long
    out, primary, general, _long = scenario(go)
    assert primary.started_at == [] and general.started_at == []
    assert [e.text for e in _events(out) if isinstance(e, TokenDelta)] == ["long"]


def test_an_upstream_overflow_uses_only_the_context_list() -> None:
    async def go():
        primary = Model([[(0.0, fail(FailureClass.CONTEXT_LENGTH, 400))]])
        general = Model([[*tokens("wrong"), (0.0, EOS)]], name="g")
        return await collect(_supervise(primary, _plan(general))), general
    out, general = scenario(go)
    assert isinstance(out[-1][1], Failure) and general.started_at == []


def test_silence_before_any_output_falls_back_at_the_idle_timeout() -> None:
    async def go():
        primary = Model([[(float("inf"), EOS)]])
        fb = Model([[*tokens("awake"), (0.0, EOS)]], name="f")
        out = await collect(_supervise(primary, _plan(fb), timing=Timing(idle_timeout_s=60)))
        return out, fb
    out, fb = scenario(go)
    assert fb.started_at == [pytest.approx(60.0)]
    assert isinstance(out[-1][1], Finish)


def test_without_a_plan_the_idle_timeout_is_final_as_before() -> None:
    async def go():
        return await collect(_supervise(Model([[(float("inf"), EOS)]]), None,
                                        timing=Timing(idle_timeout_s=60)))
    out = scenario(go)
    assert out[-1][1].code == "idle_timeout"


def test_a_prompt_count_a_heartbeat_released_is_replaced_by_the_fallback_s() -> None:
    """A heartbeat opens the stream with the primary's held prompt count; a fallback that
    reports no usage must not leave that count as the answer's (renderers keep the last)."""
    async def go():
        primary = Model([[(0.0, Usage(prompt_tokens=99, completion_tokens=None)),
                          (20.0, fail(FailureClass.CAPACITY, 503))]])
        fb = Model([[*tokens("ok"), (0.0, EOS)]], name="f")
        return await collect(_supervise(primary, _plan(fb)))
    events = _events(scenario(go))
    usages = [e for e in events if isinstance(e, Usage)]
    assert usages[0].prompt_tokens == 99  # went early, with the heartbeat (as before)
    assert usages[-1] == Usage(prompt_tokens=None, completion_tokens=None)


class _Charges(Observer):
    """Records the usage the request is charged with (the record keeps the last one)."""

    def __init__(self) -> None:
        super().__init__()
        self.charged: tuple[int | None, int | None] | None = None

    def usage(self, prompt_tokens: int | None, completion_tokens: int | None,
              source: str | None = None) -> None:
        self.charged = (prompt_tokens, completion_tokens)


@pytest.mark.parametrize("quiet_s", [0.0, 20.0])  # 20 s: a heartbeat shows the count first
def test_a_fallback_that_reports_no_usage_is_not_charged_the_primary_s_count(
        quiet_s: float) -> None:
    """Per-key ``tpm`` charges the usage the client was shown (``state/limits.py``), which
    the observer keeps (the last one wins). The primary counted its prompt (99), then
    failed; the fallback that served reports no usage. The client is shown no count (or the
    released one replaced by an unknown one), so the request is charged what it streamed,
    never the failed model's count. Before, the record kept 99 for the fallback's answer."""
    async def go():
        primary = Model([[(0.0, Usage(prompt_tokens=99, completion_tokens=None)),
                          (quiet_s, fail(FailureClass.CAPACITY, 503))]])
        fb = Model([[*tokens("ok"), (0.0, EOS)]], name="f")
        obs = _Charges()
        out = await collect(_supervise(primary, _plan(fb), observer=obs))
        return out, obs
    out, obs = scenario(go)
    assert [e.text for e in _events(out) if isinstance(e, TokenDelta)] == ["ok"]
    shown = [e for e in _events(out) if isinstance(e, Usage)]
    assert not shown or shown[-1] == Usage(prompt_tokens=None, completion_tokens=None)
    assert obs.charged == (None, None)


def test_a_fallback_on_another_upstream_waits_for_its_slot() -> None:
    """The admission queue stays the one place where requests wait: the primary's slot is
    given back and the fallback's upstream is asked for one."""
    async def go():
        admission = Admission(max_concurrent=4, limits={})
        primary = Model([[(0.0, fail(FailureClass.CONNECTION, 502,
                                     code="connection_refused"))]])
        fb = Model([[*tokens("ok"), (0.0, EOS)]], name="f")
        ticket = admission.reserve(now())
        assert ticket is not None
        seen: list[object] = []
        real = admission.enqueue

        def enqueue(t: Any, upstream: object) -> Any:
            seen.append(upstream)
            return real(t, upstream)
        admission.enqueue = enqueue  # type: ignore[method-assign]
        stream = SupervisedStream(primary, REQUEST, ticket, fallbacks=_plan(fb))
        await collect(stream)
        return seen, primary, fb, admission
    seen, primary, fb, admission = scenario(go)
    assert seen == [primary.upstream, fb.upstream]
    assert admission.running == 0


# -- configuration ---------------------------------------------------------------------------


def _doc(**extra: Any) -> dict[str, Any]:
    ups = [{"name": "u1", "kind": "openai", "base_url": "http://127.0.0.1:9/v1",
            "models": [{"name": "a"}, {"name": "b"}, {"name": "long"}]}]
    return {"upstreams": ups, **extra}


def test_the_config_file_declares_both_lists() -> None:
    cfg = parse_config(_doc(fallbacks={"a": ["b"]}, context_fallbacks={"a": ["long"]}),
                       env={})
    assert cfg.fallbacks == FallbackTable(general={"a": ("b",)}, context={"a": ("long",)})
    assert not parse_config(_doc(), env={}).fallbacks  # none configured: none


@pytest.mark.parametrize(("extra", "message"), [
    ({"fallbacks": {"a": ["a"]}}, "cannot fall back to itself"),
    ({"fallbacks": {"a": ["nope"]}}, "'nope' is not a served model"),
    ({"context_fallbacks": {"ghost": ["a"]}}, "'ghost' is not a served model"),
    ({"fallbacks": {"a": "b"}}, "must be an array of model names"),
    ({"fallbacks": {"a": ["b", "b"]}}, "listed twice"),
])
def test_the_config_file_refuses_bad_lists(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(_doc(**extra), env={})


def test_flags_replace_a_model_list_and_are_checked_the_same_way() -> None:
    cfg = parse_config(_doc(fallbacks={"a": ["b"]}), env={})
    cfg = with_fallback_flags(cfg, ["a=long,b"], ["b=long"])
    assert cfg is not None
    assert cfg.fallbacks.general == {"a": ("long", "b")}
    assert cfg.fallbacks.context == {"b": ("long",)}
    with pytest.raises(ConfigError, match="expects MODEL=OTHER"):
        with_fallback_flags(cfg, ["a"], [])
    with pytest.raises(ConfigError, match="itself"):
        with_fallback_flags(cfg, [], ["long=long"])
    with pytest.raises(ConfigError, match="need upstreams"):
        with_fallback_flags(None, ["a=b"], [])


def test_probed_models_are_checked_when_the_gateway_is_built() -> None:
    """An upstream without declared models is probed: its names are known only then, so the
    state refuses an unknown fallback at start-up instead."""
    from tokenwire.gateway.http.state import GatewayState
    from tokenwire.gateway.routing.router import Router
    from tokenwire.gateway.settings import ServerSettings

    router = Router([_model("a"), _model("b")])
    GatewayState(settings=ServerSettings(), router=router,
                 fallbacks=FallbackTable(general={"a": ("b",)}))
    with pytest.raises(ConfigError, match="'c' is not a served model"):
        GatewayState(settings=ServerSettings(), router=router,
                     fallbacks=FallbackTable(general={"a": ("c",)}))


def test_no_probe_keeps_the_file_s_fallbacks(tmp_path: Any) -> None:
    """``--config FILE --no-probe`` rebuilt the configuration without its fallbacks (the
    rebuild listed GatewayConfig's fields by hand), so they silently vanished."""
    from tokenwire.gateway.config import resolve

    path = tmp_path / "gw.toml"
    path.write_text('[[upstreams]]\nname = "u1"\nkind = "openai"\n'
                    'base_url = "http://127.0.0.1:9/v1"\n'
                    '[[upstreams.models]]\nname = "a"\n[[upstreams.models]]\nname = "b"\n'
                    '[fallbacks]\na = ["b"]\n')
    cfg = resolve(config_path=str(path), probe=False, env={})
    assert cfg is not None
    assert cfg.fallbacks.general == {"a": ("b",)}
    assert cfg.no_probe == frozenset({"u1"})


def test_serve_flags_reach_the_configuration(tmp_path: Any) -> None:
    """``tokenwire serve --config F --fallback a=b --context-fallback a=long``."""
    import argparse

    from tokenwire.cli import serve as serve_cmd

    path = tmp_path / "gw.toml"
    path.write_text('[[upstreams]]\nname = "u1"\nkind = "openai"\n'
                    'base_url = "http://127.0.0.1:9/v1"\n[[upstreams.models]]\nname = "a"\n'
                    '[[upstreams.models]]\nname = "b"\n[[upstreams.models]]\nname = "long"\n')
    parser = argparse.ArgumentParser()
    serve_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["serve", "--config", str(path), "--fallback", "a=b",
                              "--context-fallback", "a=long"])
    cfg = serve_cmd.gateway_config_from_args(args, env={})
    assert cfg is not None
    assert cfg.fallbacks == FallbackTable(general={"a": ("b",)}, context={"a": ("long",)})
    bad = parser.parse_args(["serve", "--config", str(path), "--fallback", "a=ghost"])
    with pytest.raises(ConfigError, match="'ghost' is not a served model"):
        serve_cmd.gateway_config_from_args(bad, env={})
