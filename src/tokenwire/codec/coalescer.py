"""When a streamed response body is flushed: the coalescing window (codec-spec §10 item 1).

Sans-IO: the server feeds encoded frames to a :class:`Coalescer` together with the current
time, and sends whatever bytes come back; the compressor it flushes is one of
:mod:`tokenwire.codec.compression`'s (a flush keeps the compression history, §4.2).
"""

from __future__ import annotations

from tokenwire.codec.compression import Compressor
from tokenwire.errors import LocalProtocolError

__all__ = ["DEFAULT_WINDOW_S", "MAX_PENDING_BYTES", "Coalescer"]

#: Default coalescing window. At ~70 tokens/s (one token per ~14 ms) a window under 14 ms is a
#: flush per one-id frame: 9.4 B/token for msgpack+gzip, worse than protobuf identity (7.5).
#: Measured on 2,048-token msgpack streams (gzip/br-5/zstd+dict B/token): 50 ms 3.6/4.4/5.5,
#: 100 ms 2.7/3.4/4.1, 150 ms 2.35/3.0/3.6, 300 ms 2.0/2.5/3.0, unflushed 1.5/1.4/1.7.
#: 150 ms is the shortest window that gets gzip under 2.5 B/token; latency-sensitive callers
#: pass a shorter one (the first frame is flushed at once either way). Those figures predate
#: the gzip flush of GzipStream: on the recorded replay of bench_compression, msgpack+gzip is
#: now 2.97 B/token at 20 ms (8.8 with Z_SYNC_FLUSH) and 0.72 at 150 ms (1.75); br and zstd
#: unchanged.
DEFAULT_WINDOW_S = 0.15
#: Raw frame bytes a Coalescer holds before it closes the window early: a fast engine must not
#: make the server buffer an unbounded amount, and 64 KiB is already ~4,000 one-id frames.
MAX_PENDING_BYTES = 64 * 1024


class Coalescer:
    """Gathers encoded frames and flushes the compressor once per window (codec-spec §10.1).

    The window opens when a frame arrives with nothing pending and closes ``window`` seconds
    later: whichever of :meth:`add` or :meth:`poll` first sees ``now`` at or past
    :attr:`deadline` compresses the pending frames and flushes, so every frame is decodable
    by the client at most one window after it was produced (given a timely ``poll``). The very
    first frame is flushed at once when ``flush_first`` is set, since time to first token
    matters most and one extra flush costs a few bytes per response. ``window=0`` flushes
    every frame. Identity output is coalesced too: a write per window instead of one per
    frame is what keeps a stream's CPU per token down (an uncompressed Chat stream written
    per token took 1.5x the upstream's CPU per token at 64 streams, and 0.93x direct's
    throughput, against 1.25 and 1.09 compressed: BENCHMARKS.md, "Session of 2026-12-05
    (5)"), and the client sees the timing a compressed stream has.
    """

    def __init__(
        self,
        compressor: Compressor,
        *,
        window: float = DEFAULT_WINDOW_S,
        flush_first: bool = True,
        max_pending: int = MAX_PENDING_BYTES,
    ) -> None:
        if window < 0:
            raise LocalProtocolError("coalescing window must be >= 0")
        self.compressor = compressor
        self.window = window
        self.max_pending = max_pending
        self._flush_next = flush_first
        self._pending: list[bytes] = []
        self._pending_len = 0
        self._opened_at: float | None = None
        self._closed = False

    @property
    def deadline(self) -> float | None:
        """When the caller should next :meth:`poll`; ``None`` when nothing is pending."""
        return None if self._opened_at is None else self._opened_at + self.window

    def add(self, frame: bytes, now: float, *, flush: bool = False) -> bytes:
        """Queue one encoded frame; return the compressed bytes due now (maybe ``b""``).
        ``flush``: close the window with this frame (a keep-alive, which exists to be on the
        wire now)."""
        if self._closed:
            raise LocalProtocolError("Coalescer.add() after close()")
        self._pending.append(bytes(frame))
        self._pending_len += len(frame)
        if self._opened_at is None:
            self._opened_at = now
        if (
            flush
            or self._flush_next
            or self.window == 0
            or self._pending_len >= self.max_pending
            or now >= self._opened_at + self.window
        ):
            self._flush_next = False
            return self._emit()
        return b""

    def poll(self, now: float) -> bytes:
        """Timer tick: flush if the open window has reached its deadline."""
        if self._closed or self._opened_at is None or now < self._opened_at + self.window:
            return b""
        return self._emit()

    def close(self, now: float) -> bytes:
        """End of body: compress what is pending and finish the coded stream."""
        del now  # the stream ends now whatever the window; kept for a uniform signature
        if self._closed:
            raise LocalProtocolError("Coalescer.close() called twice")
        self._closed = True
        out = self.compressor.compress(self._take())
        return out + self.compressor.finish()

    def _take(self) -> bytes:
        data = b"".join(self._pending)
        self._pending.clear()
        self._pending_len = 0
        self._opened_at = None
        return data

    def _emit(self) -> bytes:
        out = self.compressor.compress(self._take())
        return out + self.compressor.flush()
