"""The shared builder thread (tokenwire/background.py)."""

from __future__ import annotations

from tokenwire.background import drain, in_background


def test_drain_waits_for_builds_that_builds_queue() -> None:
    # codec/pinned_regex.py queues its sweep from a build, to run after the load's others.
    done: list[str] = []
    in_background(lambda: in_background(lambda: done.append("queued by a build")))
    drain()
    assert done == ["queued by a build"]
