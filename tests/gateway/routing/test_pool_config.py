"""Pools in the configuration: the TOML ``replicas`` table, ``--replica`` flags, start-up
probing of each replica, and what ``/v1/models``, ``/health`` and ``/metrics`` show."""

from __future__ import annotations

import asyncio
from typing import ClassVar

import httpx
import pytest

from tokenwire.cli import serve as serve_cmd
from tokenwire.errors import ConfigError
from tokenwire.gateway.config import parse_config, parse_replica_flag, resolve
from tokenwire.gateway.http.app import create_app
from tokenwire.gateway.ir import IdsSource
from tokenwire.gateway.routing.breaker import BreakerState
from tokenwire.gateway.routing.pool import ReplicaPool
from tokenwire.gateway.server import build_gateway
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.upstreams.base import UpstreamConfig, UpstreamHealth, UpstreamState

#: base_url -> probe state, read by the fake adapters (one per replica).
DOWN: set[str] = set()


class FakeAdapter:
    kind = "openai"
    ids_source = IdsSource.NONE
    built: ClassVar[list[FakeAdapter]] = []

    def __init__(self, config: UpstreamConfig) -> None:
        self.config, self.name, self.closed = config, config.name, False
        self.model_id = "m"

    @classmethod
    def from_config(cls, config, *, transport=None, maps=None) -> FakeAdapter:
        cls.built.append(adapter := cls(config))
        return adapter

    def submit(self, request):  # pragma: no cover - routing is tested in test_pool.py
        raise NotImplementedError

    async def probe(self) -> UpstreamHealth:
        down = self.config.base_url in DOWN
        return UpstreamHealth(name=self.name, kind=self.kind,
                              state=UpstreamState.DOWN if down else UpstreamState.UP,
                              models=() if down else ("m", "n"))

    async def aclose(self) -> None:
        self.closed = True


def _pool_doc(**kw) -> dict:
    return {"name": "llama", "kind": "openai", "max_concurrent": 3, "replicas": [
        {"base_url": "http://a:1/v1", "weight": 2},
        {"base_url": "http://b:1/v1", "name": "bee", "max_concurrent": 1},
        {"base_url": "http://c:1/v1"}], **kw}


def _build(doc: dict):
    cfg = parse_config({"upstreams": [doc]}, source="t.toml", env={"K": "secret"})
    return asyncio.run(build_gateway(cfg, ServerSettings(), adapters={"openai": FakeAdapter}))


def test_a_pool_serves_each_model_once_with_every_replica_behind_it() -> None:
    DOWN.clear()
    gw = _build(_pool_doc(models=[{"name": "m"}]))
    (served,) = gw.state.router.models
    pool = served.upstream
    assert isinstance(pool, ReplicaPool)
    assert [(r.name, r.url, r.weight, r.limit) for r in pool.replicas] == [
        ("llama/1", "http://a:1/v1", 2.0, 3), ("llama/bee", "http://b:1/v1", 1.0, 1),
        ("llama/3", "http://c:1/v1", 1.0, 3)]
    assert pool.max_concurrent == 7  # the admission limit is the sum
    assert pool.load_factor == 1.25  # bounded-load affinity unless the file says otherwise
    assert pool.load_slack == 1
    assert [a.config.base_url for a in FakeAdapter.built[-3:]] == [
        "http://a:1/v1", "http://b:1/v1", "http://c:1/v1"]
    asyncio.run(gw.aclose())


@pytest.mark.parametrize(("value", "factor"), [(2, 2.0), (1.5, 1.5), (False, None)])
def test_the_affinity_load_factor_reaches_the_pool(value: object, factor: float | None
                                                   ) -> None:
    DOWN.clear()
    gw = _build(_pool_doc(models=[{"name": "m"}], affinity_load_factor=value))
    assert gw.state.router.models[0].upstream.load_factor == factor
    asyncio.run(gw.aclose())


def test_the_affinity_load_slack_reaches_the_pool() -> None:
    DOWN.clear()
    gw = _build(_pool_doc(models=[{"name": "m"}], affinity_load_slack=0))
    assert gw.state.router.models[0].upstream.load_slack == 0
    asyncio.run(gw.aclose())


def test_discovered_models_come_from_a_replica_that_answers() -> None:
    DOWN.clear()
    DOWN.add("http://a:1/v1")
    gw = _build(_pool_doc())
    assert gw.state.router.names == ("m", "n")
    pool = gw.state.router.models[0].upstream
    # the replica down at start-up is ejected, not a start-up error
    assert pool.replicas[0].breaker.state is BreakerState.OPEN
    assert pool.replicas[1].breaker.state is BreakerState.CLOSED
    asyncio.run(gw.aclose())
    DOWN.clear()


def test_no_replica_answering_is_a_startup_error() -> None:
    DOWN.clear()
    DOWN.update({"http://a:1/v1", "http://b:1/v1", "http://c:1/v1"})
    FakeAdapter.built.clear()
    with pytest.raises(ConfigError, match="no replica of upstream 'llama' listed its models"):
        _build(_pool_doc())
    with pytest.raises(ConfigError, match="no replica answered"):
        _build(_pool_doc(models=[{"name": "m"}]))
    assert all(a.closed for a in FakeAdapter.built)
    DOWN.clear()


def test_models_health_and_metrics_show_the_model_once_and_every_replica() -> None:
    DOWN.clear()
    gw = _build(_pool_doc(models=[{"name": "m"}], breaker={"base_cooldown_s": 2.0}))
    pool = gw.state.router.models[0].upstream
    pool.replicas[2].breaker.force_open(pool._clock())

    async def get(path: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(gw.state))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.get(path)

    models = asyncio.run(get("/v1/models")).json()["data"]
    assert [m["id"] for m in models] == ["m"]
    health = asyncio.run(get("/health")).json()
    (up,) = health["upstreams"]
    assert up["name"] == "llama"
    rows = {r["name"]: r for r in up["replicas"]}
    assert set(rows) == {"llama/1", "llama/bee", "llama/3"}
    assert rows["llama/3"]["breaker"] == "open" and rows["llama/3"]["ejections"] == 1
    assert 0 < rows["llama/3"]["cooldown_left_s"] <= 2.0
    assert rows["llama/bee"] == {**rows["llama/bee"], "breaker": "closed", "in_flight": 0,
                                 "limit": 1, "weight": 1.0, "url": "http://b:1/v1"}
    text = asyncio.run(get("/metrics")).text
    assert 'tokenwire_replica_state{pool="llama",replica="llama/3"} 2.0' in text
    assert 'tokenwire_replica_state{pool="llama",replica="llama/1"} 0.0' in text
    assert 'tokenwire_replica_limit{pool="llama",replica="llama/bee"} 1.0' in text
    assert 'tokenwire_replica_ejections_total{pool="llama",replica="llama/3"} 1.0' in text
    asyncio.run(gw.aclose())


BAD = [
    ("both", _pool_doc(base_url="http://x:1/v1"), "give base_url or replicas, not both"),
    ("empty", {**_pool_doc(), "replicas": []}, "replicas must be a non-empty array"),
    ("no url", {**_pool_doc(), "replicas": [{"weight": 1}]}, "replica #1: base_url is "
     "required"),
    ("bad url", {**_pool_doc(), "replicas": [{"base_url": "ftp://x"}]}, "is not an http://"),
    ("weight", {**_pool_doc(), "replicas": [{"base_url": "http://a:1", "weight": 0}]},
     "weight must be a positive number"),
    ("weight inf", {**_pool_doc(), "replicas": [{"base_url": "http://a:1",
                                                 "weight": float("inf")}]},
     "weight must be a positive number"),  # inf/inf shares: NaN in the balancer, a 500
    ("limit", {**_pool_doc(), "replicas": [{"base_url": "http://a:1", "max_concurrent": 0}]},
     "max_concurrent must be at least 1"),
    ("typo", {**_pool_doc(), "replicas": [{"base_url": "http://a:1", "wieght": 2}]},
     "unknown key 'wieght'"),
    ("key env", {**_pool_doc(), "replicas": [{"base_url": "http://a:1", "api_key_env": "NO"}]},
     "api_key_env names NO, which is not set"),
    ("names", {**_pool_doc(), "replicas": [{"base_url": "http://a:1", "name": "x"},
                                           {"base_url": "http://b:1", "name": "x"}]},
     "two replicas have the same name"),
    # Two replicas of weight 1e308 sum to infinity: random.choices refused the weights
    # (ValueError) on every request the pool balanced between them.
    ("weight huge", {**_pool_doc(), "replicas": [{"base_url": "http://a:1", "weight": 1e308}]},
     "replica #1: weight must be a positive number up to 1000000, got 1e+308"),
    ("breaker typo", _pool_doc(breaker={"cooldown": 3}), "[breaker]: unknown key 'cooldown'"),
    ("breaker value", _pool_doc(breaker={"error_rate": 2.0}), "error_rate must be in (0, 1]"),
    ("probe", _pool_doc(probe_interval_s=0), "probe_interval_s must be a number of seconds "
     "from 0.01 up to 86400, got 0"),
    # A probe of every replica on every turn of the loop, back to back
    ("probe tiny", _pool_doc(probe_interval_s=1e-9), "from 0.01 up to 86400, got 1e-09"),
    # NaN: the probe loop found nothing ever due and spun at once, for ever
    ("probe nan", _pool_doc(probe_interval_s=float("nan")), "probe_interval_s must be a"),
    ("probe inf", _pool_doc(probe_interval_s=float("inf")), "probe_interval_s must be a"),
    # NaN: the error-rate window never let an outcome go (memory grew with every request)
    ("window nan", _pool_doc(breaker={"window_s": float("nan")}), "[breaker]: breaker window_s"),
    ("cooldown nan", _pool_doc(breaker={"base_cooldown_s": float("nan")}),
     "[breaker]: breaker base_cooldown_s must be a positive number"),
    # inf: the shared ejection's TTL raised OverflowError and ended the breaker sync's reads;
    # past ~1e16 s Redis refuses the TTL, and each publication degraded all shared state
    ("cooldown inf", _pool_doc(breaker={"max_cooldown_s": float("inf")}),
     "[breaker]: breaker max_cooldown_s must be a positive number"),
    ("cooldown huge", _pool_doc(breaker={"max_cooldown_s": 1e300}), "up to 86400"),
    ("prefix", _pool_doc(affinity_prefix_chars=-1), "affinity_prefix_chars must be between"),
    ("load factor", _pool_doc(affinity_load_factor=0.9), "affinity_load_factor must be a"),
    ("load factor %", _pool_doc(affinity_load_factor=125), "affinity_load_factor must be a"),
    ("load slack", _pool_doc(affinity_load_slack=-1), "affinity_load_slack must be a"),
    ("embedded", {"name": "e", "kind": "embedded", "replicas": [{"base_url": "http://a:1"}]},
     "an embedded upstream has no replicas"),
]


@pytest.mark.parametrize(("case", "doc", "message"), BAD, ids=[c[0] for c in BAD])
def test_bad_pools_are_config_errors_naming_the_key(case, doc, message) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"upstreams": [doc]}, source="t.toml", env={})
    assert message in str(info.value)


def test_replica_flags_make_one_pool() -> None:
    argv = ["serve", "--replica", "http://a:1/v1,weight=2,max_concurrent=8",
            "--replica", "http://b:1/v1,name=b,api_key_env=K", "--upstream-max-concurrent", "2"]
    import argparse

    parser = argparse.ArgumentParser()
    serve_cmd.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    cfg = serve_cmd.gateway_config_from_args(args, env={"K": "x"})
    (up,) = cfg.upstreams
    assert up.name == "pool" and up.kind == "openai"
    assert [(r.base_url, r.weight, r.max_concurrent, r.api_key_env) for r in up.replicas] == [
        ("http://a:1/v1", 2.0, 8, None), ("http://b:1/v1", 1.0, None, "K")]
    assert [up.replica(i).max_concurrent for i in range(2)] == [8, 2]
    assert up.replica(1).name == "pool/b" and up.replica(1).api_key_env == "K"


@pytest.mark.parametrize(("flag", "message"), [
    ("http://a:1/v1,weight=x", "weight must be a number"),
    ("http://a:1/v1,wieght=2", "unknown option 'wieght=2'"),
    ("http://a:1/v1,weight=-1", "weight must be a positive number"),
])
def test_bad_replica_flags(flag: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(replicas=[flag], env={})


def test_replica_flags_do_not_combine_with_upstream_or_config() -> None:
    with pytest.raises(ConfigError, match="--replica cannot be combined"):
        resolve(replicas=["http://a:1/v1"], upstream_urls=["http://b:1/v1"], env={})
    assert parse_replica_flag("http://a:1/v1") == {"base_url": "http://a:1/v1"}


def test_a_config_error_after_probing_leaves_no_task_and_closes_every_adapter() -> None:
    """A check that fails after the pool is built (a safety policy without a tokenizer
    map) must not leave the health loop running nor the replicas' adapters open."""
    from tokenwire.codec.versioning import VersionPolicy

    DOWN.clear()
    FakeAdapter.built.clear()
    cfg = parse_config({"upstreams": [_pool_doc(models=[{"name": "m"}])]}, source="t.toml")
    settings = ServerSettings(version_policy=VersionPolicy(safety_policy_id="tw-strict"))

    async def main() -> set[asyncio.Task]:
        with pytest.raises(ConfigError, match="a safety policy needs a model with a tokenizer"):
            await build_gateway(cfg, settings, adapters={"openai": FakeAdapter})
        return asyncio.all_tasks() - {asyncio.current_task()}

    assert asyncio.run(main()) == set()
    assert FakeAdapter.built and all(a.closed for a in FakeAdapter.built)


class _ThirdFails(FakeAdapter):
    """Builds every replica but the third, as a from_config that raises would."""

    @classmethod
    def from_config(cls, config, *, transport=None, maps=None) -> FakeAdapter:
        if config.base_url == "http://c:1/v1":
            raise ConfigError(f"upstream {config.name!r}: cannot be built")
        return super().from_config(config, transport=transport, maps=maps)


def test_a_replica_that_fails_to_build_closes_the_replicas_built_before_it() -> None:
    FakeAdapter.built.clear()
    cfg = parse_config({"upstreams": [_pool_doc(models=[{"name": "m"}])]}, source="t.toml")
    with pytest.raises(ConfigError, match="cannot be built"):
        asyncio.run(build_gateway(cfg, ServerSettings(), adapters={"openai": _ThirdFails}))
    assert len(FakeAdapter.built) == 2 and all(a.closed for a in FakeAdapter.built)
