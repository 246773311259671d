"""The sans-IO per-key limiter (gateway/state/limits.py), driven by an injected clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenwire.gateway.state.limits import (
    WINDOW_S,
    KeyLimits,
    Limit,
    LocalLimiter,
    WindowCounts,
    decide,
    estimate,
    wait_s,
)

#: A moment at the very start of a window: the previous window is empty, nothing slides.
T0 = 1_000 * WINDOW_S


def test_rpm_admits_exactly_the_limit_at_one_moment() -> None:
    lim = LocalLimiter()
    limits = KeyLimits(rpm=60)
    verdicts = [lim.acquire("k", limits, T0) for _ in range(100)]
    assert sum(v.admitted for v in verdicts) == 60
    assert all(v.admitted for v in verdicts[:60])
    refused = verdicts[60]
    assert refused.refused is Limit.REQUESTS
    # 60 in the current window, none before: the next window starts in 60 s, and there the
    # 60 slide out at one per second, so the first slot is back one second into it.
    assert refused.retry_after == 61
    assert refused.remaining_requests == 0


def test_the_previous_window_slides_out_and_retry_after_is_when_room_returns() -> None:
    lim = LocalLimiter()
    limits = KeyLimits(rpm=60)
    for _ in range(60):
        assert lim.acquire("k", limits, T0).admitted
    # 15 s into the next window the previous 60 weigh 45: 15 more fit, the 16th does not.
    t = T0 + WINDOW_S + 15
    admitted = [lim.acquire("k", limits, t).admitted for _ in range(20)]
    assert admitted.count(True) == 15
    refused = lim.acquire("k", limits, t)
    assert refused.refused is Limit.REQUESTS
    later = t + refused.retry_after
    assert lim.acquire("k", limits, later).admitted
    # two windows on, nothing is left of either
    assert sum(lim.acquire("k", limits, T0 + 3 * WINDOW_S).admitted for _ in range(61)) == 60


def test_never_more_than_the_limit_across_a_window_boundary() -> None:
    """A fixed window lets 2 x limit through around a boundary; the carried one does not."""
    lim = LocalLimiter()
    limits = KeyLimits(rpm=10)
    times = [T0 + WINDOW_S - 1 + i * 0.05 for i in range(60)]  # 3 s around the boundary
    admitted = [t for t in times for _ in range(3) if lim.acquire("k", limits, t).admitted]
    assert len(admitted) <= 10 + 1  # the estimate lets one slot back per 6 s of the 3 s


@given(previous=st.integers(0, 500), current=st.integers(0, 500),
       fraction=st.floats(0, 0.999), limit=st.integers(1, 300))
def test_wait_is_exactly_when_the_estimate_has_room(previous: int, current: int,
                                                    fraction: float, limit: int) -> None:
    wait = wait_s(previous, current, fraction, limit)
    if estimate(previous, current, fraction) + 1 <= limit:
        assert wait == 0
        return
    assert wait > 0
    end = fraction * WINDOW_S + wait  # offset of the moment from this window's start

    def estimate_at(offset: float) -> float:
        if offset < WINDOW_S:
            return estimate(previous, current, offset / WINDOW_S)
        return estimate(current, 0, (offset - WINDOW_S) / WINDOW_S)

    assert estimate_at(end + 1e-6) + 1 <= limit + 1e-6
    assert estimate_at(max(fraction * WINDOW_S, end - 0.01)) + 1 > limit - 1e-6


def test_tokens_are_charged_at_the_end_and_refuse_only_when_no_room_is_left() -> None:
    lim = LocalLimiter()
    limits = KeyLimits(tpm=100)
    assert lim.acquire("k", limits, T0).admitted
    assert lim.acquire("k", limits, T0).admitted  # nothing charged yet: both run
    lim.release("k", 70, T0)
    assert lim.acquire("k", limits, T0).admitted  # 70 used, room left
    lim.release("k", 70, T0)
    lim.release("k", 10, T0)  # the third: 150 in all, the documented in-flight overshoot
    refused = lim.acquire("k", limits, T0)
    assert refused.refused is Limit.TOKENS
    assert refused.remaining_tokens == 0
    # 150 tokens slide out of the next window; room for one token when 150 x (1 - f) <= 99
    assert refused.retry_after == 60 + 21


def test_concurrency_is_given_back_on_release() -> None:
    lim = LocalLimiter()
    limits = KeyLimits(max_concurrent=2)
    assert lim.acquire("k", limits, T0).admitted
    assert lim.acquire("k", limits, T0).admitted
    third = lim.acquire("k", limits, T0)
    assert third.refused is Limit.CONCURRENT and third.retry_after == 1
    lim.release("k", 0, T0)
    assert lim.acquire("k", limits, T0).admitted
    assert lim.in_flight("k") == 2


def test_a_refused_request_counts_nothing() -> None:
    lim = LocalLimiter()
    limits = KeyLimits(rpm=5, max_concurrent=1)
    assert lim.acquire("k", limits, T0).admitted
    for _ in range(10):
        assert lim.acquire("k", limits, T0).refused is Limit.CONCURRENT
    lim.release("k", 0, T0)
    assert sum(lim.acquire("k", limits, T0).admitted
               or lim.release("k", 0, T0) is not None for _ in range(10)) == 4


def test_keys_are_counted_apart() -> None:
    lim = LocalLimiter()
    limits = KeyLimits(rpm=1)
    assert lim.acquire("a", limits, T0).admitted
    assert lim.acquire("b", limits, T0).admitted
    assert not lim.acquire("a", limits, T0).admitted


def test_decide_orders_concurrency_then_requests_then_tokens() -> None:
    limits = KeyLimits(rpm=1, tpm=1, max_concurrent=1)
    full = WindowCounts(fraction=0.0, requests=(0, 1), tokens=(0, 1), in_flight=1)
    assert decide(limits, full).refused is Limit.CONCURRENT
    no_conc = WindowCounts(fraction=0.0, requests=(0, 1), tokens=(0, 1))
    assert decide(limits, no_conc).refused is Limit.REQUESTS
    tokens_only = WindowCounts(fraction=0.0, tokens=(0, 1))
    assert decide(limits, tokens_only).refused is Limit.TOKENS


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_limits_are_whole_numbers_from_one(bad: object) -> None:
    with pytest.raises(ValueError, match="rpm"):
        KeyLimits(rpm=bad)  # type: ignore[arg-type]
