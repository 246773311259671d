"""Balancing and rendezvous hashing (routing/balance.py): pure choices, property-tested."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenwire.gateway.routing.balance import (
    Candidate,
    affinity_choice,
    least_loaded_of_two,
    load_bound,
    rendezvous_order,
)

_CANDS = st.lists(st.builds(Candidate, name=st.text(min_size=1, max_size=6),
                            weight=st.floats(min_value=0.1, max_value=10),
                            in_flight=st.integers(0, 10), limit=st.integers(1, 10),
                            eligible=st.booleans()), min_size=0, max_size=8)


@given(_CANDS, st.integers(0, 2**32))
def test_balancing_never_exceeds_a_limit_nor_picks_an_ineligible_replica(cands, seed) -> None:
    rng = random.Random(seed)
    i = least_loaded_of_two(cands, rng)
    if i is None:
        assert not any(c.eligible and c.in_flight < c.limit for c in cands)
    else:
        assert cands[i].eligible and cands[i].in_flight < cands[i].limit


@given(st.lists(st.integers(1, 4), min_size=1, max_size=6), st.integers(0, 2**32),
       st.integers(1, 200))
def test_filling_replicas_by_choice_never_passes_any_limit(limits, seed, requests) -> None:
    rng = random.Random(seed)
    in_flight = [0] * len(limits)
    for _ in range(requests):
        cands = [Candidate(str(k), 1.0, in_flight[k], limits[k]) for k in range(len(limits))]
        i = least_loaded_of_two(cands, rng)
        if i is None:
            assert in_flight == limits  # only when every replica is full
            break
        in_flight[i] += 1
        assert all(n <= lim for n, lim in zip(in_flight, limits, strict=True))


def test_the_less_loaded_of_two_wins() -> None:
    cands = [Candidate("a", 1, 3, 10), Candidate("b", 1, 0, 10)]
    assert {least_loaded_of_two(cands, random.Random(s)) for s in range(50)} == {1}


def test_weights_share_the_traffic() -> None:
    rng = random.Random(7)
    cands = [Candidate("a", 3.0, 0, 10), Candidate("b", 1.0, 0, 10), Candidate("c", 1.0, 0, 10)]
    picks = Counter(least_loaded_of_two(cands, rng) for _ in range(5000))
    # idle replicas: the first draw (weighted) decides ties, so "a" gets about 3/5
    assert 0.55 < picks[0] / 5000 < 0.65


_NAMES = st.lists(st.text("abcdefghij", min_size=1, max_size=5), min_size=2, max_size=8,
                  unique=True)


@given(_NAMES, st.data())
def test_removing_a_replica_moves_only_its_own_keys(names, data) -> None:
    weights = {n: data.draw(st.floats(0.5, 4)) for n in names}
    keys = [f"conv-{k}" for k in range(200)]
    full = [Candidate(n, weights[n], 0, 1) for n in names]
    gone = data.draw(st.sampled_from(names))
    rest = [c for c in full if c.name != gone]
    for key in keys:
        before = full[rendezvous_order(key, full)[0]].name
        after = rest[rendezvous_order(key, rest)[0]].name
        if before != gone:
            assert after == before  # only the removed replica's keys move
    # and an ineligible (ejected) replica is the same as a removed one
    ejected = [Candidate(c.name, c.weight, 0, 1, eligible=c.name != gone) for c in full]
    for key in keys:
        assert ejected[rendezvous_order(key, ejected)[0]].name == \
            rest[rendezvous_order(key, rest)[0]].name


def test_rendezvous_is_stable_and_weighted() -> None:
    cands = [Candidate("r1", 2.0, 0, 1), Candidate("r2", 1.0, 0, 1), Candidate("r3", 1.0, 0, 1)]
    wins = Counter(rendezvous_order(f"k{i}", cands)[0] for i in range(8000))
    assert 0.46 < wins[0] / 8000 < 0.54  # twice the weight, about half the keys
    # the same answer in another process: the hash is BLAKE2b, not Python's salted hash()
    assert [rendezvous_order("conversation-1", cands)[0] for _ in range(3)] == [0, 0, 0] or \
        len({rendezvous_order("conversation-1", cands)[0] for _ in range(3)}) == 1


# -- bounded loads (affinity_choice) ----------------------------------------------------------

_FACTORS = st.one_of(st.floats(1.0, 3.0), st.sampled_from([1.0, 1.25, 1.5, 2.0]))
_SLACKS = st.integers(0, 4)


@given(_CANDS, _FACTORS, _SLACKS, st.text(max_size=8))
def test_the_bound_is_never_exceeded_while_a_replica_within_it_has_a_slot(cands, c, slack,
                                                                          key) -> None:
    i = affinity_choice(key, cands, c, slack)
    if i is None:
        assert not any(x.free for x in cands)
        return
    assert cands[i].free
    if cands[i].in_flight >= load_bound(cands, i, c, slack):  # over its bound: only forced
        assert not any(x.free and x.in_flight < load_bound(cands, j, c, slack)
                       for j, x in enumerate(cands))


@settings(max_examples=40)  # each example places up to 120 requests
@given(_NAMES, _FACTORS, _SLACKS, st.integers(1, 120), st.data())
def test_filling_by_bounded_affinity_keeps_every_replica_within_its_bound(names, c, slack, n,
                                                                          data) -> None:
    """Unlimited slots: every placement lands within ceil(c x average) + slack, whatever
    the keys (all the same key included: the hot-conversation case)."""
    hot = data.draw(st.booleans())
    weights = {m: data.draw(st.floats(0.5, 4)) for m in names}
    load = dict.fromkeys(names, 0)
    for r in range(n):
        cands = [Candidate(m, weights[m], load[m], 10**6) for m in names]
        i = affinity_choice("hot" if hot else f"k{r}", cands, c, slack)
        assert i is not None
        assert load[names[i]] + 1 <= load_bound(cands, i, c, slack)
        load[names[i]] += 1


@settings(max_examples=40)  # each example routes 60 keys four ways
@given(_NAMES, _FACTORS, st.integers(0, 5), st.data())
def test_with_balanced_loads_a_removed_replica_moves_only_its_own_keys(names, c, level, data
                                                                       ) -> None:
    gone = data.draw(st.sampled_from(names))
    full = [Candidate(m, 1.0, level, 100) for m in names]
    rest = [x for x in full if x.name != gone]
    ejected = [Candidate(x.name, 1.0, level, 100, eligible=x.name != gone) for x in full]
    for k in range(60):
        key = f"conv-{k}"
        before = full[affinity_choice(key, full, c)].name
        assert before == full[rendezvous_order(key, full)[0]].name  # plain rendezvous
        after = rest[affinity_choice(key, rest, c)].name
        if before != gone:
            assert after == before
        assert ejected[affinity_choice(key, ejected, c)].name == after


def test_a_conversation_passes_over_a_replica_holding_more_than_its_share() -> None:
    names = ["r1", "r2", "r3"]
    key = "session-id:conv-7"
    order = rendezvous_order(key, [Candidate(m, 1.0, 0, 8) for m in names])
    home, second = names[order[0]], names[order[1]]
    # two in flight at home, none elsewhere: the average with this one is 1, the bound
    # ceil(1.25) = 2, home is at it, so the key goes to its second replica ...
    busy = [Candidate(m, 1.0, 2 if m == home else 0, 8) for m in names]
    assert names[affinity_choice(key, busy, 1.25, slack=0)] == second
    assert names[affinity_choice(key, busy, 1.25)] == home  # within the default slack
    # ... plain rendezvous (no bound) keeps it home, as does a looser factor
    assert names[affinity_choice(key, busy, None)] == home
    assert names[affinity_choice(key, busy, 3.0, slack=0)] == home
    # and the choice is a function of the snapshot: the same on every instance
    assert {affinity_choice(key, list(busy), 1.25, slack=0) for _ in range(5)} == {order[1]}


def test_the_slack_keeps_a_turn_home_behind_a_few_requests_not_behind_many() -> None:
    """The default request of slack: a conversation's turn waits at home behind two others
    (cheaper, on an engine serving one at a time, than prefilling the whole conversation on
    a cold replica) but not behind three, while the others sit idle."""
    names = ["r1", "r2", "r3"]
    key = "session-id:conv-7"
    order = rendezvous_order(key, [Candidate(m, 1.0, 0, 8) for m in names])
    home, second = names[order[0]], names[order[1]]
    for depth, chosen in ((1, home), (2, home), (3, second)):
        busy = [Candidate(m, 1.0, depth if m == home else 0, 8) for m in names]
        # bound ceil(1.25 x (depth + 1) / 3) + 1: 2, 3, 3 (slack 0: 1, 1, 2)
        assert names[affinity_choice(key, busy)] == chosen, depth
