"""Opt-in fallbacks between models: which failures move a request on, and to where (pure).

A model may list ``fallbacks`` (tried in order when it fails) and, separately,
``context_fallbacks`` (tried only when the prompt does not fit its context window: models
with a longer one). The supervisor (``gateway/supervision/supervisor.py``) keeps the one retry
loop: a model spends its own retry budget first (``supervision/retry.py``); only when that
gives up, and only before any output reached the client, does the request move to the next
model, with a fresh budget of its own. Nothing here does I/O or reads a clock.

**Which failures fall back** (:func:`fallback_kind`), read from the structured class only:

* ``fallbacks``: upstream 5xx (``upstream``, ``capacity``, ``timeout``: the no-response read
  timeout and the idle timeout before any output too), connection failures (reset, refused,
  DNS), 429 throttles once their budget is spent, and quota / usage limits (the primary's
  account is exhausted; another model is not). A malformed stream before output is an
  ``upstream`` failure: the primary is broken, the fallback may not be.
* ``context_fallbacks``: ``context_length_exceeded``, whether the upstream said so or the
  gateway knew before sending (``gateway/context_window.py``).
* **Never**: a failure the request itself caused (``invalid_request``, e.g. a parameter or a
  prompt the model rejects), ``authentication`` (a wrong key is a configuration error a
  fallback would hide on every request), ``content_filter`` (a fallback must not be a way
  around moderation) and ``internal`` (a gateway bug must be seen). These reach the client
  unchanged. LiteLLM also keeps context-window and content-policy fallbacks apart from the
  general list and falls back only after its retries; Portkey falls back on any non-2xx
  unless ``on_status_codes`` narrows it; OpenRouter's ``models`` list falls back on any
  error, moderation and context length included. tokenwire takes LiteLLM's split and
  refuses the moderation fallback (README "Fallbacks").

**Lists are explicit, not transitive.** A request to ``a`` tries exactly ``a``'s lists, never
the fallbacks of its fallbacks, so two models may back each other up (``a -> b`` and
``b -> a``: two providers of one model) without a loop. A model naming itself, a name twice
in one list, or an unknown model is a :class:`~tokenwire.errors.ConfigError` at start-up.

**Content that depends on the model** (:func:`incompatibility`): a request whose bytes mean
something only in one vocabulary (prompt ids, Codec frames of ids, banned ids) falls back
only to a model with the same tokenizer map; a request the target's upstream kind cannot
honour (tools, response formats, fields of another API: ``gateway/request_fields.py``) or
images for a text-only model is not sent there either. Such a target is skipped, and the
reason is named in the failure the client gets if no model served it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import msgspec

from tokenwire.errors import ConfigError
from tokenwire.gateway.ir import (
    ChatPrompt,
    Failure,
    FailureClass,
    GenerationRequest,
    ImagePart,
    PromptIds,
    kind_of,
)
from tokenwire.gateway.request_fields import refusal
from tokenwire.gateway.routing.router import ServedModel

__all__ = [
    "FALLBACK_CLASSES",
    "Candidate",
    "FallbackKind",
    "FallbackPlan",
    "FallbackTable",
    "fallback_kind",
    "incompatibility",
    "plan_for",
]


class FallbackKind(enum.StrEnum):
    """Which list a failure moves on through."""

    GENERAL = "fallbacks"
    CONTEXT = "context_fallbacks"


#: Failures the primary could not serve for reasons of its own (module docstring).
FALLBACK_CLASSES = frozenset({
    FailureClass.UPSTREAM, FailureClass.CAPACITY, FailureClass.TIMEOUT,
    FailureClass.CONNECTION, FailureClass.RATE_LIMITED, FailureClass.QUOTA,
})


def fallback_kind(failure: Failure) -> FallbackKind | None:
    """The list ``failure`` falls back through, or None when it goes to the client as is."""
    if failure.failure_class is FailureClass.CONTEXT_LENGTH:
        return FallbackKind.CONTEXT
    if failure.failure_class in FALLBACK_CLASSES:
        return FallbackKind.GENERAL
    return None


@dataclass(frozen=True)
class FallbackTable:
    """The configured lists: model name -> the models it falls back to, in order."""

    general: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    context: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.general or self.context)

    def lists(self, model: str) -> dict[FallbackKind, tuple[str, ...]]:
        return {FallbackKind.GENERAL: tuple(self.general.get(model, ())),
                FallbackKind.CONTEXT: tuple(self.context.get(model, ()))}

    def problems(self, served: Iterable[str] | None = None) -> list[str]:
        """Every mistake in the lists; ``served`` (the model names) also checks that each
        name exists. Empty when the table is usable."""
        known = None if served is None else set(served)
        out: list[str] = []
        for kind, table in ((FallbackKind.GENERAL, self.general),
                            (FallbackKind.CONTEXT, self.context)):
            for model, targets in table.items():
                where = f"{kind.value} of {model!r}"
                if known is not None and model not in known:
                    out.append(f"{where}: {model!r} is not a served model; served: "
                               + ", ".join(sorted(known)))
                if model in targets:
                    out.append(f"{where}: a model cannot fall back to itself")
                seen: set[str] = set()
                for target in targets:
                    if target in seen:
                        out.append(f"{where}: {target!r} is listed twice")
                    seen.add(target)
                    if known is not None and target not in known:
                        out.append(f"{where}: {target!r} is not a served model; served: "
                                   + ", ".join(sorted(known)))
        return out

    def validate(self, served: Iterable[str] | None = None) -> None:
        problems = self.problems(served)
        if problems:
            raise ConfigError("; ".join(problems))


@dataclass(frozen=True)
class Candidate:
    """A model to fall back to, with the request as that model must receive it."""

    served: ServedModel
    request: GenerationRequest


@dataclass(frozen=True)
class FallbackPlan:
    """What one request may fall back to, decided before it starts (the request does not
    change while it runs): compatible candidates per list, and the targets skipped with why."""

    candidates: Mapping[FallbackKind, tuple[Candidate, ...]]
    #: Every configured target per list, compatible or not (for :meth:`skipped_note`).
    listed: Mapping[FallbackKind, tuple[str, ...]] = field(default_factory=dict)
    skipped: tuple[tuple[str, str], ...] = ()

    def next_for(self, failure: Failure, tried: set[str]) -> Candidate | None:
        """The first untried candidate of the list ``failure`` falls back through."""
        kind = fallback_kind(failure)
        if kind is None:
            return None
        return next((c for c in self.candidates.get(kind, ()) if c.served.name not in tried),
                    None)

    def skipped_note(self, failure: Failure) -> str:
        """A clause for the client's failure message naming the targets of ``failure``'s list
        that this request could not be sent to ("" when none was skipped)."""
        kind = fallback_kind(failure)
        names = self.listed.get(kind, ()) if kind is not None else ()
        notes = [f"{name!r} {why}" for name, why in self.skipped if name in names]
        return ("; not tried as fallbacks: " + "; ".join(notes)) if notes else ""


def _ids_bound(request: GenerationRequest) -> bool:
    """True when the request's bytes mean something only in its model's vocabulary."""
    return isinstance(request.prompt, PromptIds) or request.want_ids or bool(request.banned_ids)


def _has_images(request: GenerationRequest) -> bool:
    if not isinstance(request.prompt, ChatPrompt):
        return False
    return any(isinstance(p, ImagePart) for m in request.prompt.messages
               if not isinstance(m.content, str) for p in m.content)


def incompatibility(primary: ServedModel, target: ServedModel,
                    request: GenerationRequest) -> str | None:
    """Why ``target`` cannot serve ``request`` meant for ``primary`` (None: it can)."""
    if _ids_bound(request):
        p_hash = primary.tmap.hash if primary.tmap is not None else None
        t_hash = target.tmap.hash if target.tmap is not None else None
        if p_hash is None or p_hash != t_hash:
            return ("has a different tokenizer map, and this request's token ids belong to "
                    f"{primary.name!r}'s")
        if request.want_ids and not target.has_ids:
            return "cannot return token ids"
    kind = kind_of(target.upstream)
    refused = refusal(request, kind)
    if refused is not None:
        return f"cannot honour {refused.param or 'a field of this request'} ({kind} upstream)"
    if _has_images(request) and not target.accepts_images:
        return "reads text only, and this request has images"
    return None


def _for_target(target: ServedModel, request: GenerationRequest) -> GenerationRequest:
    """The request as ``target`` receives it: its own name (upstreams map it to theirs),
    ``max_tokens`` within its window, and never the client's exact bytes (they name the
    primary: ``passthrough_body`` is for a model served under the client's own name, and
    ``client_body``'s signed thinking is for the primary's upstream)."""
    max_tokens = request.max_tokens
    if max_tokens is not None and target.max_model_len is not None:
        max_tokens = min(max_tokens, target.max_model_len)
    return msgspec.structs.replace(request, model=target.name, max_tokens=max_tokens,
                                   passthrough_body=None, client_body=None)


def plan_for(table: FallbackTable, models: Mapping[str, ServedModel], primary: ServedModel,
             request: GenerationRequest) -> FallbackPlan | None:
    """The fallback plan of ``request`` to ``primary``; None when it lists no fallback."""
    lists = table.lists(primary.name)
    if not any(lists.values()):
        return None
    candidates: dict[FallbackKind, tuple[Candidate, ...]] = {}
    skipped: dict[str, str] = {}
    for kind, names in lists.items():
        kept = []
        for name in names:
            target = models[name]
            why = incompatibility(primary, target, request)
            if why is None:
                kept.append(Candidate(target, _for_target(target, request)))
            else:
                skipped[name] = why
        candidates[kind] = tuple(kept)
    return FallbackPlan(candidates=candidates, listed=lists, skipped=tuple(skipped.items()))
