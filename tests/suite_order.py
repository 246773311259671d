"""The order the xdist workers take the test files in: the slowest first, each file whole.

``./dev test`` runs ``pytest -n 2 --dist loadfile --no-loadscope-reorder``: one work unit per
file, handed to whichever worker is free, in the order the workers collected them (xdist's
``LoadScopeScheduling.schedule`` keeps that order with ``--no-loadscope-reorder``; without it
it sorts the files by test count, biggest first, so the few-test end-to-end files that take
minutes each, the Codex CLI on the embedded engine above all, started last and ran alone at
the end). Longest first, every file starts while the other worker still has short ones to
fill in with.

How long a file takes is ``tests/durations.json`` (seconds of setup, call and teardown, a
whole-suite run on 2 workers); regenerate it after adding or changing slow tests::

    ./dev test -p no:cacheprovider --durations-out=tests/durations.json

A file not listed counts :data:`UNLISTED_SECONDS_PER_TEST` a test (``slow``-marked ones
:data:`UNLISTED_SECONDS_PER_SLOW_TEST`). Only the workers reorder; a run without xdist keeps
pytest's order.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DURATIONS = Path(__file__).parent / "durations.json"
#: The suite's median file is ~0.2 s a test (tests/durations.json); a new file is unknown.
UNLISTED_SECONDS_PER_TEST = 0.2
#: A new end-to-end test starts a real engine or server: seconds, not milliseconds.
UNLISTED_SECONDS_PER_SLOW_TEST = 10.0


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _estimate(items: list[pytest.Item]) -> float:
    return sum(UNLISTED_SECONDS_PER_SLOW_TEST if item.get_closest_marker("slow")
               else UNLISTED_SECONDS_PER_TEST for item in items)


def slowest_files_first(items: list[pytest.Item], durations: dict[str, float]) -> None:
    """Reorder ``items`` in place: files by their known (or estimated) seconds, longest
    first; a file's own items keep their order and stay together."""
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(_file(item), []).append(item)
    order = sorted(files, key=lambda f: -durations.get(f, _estimate(files[f])))
    items[:] = [item for f in order for item in files[f]]


def reorder(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # not an xdist worker: pytest's order
        return
    durations = json.loads(DURATIONS.read_text("utf-8")) if DURATIONS.exists() else {}
    slowest_files_first(items, durations)
