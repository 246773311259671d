"""Which replica takes a request: pure choices over a snapshot, no clock, no sockets.

* :func:`least_loaded_of_two` balances by load: two replicas drawn at random (weighted),
  the one with less in-flight work per unit of weight wins (the "power of two choices":
  nearly the balance of least-loaded-of-all, without every gateway herding onto the same
  replica). Only replicas that are eligible (breaker admits) and below their limit are
  drawn, so a choice never exceeds a replica's limit.
* :func:`rendezvous_order` maps an affinity key (a conversation) to replicas by weighted
  rendezvous hashing (highest random weight): each replica scores the key, the best score
  wins. Removing a replica moves only the keys it won; adding one takes only keys it now
  wins. Scores hash with BLAKE2b, so every gateway instance (and every restart) agrees.
* :func:`affinity_choice` is the affinity choice with bounded loads (Mirrokni, Thorup and
  Zadimoghaddam, "Consistent Hashing with Bounded Loads", 2017): walk the key's rendezvous
  order and take the first replica whose in-flight work stays within
  ``ceil(load_factor x average)`` (:func:`load_bound`; the average over the eligible
  replicas, counting the request being placed, per unit of weight) plus ``slack``
  requests. A key whose replica already holds more than that passes to its next replica,
  so a few conversations hashed onto one replica cannot queue there while another sits
  idle. With
  ``load_factor >= 1`` some eligible replica is always within its bound; when loads are
  equal every replica is within it, so the choice is plain rendezvous hashing (a removed
  replica moves only its own keys). It reads only the snapshot: every gateway instance
  that sees the same healthy set and loads makes the same choice.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "DEFAULT_LOAD_FACTOR",
    "DEFAULT_LOAD_SLACK",
    "Candidate",
    "affinity_choice",
    "least_loaded_of_two",
    "load_bound",
    "rendezvous_order",
    "rendezvous_score",
]

#: No replica takes more than 1.25x its share of the in-flight work while another is within
#: its share: the default of brpc's ``c_murmurhash_bl`` and liblb's bounded balancer
#: (HAProxy's ``hash-balance-factor`` is the same bound in percent). Lower spreads more
#: evenly and moves more conversations off their replica (a prefix-cache miss); higher keeps
#: them home and lets queues grow (README "Replica pools"; BENCHMARKS.md measures it).
DEFAULT_LOAD_FACTOR = 1.25
#: ...plus this many requests. A multiplicative bound is coarse at the few requests an engine
#: that serves one at a time holds (llama.cpp, Ollama): with three replicas and the others
#: idle, 1.25x lets a replica hold one request, so a conversation's turn leaves its home for
#: a cold replica, where the whole conversation is prefilled again, rather than wait behind
#: one warm turn. One request of slack lets it wait behind two (not three); at the tens of
#: requests a batching engine (vLLM, SGLang) holds, it is small beside the share. LLM routers
#: bound imbalance the same way, in requests: SGLang's cache-aware router and Dynamo's leave
#: the cache's replica only past an absolute difference (32 by default, for batching GPU
#: engines). BENCHMARKS.md ("Prefix-cache affinity") measures 0 against 1.
DEFAULT_LOAD_SLACK = 1
#: ``ceil`` of a product of floats: 1.25 x 4 x 0.2 is 1.0000000000000002, not 1.
_CEIL_SLACK = 1e-9


@dataclass(frozen=True, slots=True)
class Candidate:
    """One replica as the choice sees it."""

    name: str
    weight: float
    in_flight: int
    limit: int
    eligible: bool = True

    @property
    def free(self) -> bool:
        return self.eligible and self.in_flight < self.limit


def least_loaded_of_two(candidates: Sequence[Candidate], rng: random.Random) -> int | None:
    """The index of the chosen replica, or None when none is eligible with a free slot."""
    open_ = [i for i, c in enumerate(candidates) if c.free]
    if not open_:
        return None
    if len(open_) == 1:
        return open_[0]
    weights = [candidates[i].weight for i in open_]
    a = rng.choices(open_, weights=weights)[0]
    rest = [i for i in open_ if i != a]
    b = rng.choices(rest, weights=[candidates[i].weight for i in rest])[0]
    load_a = candidates[a].in_flight / candidates[a].weight
    load_b = candidates[b].in_flight / candidates[b].weight
    if load_a != load_b:
        return a if load_a < load_b else b
    return a  # a tie: the first draw, itself weighted


def rendezvous_score(key: str, name: str, weight: float) -> float:
    """Weighted rendezvous score: ``-weight / ln(u)`` with ``u`` in (0, 1) from the hash of
    (key, replica). Larger wins; a replica of twice the weight wins twice as many keys."""
    digest = hashlib.blake2b(f"{name}\x00{key}".encode(), digest_size=8).digest()
    u = (int.from_bytes(digest, "big") + 0.5) / 2.0 ** 64
    return -weight / math.log(u)


def rendezvous_order(key: str, candidates: Sequence[Candidate]) -> list[int]:
    """Indices of the eligible replicas, best first for ``key``."""
    scored = [(rendezvous_score(key, c.name, c.weight), i)
              for i, c in enumerate(candidates) if c.eligible]
    return [i for _, i in sorted(scored, reverse=True)]


def load_bound(candidates: Sequence[Candidate], index: int, load_factor: float,
               slack: int = 0) -> int:
    """The most in-flight requests ``candidates[index]`` may hold once this one is placed:
    ``ceil(load_factor x (total in flight + 1) x weight / total weight) + slack`` over the
    eligible replicas (an ineligible one is out of the set, like a removed one)."""
    live = [c for c in candidates if c.eligible]
    total = sum(c.in_flight for c in live) + 1
    weight = sum(c.weight for c in live)
    share = load_factor * total * candidates[index].weight / weight
    return max(1, math.ceil(share - _CEIL_SLACK)) + slack


def affinity_choice(key: str, candidates: Sequence[Candidate],
                    load_factor: float | None = DEFAULT_LOAD_FACTOR,
                    slack: int = DEFAULT_LOAD_SLACK) -> int | None:
    """The replica for ``key``: the first in its rendezvous order with a free slot and (when
    ``load_factor`` is not None) within :func:`load_bound` with ``slack``; when every
    replica within its bound is full, the first with a free slot (the limit is hard, the
    bound is not); None when no eligible replica has a free slot."""
    free = [i for i in rendezvous_order(key, candidates) if candidates[i].free]
    if load_factor is None or not free:
        return free[0] if free else None
    for i in free:
        if candidates[i].in_flight < load_bound(candidates, i, load_factor, slack):
            return i
    return free[0]
