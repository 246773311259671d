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
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Candidate", "least_loaded_of_two", "rendezvous_order", "rendezvous_score"]


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
