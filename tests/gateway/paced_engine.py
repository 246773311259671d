"""The real embedded engine with a gate between its tokens, for tests about streaming order.

Streaming claims ("a frame is decodable before the next window closes", "a disconnect stops
the generation") must not depend on how fast this machine generates: on an idle machine the
model may finish 128 tokens before any window closes, on a loaded one a sleep may not be
long enough. :class:`PacedLlama` wraps a real ``llama_cpp.Llama`` (the same model, the same
ids) and lets a :class:`Gate` hold the generator before chosen tokens until the test says
so. The waits are events, never durations; the only time in here is a safety timeout that
turns a hang (a server that buffers) into a failed test.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["GATE_TIMEOUT_S", "Gate", "PacedLlama"]

#: How long a held token waits for the client before generation goes on anyway (counted
#: in :attr:`Gate.timed_out`). A safety net for a broken server, not a measurement: a
#: working one releases the gate within one coalescing window.
GATE_TIMEOUT_S = 20.0


class Gate:
    """Decides, before each generated token, whether the engine may go on.

    ``gate_every(n)``: before tokens n, 2n, ... wait until the client has decoded every
    token before it (:meth:`decoded`). ``hold_after(n)``: before token n, wait for
    :meth:`release`. Counters restart with each mode change.
    """

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._every = 0
        self._hold_at: int | None = None
        self._released = False
        self._holding = False
        self.engine: Any = None  # set by the fixture: the EmbeddedEngine over PacedLlama
        self.decoded_count = 0
        self.timed_out = 0
        self.released_by_client = 0

    def _reset(self) -> None:
        self._every, self._hold_at, self._released, self._holding = 0, None, False, False
        self.decoded_count = self.timed_out = self.released_by_client = 0

    def gate_every(self, n: int) -> None:
        with self._cv:
            self._reset()
            self._every = n

    def hold_after(self, n: int) -> None:
        with self._cv:
            self._reset()
            self._hold_at = n

    def decoded(self, n: int) -> None:
        """The client decoded ``n`` more tokens (called from the test's thread)."""
        with self._cv:
            self.decoded_count += n
            self._cv.notify_all()

    def release(self) -> None:
        with self._cv:
            self._released = True
            self._cv.notify_all()

    def holding(self) -> bool:
        with self._cv:
            return self._holding

    def before_token(self, index: int) -> None:
        """Called by the engine's thread before it produces token ``index`` (0-based)."""
        with self._cv:
            if self._every and index and index % self._every == 0:
                if self._cv.wait_for(lambda: self.decoded_count >= index, GATE_TIMEOUT_S):
                    self.released_by_client += 1
                else:
                    self.timed_out += 1
            elif self._hold_at is not None and index == self._hold_at:
                self._holding = True
                self._cv.wait_for(lambda: self._released, GATE_TIMEOUT_S)
                self._holding = False


class PacedLlama:
    """A ``llama_cpp.Llama`` whose ``generate`` asks a :class:`Gate` before every token."""

    def __init__(self, llm: Any, gate: Gate) -> None:
        self._llm = llm
        self._gate = gate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)

    def generate(self, tokens: Any, **kwargs: Any) -> Iterator[int]:
        inner = self._llm.generate(tokens, **kwargs)
        try:
            for index, tok in enumerate(inner):
                self._gate.before_token(index)
                yield tok
        finally:
            inner.close()
