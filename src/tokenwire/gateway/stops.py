"""Stop sequences on streamed text, sans-IO: hold back what might become a stop string.

OpenAI semantics: the returned text ends just before the first stop string and never
contains it. When text arrives in pieces, the tail that is a prefix of some stop string
cannot be shown yet (the next piece might complete it), so :class:`StopMatcher` holds it
back and releases it once it can no longer match, or at :meth:`StopMatcher.flush`.

Token ids are not held back: a Codec stream carries every id the engine generated, up to
and including the one that completed the stop string, as vLLM's ``token_ids`` do. Only
text is trimmed.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["MAX_STOPS", "MAX_STOP_CHARS", "StopMatcher", "validate_stops"]

#: More stop strings than any API we mirror accepts (OpenAI: 4, vLLM: unbounded); each one is
#: searched in every piece of text, so the count is bounded.
MAX_STOPS = 16
#: A stop string longer than this is a mistake, and the held-back tail grows with it.
MAX_STOP_CHARS = 512


def validate_stops(stops: Iterable[str]) -> tuple[str, ...]:
    """The non-empty stop strings, checked against the limits; raise ``ValueError``."""
    out = tuple(s for s in stops if s)
    if len(out) > MAX_STOPS:
        raise ValueError(f"at most {MAX_STOPS} stop sequences are allowed, got {len(out)}")
    for s in out:
        if len(s) > MAX_STOP_CHARS:
            raise ValueError(f"a stop sequence is longer than {MAX_STOP_CHARS} characters")
    return out


class StopMatcher:
    """Feed text pieces; get back the text that is safe to show and the stop that fired."""

    def __init__(self, stops: Iterable[str]) -> None:
        self._stops = validate_stops(stops)
        self._held = ""
        self.matched: str | None = None

    def feed(self, piece: str) -> str:
        """Text that can be shown now. After a match (``self.matched``), always ``""``."""
        if self.matched is not None:
            return ""
        if not self._stops:
            return piece
        buf = self._held + piece
        hit = self._earliest(buf)
        if hit is not None:
            pos, stop = hit
            self.matched = stop
            self._held = ""
            return buf[:pos]
        keep = self._partial_tail(buf)
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """End of generation: release the held tail (it never became a stop string)."""
        out, self._held = self._held, ""
        return out

    def _earliest(self, buf: str) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self._stops:
            pos = buf.find(stop)
            if pos >= 0 and (best is None or pos < best[0]):
                best = (pos, stop)
        return best

    def _partial_tail(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of a stop."""
        longest = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(buf)), longest, -1):
                if buf.endswith(stop[:k]):
                    longest = k
                    break
        return longest
