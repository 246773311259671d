"""Shared test fixtures: paths to the copied data under tests/fixtures/ (see its README)."""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, settings

from tests import suite_order, suite_timeline
from tests.redis_server import RedisServer, redis_binary

# Property tests must not depend on this machine's speed (a loaded 2-core CI machine runs an
# example many times slower than an idle one): no per-example deadline and no "too slow"
# health check anywhere. A test's own @settings still sets its example count.
settings.register_profile("tokenwire", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("tokenwire")

#: ``TOKENWIRE_FUZZ=release`` runs the fuzzing and repeated-sample checks at their release
#: counts; the default ``ci`` runs each at a count its test explains.
PROFILE = os.environ.get("TOKENWIRE_FUZZ", "ci")

T = TypeVar("T", bound=AbstractContextManager)

FIXTURES = Path(__file__).parent / "fixtures"
CODEC_FIXTURES = FIXTURES / "codec"
MAPS = FIXTURES / "maps"


def fixture_map_path(map_id: str) -> Path:
    return MAPS / f"{map_id}.json"


def corpus() -> dict[str, list[str]]:
    """The differential-test corpus: category -> samples (tests/fixtures/corpus/build.py)."""
    return json.loads((FIXTURES / "corpus" / "corpus.json").read_text("utf-8"))


@pytest.fixture
def closing() -> Iterator[Callable[[T], T]]:
    """``closing(client) -> client``, entered now and closed when the test ends.

    For SDK and httpx clients a test makes: one left open keeps its pooled sockets until the
    garbage collector finds it (SDK clients sit in reference cycles), and then a
    ResourceWarning for the socket fails whichever later test was running at that moment.
    """
    with ExitStack() as stack:
        yield stack.enter_context


@pytest.fixture(scope="session")
def corpus_samples() -> list[str]:
    return [s for samples in corpus().values() for s in samples]


@pytest.fixture(autouse=True, scope="module")
def _collect_garbage_after_each_module() -> Iterator[None]:
    """A full garbage collection as each test module ends.

    A client, socket or pipe a test leaves open in a reference cycle is only found by the
    collector, and its ResourceWarning (an error here: pyproject's ``filterwarnings``)
    then fails whichever test is running at that moment, often in another module. Collected
    here, it fails this module's last test instead (pytest reports it in its teardown; run
    with ``PYTHONTRACEMALLOC=10`` to see where the object was made). One collection of a
    worker's heap is ~0.3 s of CPU (~270k objects, measured), ~95 modules: well under a
    minute of the suite's CPU time.
    """
    yield
    gc.collect()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A real ``redis-server`` of this test's own, on a free port (tests/redis_server.py).

    Skips where the binary is missing, except in CI (``CI=true``), where ``./dev`` installs
    it (scripts/system-packages.sh) and a missing one is a failure, not a silent skip.
    """
    if redis_binary() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("redis-server is missing in CI: scripts/system-packages.sh did not run")
        pytest.skip("redis-server is not installed (scripts/system-packages.sh)")
    with RedisServer(tmp_path / "redis") as server:
        yield server


def pytest_addoption(parser: pytest.Parser) -> None:
    suite_timeline.addoption(parser)


def pytest_configure(config: pytest.Config) -> None:
    suite_timeline.configure(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    suite_order.reorder(config, items)
