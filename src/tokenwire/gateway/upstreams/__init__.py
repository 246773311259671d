"""Upstream adapters: each turns one engine's output into IR events (``gateway.ir``).

``ADAPTERS`` maps an upstream ``kind`` (``upstreams/base.py``) to its adapter class, found
by importing the adapter modules that exist: an adapter plugs in by being a module here
with a class whose ``kind`` attribute names its kind and which has ``from_config``; no
registry edit is needed. A module that exists but fails to import is not skipped in
silence: its error is kept in ``ADAPTER_ERRORS`` and shown when a config asks for the kind.

The embedded engine predates the adapter contract; :class:`EmbeddedUpstream` is its thin
``from_config`` / ``probe`` / ``aclose`` wrapper, so a config file can mix it with remote
upstreams.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenwire.codec.maps import TokenizerMap, bundled_map_path, load_map_file, resolve_alias
from tokenwire.errors import ConfigError
from tokenwire.gateway.ir import EventStream, GenerationRequest, IdsSource
from tokenwire.gateway.upstreams.base import (
    UpstreamConfig,
    UpstreamHealth,
    UpstreamState,
    unknown_option,
)

__all__ = ["ADAPTERS", "ADAPTER_ERRORS", "EmbeddedUpstream", "adapter_for", "check_embedded_int",
           "check_options"]

log = logging.getLogger(__name__)

#: kind -> module under ``tokenwire.gateway.upstreams`` that implements it.
_MODULES: dict[str, str] = {
    "openai": "openai_compat",
    "codec": "codec_native",
    "responses": "responses_upstream",
    "anthropic": "anthropic_upstream",
}
#: The embedded engine's bundled map, used when its config names none.
EMBEDDED_MAP_ID = "huggingfacetb/smollm2"
#: The largest embedded ``n_ctx``: llama.cpp allocates the KV cache for the whole window at
#: start, and no GGUF we serve is trained past 2^20 tokens (a typo with extra digits would
#: otherwise try to allocate it).
MAX_N_CTX = 1 << 20
#: ggml's ``GGML_MAX_N_THREADS``: llama.cpp cannot run more threads than this.
MAX_THREADS = 512
#: Requests waiting behind the running one; 0 would make the engine's queue unbounded
#: (``queue.Queue(maxsize=0)``). At ~70 tokens/s, 1024 queued answers is hours of waiting.
MAX_QUEUE_SIZE = 1024
#: ``[upstreams.options]`` of an embedded upstream: the integer ones with their ranges.
_EMBEDDED_INTS = {"n_ctx": (1, MAX_N_CTX), "threads": (1, MAX_THREADS),
                  "queue_size": (1, MAX_QUEUE_SIZE)}
_EMBEDDED_OPTIONS = ("model_path", *_EMBEDDED_INTS)
#: Option name -> ``EmbeddedEngine.load`` argument, where they differ.
_LOAD_ARGS = {"threads": "n_threads"}


def check_embedded_int(key: str, value: object, name: str) -> None:
    """An embedded engine's ``n_ctx``, ``threads`` or ``queue_size`` in its range, from
    ``[upstreams.options]`` or a bare ``tokenwire serve``'s flags (``name`` says which)."""
    low, high = _EMBEDDED_INTS[key]
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigError(f"{name} must be an integer from {low} to {high}, not {value!r}")


class EmbeddedUpstream:
    """The in-process llama.cpp engine as a configured upstream (one model)."""

    kind = "embedded"
    ids_source = IdsSource.ENGINE
    max_concurrent = 1  # one worker thread owns the model (see EmbeddedEngine)
    checks_context_itself = True  # the engine counts its prompt exactly (EmbeddedEngine)

    def __init__(self, name: str, engine: Any, tmap: TokenizerMap) -> None:
        self.name = name
        self.engine = engine
        self.tmap = tmap

    @property
    def model_id(self) -> str:
        return str(self.engine.model_id)

    @property
    def n_ctx(self) -> int:
        return int(self.engine.n_ctx)

    @property
    def aliases(self) -> tuple[str, ...]:
        return tuple(getattr(self.engine, "aliases", ()))

    def tmap_for(self, model: str) -> TokenizerMap:
        """The engine's map for its one model: a configured embedded upstream serves ids
        with the bundled map exactly as the default ``tokenwire serve`` does."""
        return self.tmap

    @classmethod
    def from_config(
        cls, config: UpstreamConfig, *, transport: Any = None,
        maps: Mapping[str, TokenizerMap] | None = None,
    ) -> EmbeddedUpstream:
        """Load the GGUF (``options.model_path``, default the bundled SmolLM2) and start it.

        Options: ``model_path``, ``n_ctx``, ``threads``, ``queue_size``.
        """
        del transport  # in-process: no HTTP
        from tokenwire.gateway.upstreams.embedded import EmbeddedEngine

        if len(config.models) > 1:
            raise ConfigError(f"upstream {config.name!r}: an embedded engine serves one model")
        route = config.models[0] if config.models else None
        tmap = (maps or {}).get(route.name) if route else None
        if tmap is None:
            tmap = load_map_file(bundled_map_path(resolve_alias(EMBEDDED_MAP_ID)))
        opts = cls.parse_options(config.name, config.options)  # before the model loads
        # The engine's own defaults (embedded.py) for what the config leaves out.
        kwargs: dict[str, Any] = {_LOAD_ARGS.get(k, k): v for k, v in opts.items()}
        if route is not None:
            kwargs["model_id"] = route.name
        engine = EmbeddedEngine.load(tmap, **kwargs)
        engine.start()
        return cls(config.name, engine, tmap)

    @staticmethod
    def parse_options(upstream: str, options: Mapping[str, object]) -> dict[str, Any]:
        """``[upstreams.options]`` checked, when the config is read and by ``from_config``
        before the model loads: ``model_path`` names a file; ``n_ctx``, ``threads`` and
        ``queue_size`` are integers in their ranges. Another key or value is a
        :class:`ConfigError` naming the upstream, the key and what it may be."""
        for key, value in options.items():
            if key not in _EMBEDDED_OPTIONS:
                raise unknown_option("embedded", upstream, key, _EMBEDDED_OPTIONS)
            if key == "model_path":
                if not isinstance(value, str) or not Path(value).is_file():
                    raise ConfigError(f"upstream {upstream!r}: options.model_path must name "
                                      f"a GGUF file; {value!r} is not a file")
                continue
            check_embedded_int(key, value, f"upstream {upstream!r}: options.{key}")
        return dict(options)

    def submit(self, request: GenerationRequest) -> EventStream:
        return self.engine.submit(request)

    async def probe(self) -> UpstreamHealth:
        alive = self.engine._thread.is_alive()
        return UpstreamHealth(
            name=self.name, kind=self.kind,
            state=UpstreamState.UP if alive else UpstreamState.DOWN,
            models=(self.model_id,), detail="" if alive else "the engine thread has stopped")

    async def aclose(self) -> None:
        await asyncio.to_thread(self.engine.close)


def _find_adapter(module: Any, kind: str) -> type | None:
    for value in vars(module).values():
        if (isinstance(value, type) and getattr(value, "kind", None) == kind
                and hasattr(value, "from_config") and value.__module__ == module.__name__):
            return value
    return None


def _discover() -> tuple[dict[str, type], dict[str, str]]:
    adapters: dict[str, type] = {"embedded": EmbeddedUpstream}
    errors: dict[str, str] = {}
    for kind, name in _MODULES.items():
        full = f"{__name__}.{name}"
        if importlib.util.find_spec(full) is None:
            continue  # not written (yet): the kind is reported as unavailable
        try:
            module = importlib.import_module(full)
        except Exception as exc:  # keep the reason for the config error, do not hide it
            log.warning("upstream adapter %s failed to import: %s", full, exc)
            errors[kind] = f"{full} failed to import: {type(exc).__name__}: {exc}"
            continue
        cls = _find_adapter(module, kind)
        if cls is None:
            errors[kind] = f"{full} has no class with kind = {kind!r} and from_config()"
        else:
            adapters[kind] = cls
    return adapters, errors


ADAPTERS, ADAPTER_ERRORS = _discover()


def adapter_for(kind: str, adapters: Mapping[str, type] | None = None) -> type:
    """The adapter class for ``kind``, or a :class:`ConfigError` saying why there is none."""
    table = ADAPTERS if adapters is None else adapters
    if kind in table:
        return table[kind]
    if kind in ADAPTER_ERRORS:
        raise ConfigError(f"upstream kind {kind!r} is unavailable: {ADAPTER_ERRORS[kind]}")
    raise ConfigError(f"upstream kind {kind!r} is not available in this installation")


def check_options(kind: str, upstream: str, options: Mapping[str, object],
                  adapters: Mapping[str, type] | None = None) -> None:
    """A kind's ``[upstreams.options]``, checked by its adapter's ``parse_options`` (a
    :class:`ConfigError` naming the key) when the config is read, not when the adapter is
    built; a kind without that method, or not available, checks nothing here. ``adapters``
    replaces ``ADAPTERS``, as in :func:`adapter_for`."""
    table = ADAPTERS if adapters is None else adapters
    parse = getattr(table.get(kind), "parse_options", None)
    if parse is not None:
        parse(upstream, options)
