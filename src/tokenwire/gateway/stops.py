"""Stop sequences on streamed text, sans-IO: hold back what might become a stop string.

OpenAI semantics: the returned text ends just before the first stop string and never
contains it. When text arrives in pieces, the tail that is a prefix of some stop string
cannot be shown yet (the next piece might complete it), so :class:`StopMatcher` holds it
back and releases it once it can no longer match, or at :meth:`StopMatcher.flush`.

Token ids are not held back: a Codec stream carries every id the engine generated, up to
and including the one that completed the stop string, as vLLM's ``token_ids`` do. Text is
trimmed, and so are log probabilities (:meth:`StopMatcher.feed_delta`): a token's logprob
goes out with the text it begins, so the tokens of a matched stop string, which the client
never sees as text, do not reach it as logprobs either.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any, TypeVar

__all__ = ["MAX_STOPS", "MAX_STOP_CHARS", "StopMatcher", "validate_stops"]

#: More stop strings than any API we mirror accepts (OpenAI: 4, vLLM: unbounded); each one is
#: searched in every piece of text, so the count is bounded.
MAX_STOPS = 16
#: A stop string longer than this is a mistake, and the held-back tail grows with it.
MAX_STOP_CHARS = 512

_Lp = TypeVar("_Lp")


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
        self._fed = 0  # characters fed so far
        self._shown = 0  # characters returned as showable so far
        self._logprobs: deque[tuple[int, Any]] = deque()  # (where its text begins, lp)

    def feed(self, piece: str) -> str:
        """Text that can be shown now. After a match (``self.matched``), always ``""``."""
        self._fed += len(piece)
        shown = self._feed(piece)
        self._shown += len(shown)
        return shown

    def feed_delta(self, piece: str, logprobs: Iterable[_Lp],
                   starts: Iterable[int] | None = None) -> tuple[str, list[_Lp]]:
        """:meth:`feed` for a delta's text, with the logprobs of the tokens in it; returns
        the text and the logprobs that can go now: each once text from where its token
        begins has been shown, never when its token begins inside a matched stop.
        ``starts``: where each token begins in ``piece`` (a delta of several tokens); by
        default every one begins the delta (one token a delta, as the engine's are)."""
        if not self._stops:
            return piece, list(logprobs)
        at = self._fed
        if starts is None:
            self._logprobs.extend((at, lp) for lp in logprobs)
        else:
            self._logprobs.extend((at + start, lp) for start, lp in zip(starts, logprobs,
                                                                        strict=True))
        shown = self.feed(piece)
        out: list[_Lp] = []
        while self._logprobs and self._logprobs[0][0] < self._shown:
            out.append(self._logprobs.popleft()[1])
        return shown, out

    def flush_delta(self) -> tuple[str, list[Any]]:
        """:meth:`flush` and the logprobs still held (none after a match: their tokens
        begin inside the stop string)."""
        held = [] if self.matched is not None else [lp for _, lp in self._logprobs]
        self._logprobs.clear()
        return self.flush(), held

    def _feed(self, piece: str) -> str:
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
        self._shown += len(out)
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
