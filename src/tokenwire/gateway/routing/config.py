"""The routing layer's tables of the config file: replica pools and fallbacks.

::

    [[upstreams]]
    name = "vllm-pool"
    kind = "openai"
    replicas = [{ base_url = "http://10.0.0.5:8000/v1", weight = 2 },
                { base_url = "http://10.0.0.6:8000/v1", max_concurrent = 4 }]
    probe_interval_s = 5        # active probes of every replica (routing/health.py)
    affinity_prefix_chars = 0   # > 0: hash that many prompt characters when no key is sent
    affinity_load_factor = 1.25 # bounded loads (routing/balance.py), or false: plain hashing
    affinity_load_slack = 1     # ...plus this many requests
    panic_threshold = 0.0       # a share in [0, 1), or false (routing/pool.py)
    [upstreams.breaker]         # the fields of routing.breaker.BreakerPolicy

    [fallbacks]                 # model = ["other", ...] (routing/fallbacks.py)
    [context_fallbacks]

``gateway/config.py`` reads the file and calls :func:`parse_pool` for a pooled
``[[upstreams]]`` table and :func:`parse_fallbacks` for the two lists; the pool's checked
settings ride on ``UpstreamConfig.pool`` until :func:`pool_settings` turns them into the
values a :class:`~tokenwire.gateway.routing.pool.ReplicaPool` is built with. Every problem is
reported at once, each naming its table and key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokenwire.config_tables import NUM, Problems, check_http_url, check_keys, check_seconds
from tokenwire.errors import ConfigError, ConfigErrors
from tokenwire.gateway.routing.balance import DEFAULT_LOAD_FACTOR, DEFAULT_LOAD_SLACK
from tokenwire.gateway.routing.breaker import BreakerPolicy
from tokenwire.gateway.routing.fallbacks import FallbackTable
from tokenwire.gateway.routing.pool import (
    DEFAULT_PANIC_THRESHOLD,
    DEFAULT_PROBE_INTERVAL_S,
    parse_load_factor,
    parse_load_slack,
    parse_panic_threshold,
)
from tokenwire.gateway.upstreams.base import ReplicaConfig

__all__ = [
    "MAX_AFFINITY_PREFIX_CHARS",
    "POOL_KEYS",
    "PoolSettings",
    "parse_fallbacks",
    "parse_pool",
    "pool_settings",
]

#: The keys of an ``[[upstreams]]`` table that configure its pool, and their types.
POOL_KEYS: dict[str, tuple[type, ...]] = {
    "replicas": (list,), "breaker": (dict,), "probe_interval_s": NUM,
    "affinity_prefix_chars": (int,), "panic_threshold": (*NUM, bool),
    "affinity_load_factor": (*NUM, bool), "affinity_load_slack": (int,),
}
#: One replica of a pool (README "Replica pools").
_REPLICA_KEYS: dict[str, tuple[type, ...]] = {
    "base_url": (str,), "name": (str,), "api_key_env": (str,), "weight": NUM,
    "max_concurrent": (int,),
}
#: [upstreams.breaker]: the fields of routing.breaker.BreakerPolicy.
_BREAKER_KEYS: dict[str, tuple[type, ...]] = {
    "consecutive_failures": (int,), "error_rate": NUM, "window_s": NUM,
    "min_requests": (int,), "base_cooldown_s": NUM, "max_cooldown_s": NUM,
    "close_after": (int,),
}
#: Longest prompt prefix the stateless affinity hash reads: enough for a system prompt.
MAX_AFFINITY_PREFIX_CHARS = 65_536
#: Largest replica weight: weights are relative (2 is twice 1's share), and any number of
#: replicas of this weight still sum to a finite total.
MAX_WEIGHT = 1_000_000.0


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """A pool's checked settings, as its :class:`ReplicaPool` and breakers take them."""

    breaker: BreakerPolicy
    probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S
    prefix_chars: int = 0
    panic_threshold: float | None = DEFAULT_PANIC_THRESHOLD
    load_factor: float | None = DEFAULT_LOAD_FACTOR
    load_slack: int = DEFAULT_LOAD_SLACK


def pool_settings(options: Mapping[str, object]) -> PoolSettings:
    """``UpstreamConfig.pool`` (already checked by :func:`parse_pool`) as typed values."""
    breaker = options.get("breaker", {})
    return PoolSettings(
        breaker=BreakerPolicy(**dict(breaker)),  # type: ignore[call-overload]
        probe_interval_s=float(options.get("probe_interval_s",  # type: ignore[arg-type]
                                           DEFAULT_PROBE_INTERVAL_S)),
        prefix_chars=int(options.get("affinity_prefix_chars", 0)),  # type: ignore[call-overload]
        panic_threshold=parse_panic_threshold(options.get("panic_threshold",
                                                          DEFAULT_PANIC_THRESHOLD)),
        load_factor=parse_load_factor(options.get("affinity_load_factor",
                                                  DEFAULT_LOAD_FACTOR)),
        load_slack=parse_load_slack(options.get("affinity_load_slack", DEFAULT_LOAD_SLACK)))


def parse_pool(doc: Mapping[str, Any], env: Mapping[str, str],
               where: str) -> tuple[ReplicaConfig, ...]:
    """``replicas``, ``breaker``, ``probe_interval_s`` and ``affinity_prefix_chars`` of a
    pooled upstream; every problem reported."""
    problems = Problems()
    docs = doc.get("replicas")
    if not isinstance(docs, list) or not docs:
        raise ConfigError(f"{where}: replicas must be a non-empty array of tables")
    out: list[ReplicaConfig] = []
    for i, rdoc in enumerate(docs):
        parsed = problems.check(_parse_replica, rdoc, env, f"{where} replica #{i + 1}")
        if parsed is not None:
            out.append(parsed)
    names = [r.name or str(i + 1) for i, r in enumerate(out)]
    if len(set(names)) != len(names):
        problems.add(ConfigError(f"{where}: two replicas have the same name"))
    breaker = doc.get("breaker", {})
    if isinstance(breaker, dict):
        problems.check(check_keys, breaker, _BREAKER_KEYS, f"{where} [breaker]")
        if not problems.messages:
            problems.check(_breaker_policy, breaker, where)
    interval = doc.get("probe_interval_s", 1)
    if isinstance(interval, NUM):
        problems.check(check_seconds, interval, "probe_interval_s", where, interval=True)
    if "panic_threshold" in doc:
        problems.check(parse_panic_threshold, doc["panic_threshold"], where)
    if "affinity_load_factor" in doc:
        problems.check(parse_load_factor, doc["affinity_load_factor"], where)
    if "affinity_load_slack" in doc:
        problems.check(parse_load_slack, doc["affinity_load_slack"], where)
    prefix = doc.get("affinity_prefix_chars", 0)
    if isinstance(prefix, int) and not 0 <= prefix <= MAX_AFFINITY_PREFIX_CHARS:
        problems.add(ConfigError(f"{where}: affinity_prefix_chars must be between 0 (off) "
                                 f"and {MAX_AFFINITY_PREFIX_CHARS}"))
    if problems.messages:
        raise ConfigErrors(problems.messages)
    return tuple(out)


def _parse_replica(doc: Any, env: Mapping[str, str], where: str) -> ReplicaConfig:
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: must be a table")
    check_keys(doc, _REPLICA_KEYS, where)
    if not isinstance(doc.get("base_url"), str):
        raise ConfigError(f"{where}: base_url is required")
    url = check_http_url(doc["base_url"], where)
    key_env = doc.get("api_key_env")
    if key_env is not None and key_env not in env:
        raise ConfigError(f"{where}: api_key_env names {key_env}, which is not set")
    weight = doc.get("weight", 1.0)
    # The balancer draws by weight: random.choices refuses weights whose sum is infinite
    # (routing/balance.py), as two of 1e308 are. NaN fails the comparison.
    if not 0 < weight <= MAX_WEIGHT:
        raise ConfigError(f"{where}: weight must be a positive number up to "
                          f"{MAX_WEIGHT:.0f}, got {weight!r}")
    limit = doc.get("max_concurrent")
    if limit is not None and limit < 1:
        raise ConfigError(f"{where}: max_concurrent must be at least 1")
    return ReplicaConfig(base_url=url, name=doc.get("name", ""), api_key_env=key_env,
                         weight=float(weight), max_concurrent=limit)


def _breaker_policy(doc: Mapping[str, Any], where: str) -> BreakerPolicy:
    try:
        return BreakerPolicy(**doc)
    except ConfigError as exc:
        raise ConfigError(f"{where} [breaker]: {exc}") from None


def parse_fallbacks(doc: Mapping[str, Any], source: str, *,
                    declared: Sequence[object] | None = None) -> FallbackTable:
    """``[fallbacks]`` / ``[context_fallbacks]``: ``model = ["other", ...]`` each. Names are
    checked against ``declared`` when every upstream declares its models (else probing finds
    some, and the gateway checks them once it has)."""
    lists: dict[str, dict[str, tuple[str, ...]]] = {}
    problems: list[str] = []
    for key in ("fallbacks", "context_fallbacks"):
        table = doc.get(key, {})
        lists[key] = {}
        if not isinstance(table, dict):
            continue  # the top-level key check reported the type
        for model, targets in table.items():
            if not isinstance(targets, list) or not all(isinstance(t, str) and t
                                                        for t in targets):
                problems.append(f"{source}: [{key}] {model} must be an array of model names")
                continue
            lists[key][model] = tuple(targets)
    fallbacks = FallbackTable(general=lists["fallbacks"], context=lists["context_fallbacks"])
    names = [n for n in declared or () if isinstance(n, str)] if declared is not None else None
    problems += [f"{source}: {p}" for p in fallbacks.problems(names)]
    if problems:
        raise ConfigErrors(problems)
    return fallbacks
