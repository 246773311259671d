"""Which upstream serves a request: client model names -> :class:`ServedModel`.

The gateway serves N models from M upstreams (DESIGN.md: N upstreams + M APIs). A request's
``model`` picks one :class:`ServedModel`; a request without ``model`` goes to the default,
which exists only when it is unambiguous (one model served, or one named in the config).
Unknown names are a 404 in the OpenAI error shape that lists what is served, so a client
with a typo learns the right name from the error instead of from the docs.

Each model knows where the ids of its Codec streams come from (``ids_source``, sent to
clients as ``Codec-Ids-Source``). When its upstream speaks text only and the model has a
map, :meth:`ServedModel.submit` wraps the upstream's stream in a
:class:`~tokenwire.gateway.retokenize.RetokenizingStream`: the one place between
upstreams and renderers where text becomes ids. Upstreams that return ids, and clients
that do not want ids, skip it. Then a :class:`~tokenwire.gateway.usage.MeteredStream`
completes the usage the upstream did not report (README "Usage").

"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tokenwire.codec.maps import TokenizerMap
from tokenwire.errors import ConfigError, InvalidRequest, UnknownModel
from tokenwire.gateway.context_window import certain_request_tokens, overflow_before_sending
from tokenwire.gateway.ir import (
    Event,
    EventStream,
    Failure,
    GenerationRequest,
    IdsSource,
    Upstream,
    fails_over,
    replica_of,
)
from tokenwire.gateway.usage import MeteredStream, PromptCounter, UsageMeter

__all__ = ["Router", "ServedModel"]



@dataclass(frozen=True)
class ServedModel:
    """One model clients may ask for.

    ``tmap`` is the map of its vocabulary (``Codec-Tokenizer-Map``), ``None`` when unknown;
    ``upstream_name`` is the configured upstream's name (``owned_by`` in ``/v1/models``).
    ``aliases`` are other names clients may send for it (the embedded engine's Hugging Face
    id and GGUF file name, say); ``/v1/models`` keeps one entry per model and lists them.
    ``max_model_len`` is its context length and ``context_source`` where that came from
    (``gateway/context_window.py``: configuration, the upstream's report, the engine).
    """

    name: str
    upstream: Upstream
    tmap: TokenizerMap | None = None
    max_model_len: int | None = None
    ids_source: IdsSource = IdsSource.NONE
    upstream_name: str = ""
    aliases: tuple[str, ...] = ()
    context_source: str = ""
    #: Counts usage the upstream does not report (``gateway/usage.py``); ``None`` for the
    #: embedded engine (it counts its own) and for models without a map.
    usage: PromptCounter | None = None

    def __post_init__(self) -> None:
        if self.ids_source is IdsSource.RETOKENIZED and self.tmap is None:
            raise ConfigError(f"model {self.name!r}: retokenized ids need a tokenizer map")

    @property
    def has_ids(self) -> bool:
        """True when Codec binary streams can be served for this model."""
        return self.ids_source is not IdsSource.NONE

    @property
    def accepts_images(self) -> bool:
        """False when the upstream says its model reads text only (the embedded engine);
        other upstreams decide for themselves."""
        return bool(getattr(self.upstream, "accepts_images", True))

    def preflight(self, request: GenerationRequest) -> Failure | None:
        """``context_length_exceeded`` when the prompt certainly does not fit this model's
        window (decided before sending, ``gateway/context_window.py``), else None."""
        if self.max_model_len is None or getattr(self.upstream, "checks_context_itself", False):
            return None  # unknown, or the upstream decides exactly and at once itself
        return overflow_before_sending(
            certain_request_tokens(request, self.tmap), self.max_model_len,
            max_tokens=request.max_tokens, source=self.context_source,
            max_tokens_binding=bool(getattr(self.upstream, "binds_max_tokens", False)))

    def submit(self, request: GenerationRequest, *,
               avoid: frozenset[str] = frozenset()) -> EventStream:
        """Start the generation on the upstream, adding ids from text when needed.
        ``avoid``: replicas of a pool (``routing/pool.py``) this request already failed on."""
        stream = self.upstream.submit(request, avoid=avoid) if avoid else \
            self.upstream.submit(request)
        attempt = stream
        replica = replica_of(stream)
        if request.want_ids and self.ids_source is IdsSource.RETOKENIZED:
            from tokenwire.gateway.retokenize import Retokenizer, RetokenizingStream

            assert self.tmap is not None  # checked in __post_init__
            stream = RetokenizingStream(stream, Retokenizer(self.tmap))
        if self.usage is not None:
            stream = MeteredStream(stream, UsageMeter(request, self.usage))
        if replica is not None and replica_of(stream) is None:
            stream = _Named(stream, attempt)
        return stream

    def can_fail_over(self, failure: Failure, avoid: frozenset[str],
                      request: GenerationRequest) -> bool:
        """True when another replica of this model's pool should get ``failure``'s request
        now (never for a single upstream)."""
        return fails_over(self.upstream, failure, avoid, request)


class _Named:
    """A wrapped replica stream that still names its replica and can still be failed
    (``fail``: the pool's attempt under the wrappers counts it) for the supervisor."""

    __slots__ = ("_attempt", "_inner")

    def __init__(self, inner: EventStream, attempt: Any) -> None:
        self._inner, self._attempt = inner, attempt

    @property
    def replica(self) -> object:
        return self._attempt.replica

    async def next_event(self) -> Event:
        return await self._inner.next_event()

    def cancel(self) -> None:
        self._inner.cancel()

    def fail(self, failure: Failure) -> None:
        self._attempt.fail(failure)  # first: the wrappers' cancel would end it as neutral
        self._inner.cancel()


class Router:
    """Client model name -> :class:`ServedModel`; see the module docstring."""

    def __init__(self, models: Iterable[ServedModel], *, default: str | None = None) -> None:
        self.models: tuple[ServedModel, ...] = tuple(models)
        if not self.models:
            raise ConfigError("no models to serve")
        self._by_name: dict[str, ServedModel] = {}
        for m in self.models:
            if m.name in self._by_name:
                raise ConfigError(f"model {m.name!r} is served twice; model names must be unique")
            self._by_name[m.name] = m
        self._by_alias = _alias_index(self.models)
        if default is not None and default not in self._by_name:
            raise ConfigError(f"default model {default!r} is not served; served: {self._listing}")
        if default is None and len(self.models) == 1:
            default = self.models[0].name
        self.default: ServedModel | None = self._by_name[default] if default else None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.models)

    @property
    def _listing(self) -> str:
        return ", ".join(repr(n) for n in self.names)

    def route(self, model: str | None) -> ServedModel:
        """The model a request names; the default when it names none."""
        if not model:
            if self.default is None:
                raise InvalidRequest(
                    f"model is required: this server serves {len(self.models)} models "
                    f"({self._listing})", param="model", code="missing_required_parameter")
            return self.default
        found = self._by_name.get(model) or self._by_alias.get(model.casefold())
        if found is None:
            raise UnknownModel(
                f"the model {model!r} does not exist on this server; served models: "
                f"{self._listing}")
        return found

    @property
    def primary(self) -> ServedModel:
        """The model whose map the server-wide routes use (``/tokenize``): the default, or
        the first one with a map."""
        if self.default is not None and self.default.tmap is not None:
            return self.default
        return next((m for m in self.models if m.tmap is not None), self.models[0])

    def maps(self) -> tuple[TokenizerMap, ...]:
        """Every distinct map served, in model order (published under ``/.well-known``)."""
        seen: dict[str, TokenizerMap] = {}
        for m in self.models:
            if m.tmap is not None:
                seen.setdefault(m.tmap.hash, m.tmap)
        return tuple(seen.values())

    def upstreams(self) -> tuple[tuple[str, Upstream], ...]:
        """Distinct upstream objects, each with its name, in model order."""
        seen: dict[int, tuple[str, Upstream]] = {}
        for m in self.models:
            seen.setdefault(id(m.upstream), (m.upstream_name or m.name, m.upstream))
        return tuple(seen.values())


def _alias_index(models: tuple[ServedModel, ...]) -> dict[str, ServedModel]:
    """Names and aliases, case-folded (``huggingfacetb/smollm2-135m-instruct`` is what some
    people type), to their model: the fallback after an exact name. A key two models claim
    names neither: a request must never reach a model it did not mean."""
    index: dict[str, ServedModel] = {}
    ambiguous: set[str] = set()
    for m in models:
        for key in {n.casefold() for n in (m.name, *m.aliases)}:
            if key in index and index[key] is not m:
                ambiguous.add(key)
            index.setdefault(key, m)
    return {k: m for k, m in index.items() if k not in ambiguous}
