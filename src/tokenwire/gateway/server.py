"""Assembly: settings -> map, safety policy, embedded engine -> app state; and running it.

Kept apart from the app so tests and benchmarks build exactly what ``tokenwire serve``
builds, with their own port and settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenwire.codec.maps import TokenizerMap, bundled_map_path, load_map_file
from tokenwire.gateway.app import GatewayState, create_app
from tokenwire.gateway.settings import ServerSettings, build_policy
from tokenwire.gateway.upstreams.embedded import EmbeddedEngine

__all__ = ["SMOLLM2_MAP_ID", "ServingPlan", "build_embedded_state", "run"]

SMOLLM2_MAP_ID = "huggingfacetb/smollm2"


@dataclass(frozen=True)
class ServingPlan:
    """What ``serve`` is about to do, for the start-up banner."""

    state: GatewayState
    engine: EmbeddedEngine
    bundled_map: TokenizerMap


def _advertised(tmap: TokenizerMap, settings: ServerSettings) -> TokenizerMap:
    # The map lists the loaded dictionaries (codec-spec §3.7); that is a new map with a new
    # hash, which is then the one Codec-Tokenizer-Map names (see gateway/wellknown.py).
    if not settings.zstd_dicts:
        return tmap
    try:
        from tokenwire.gateway.wellknown import advertise_dictionaries
    except ImportError:  # pragma: no cover
        return tmap
    return advertise_dictionaries(tmap, settings.zstd_dicts, base_url=settings.public_base_url)


def build_embedded_state(
    settings: ServerSettings, *, tmap: TokenizerMap | None = None,
    engine: EmbeddedEngine | None = None,
) -> ServingPlan:
    """Load the map and the engine (unless given) and describe the deployment."""
    bundled = tmap or load_map_file(bundled_map_path(SMOLLM2_MAP_ID))
    pair = build_policy(settings, bundled.id)
    policy, descriptor = pair if pair is not None else (None, None)
    if engine is None:
        engine = EmbeddedEngine.load(
            bundled, settings.model_path, n_ctx=settings.n_ctx, n_threads=settings.n_threads,
            queue_size=settings.queue_size)
    served = _advertised(bundled, settings)
    state = GatewayState(
        settings=settings, upstream=engine, tmap=served, max_model_len=engine.n_ctx,
        policy=policy, descriptor=descriptor,
        extra_maps=(bundled,) if served is not bundled else (),
    )
    return ServingPlan(state=state, engine=engine, bundled_map=bundled)


def run(plan: ServingPlan, *, log_level: str = "info") -> None:
    """Serve until interrupted (uvicorn), then stop the engine."""
    import uvicorn

    settings = plan.state.settings
    plan.engine.start()
    try:
        uvicorn.run(create_app(plan.state), host=settings.host, port=settings.port,
                    log_level=log_level, timeout_graceful_shutdown=5)
    finally:
        plan.engine.close()
