"""One builder thread for the fast paths that are finished after a map is ready.

``Tokenizer.from_map(tmap, defer=in_background)`` and ``Detokenizer(tmap,
defer=in_background)`` encode and decode at once on exact slow paths (the pure-Python BPE,
per-id lookups) while tiktoken's core and the id -> bytes tables are built here, one after
the other (issue 15: map load-to-ready; BENCHMARKS.md has the profile). The codec core
stays sans-IO: it only hands its builds to whatever ``defer`` it is given; the thread lives
here. The thread holds the GIL while it works, so it slows the caller down while it runs;
the builds are queued, not parallel, so a process loading many maps does not thrash, and each starts
:data:`START_DELAY_S` after it was queued, so that the requests right after a load (or the
rest of a load: the encoder and decoder are queued a few ms apart) do not share the GIL
with it. Nothing waits on the delay: until a build is done its slow path answers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["START_DELAY_S", "drain", "in_background"]

#: How long a queued build waits before it starts. Measured on SmolLM2 (BENCHMARKS.md): built
#: at once, the builder took half of the interpreter during load-to-ready and made it 1.4x
#: longer; the slow paths cost nothing per call that a 100 ms wait would make noticeable.
START_DELAY_S = 0.1

_builder: ThreadPoolExecutor | None = None
_lock = threading.Lock()
_queued = 0  # builds ever queued, so that drain() sees the ones queued by builds


def in_background(build: Callable[[], object]) -> Future:
    """Queue ``build`` on the shared builder thread; its Future says when it is done."""
    global _builder, _queued
    with _lock:
        if _builder is None:
            _builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenwire-build")
        _queued += 1
        return _builder.submit(_after_delay, time.monotonic() + START_DELAY_S, build)


def drain() -> None:
    """Wait until the builder is idle: every build queued so far is done, and those they
    queued (the pre-tokenizer's sweep is queued by a build: codec/pinned_regex.py)."""
    while True:
        before = _queued
        in_background(lambda: None).result()  # a no-op queued behind them
        if _queued == before + 1:  # nothing was queued meanwhile but the no-op
            return


def _after_delay(start_at: float, build: Callable[[], object]) -> object:
    wait = start_at - time.monotonic()
    if wait > 0:  # builds queued behind a slower one start at once
        time.sleep(wait)
    return build()
