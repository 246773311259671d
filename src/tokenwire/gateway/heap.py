"""The serving process's garbage collector, set once the gateway is built.

Why (BENCHMARKS.md, "Session of 2026-12-04 (3)"): a built gateway holds ~50,000 container
objects that live as long as the process (tokenizer maps, their tables, routes, compiled
patterns). CPython's full collection walks every one of them: measured at 64 streams, one
took 22-30 ms, a pause every stream in the loop shares. :func:`gc.freeze` moves what
start-up built into a generation the collector never walks (CPython's documented use of
it: after start-up, before serving). Then the youngest generation's threshold is raised
from 700 to :data:`GEN0_THRESHOLD` container allocations: a request's objects mostly die
with it, and a collection every 700 allocations ran ~130 times per 512 streamed requests
where 5,000 ran 16 times, for about half the collector's CPU. Cycles are still found: the
older generations' thresholds are CPython's own.

Only the serving processes call this (``tokenwire serve``): a test process that builds
gateways would keep every earlier test's objects forever.
"""

from __future__ import annotations

import gc

__all__ = ["GEN0_THRESHOLD", "settle_after_startup"]

#: Container allocations (net of frees) between collections of the youngest generation.
GEN0_THRESHOLD = 5000


def settle_after_startup() -> None:
    """Collect start-up's garbage, freeze what remains, raise the youngest threshold."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, older, oldest)
