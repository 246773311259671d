"""The v0.5 content-coding picker with reason codes (codec-spec §4.3).

A pure function from (the client's ``Accept-Encoding``, what the server can do, the stack
profile, a sample of the response) to a :class:`Pick`. It reproduces the picker of the
``@codecai/wire-compress`` package step by step, including its quirks, so that our choice
matches the 12,960 published conformance vectors built from the same grid:

* q-values order the client's list but the result never depends on that order: the steps
  test membership only (zstd, then br on low entropy, then gzip, then br);
* ``*`` is recorded but never expanded into concrete codings;
* ``estimated_size`` and ``interactive`` are accepted and ignored (v0.5 dropped the v0.2-v0.4
  size thresholds);
* when nothing survives the result is identity, even if the client sent ``identity;q=0``:
  the picker has no 406 (``identity_last_resort``).

The reason code is a closed enum, additive only (§4.3, open question in §9.2).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = [
    "BUILTIN_PROFILES",
    "DEFAULT_SERVER_SUPPORTS",
    "LOW_ENTROPY_BITS",
    "MAX_TTFT_RATIO",
    "AcceptedEncodings",
    "CodingProfile",
    "Pick",
    "ReasonCode",
    "StackProfile",
    "parse_accept_encoding",
    "pick_encoding",
    "shannon_entropy",
]

#: A coding whose time-to-first-token on a stack is more than 5x identity's is dropped (§4.3
#: step 3).
MAX_TTFT_RATIO = 5.0
#: Response samples below 3.0 bits/byte favour brotli over zstd (§4.3 step 4).
LOW_ENTROPY_BITS = 3.0
#: What a server offers when the caller does not say: every coding the spec names (§4.1).
DEFAULT_SERVER_SUPPORTS: tuple[str, ...] = ("zstd", "br", "gzip", "identity")

_COMPRESSED = ("zstd", "br", "gzip")


class ReasonCode(StrEnum):
    """Why the picker chose what it chose (closed; new members only in a new minor)."""

    DICT_ZSTD_DEFAULT = "dict_zstd_default"
    BR_CONTENT_SAMPLE_LOW_ENTROPY = "br_content_sample_low_entropy"
    GZIP_NO_ZSTD_IN_ACCEPT = "gzip_no_zstd_in_accept"
    GZIP_NO_DICT = "gzip_no_dict"
    GZIP_MIDDLEWARE_DISABLED = "gzip_middleware_disabled"
    PER_STACK_OVERRODE_ZSTD = "per_stack_overrode_zstd"
    PER_STACK_OVERRODE_BR = "per_stack_overrode_br"
    BR_FALLBACK_NO_GZIP = "br_fallback_no_gzip"
    IDENTITY_LAST_RESORT = "identity_last_resort"


_REASON_TEXT: dict[ReasonCode, str] = {
    ReasonCode.DICT_ZSTD_DEFAULT: "zstd with a trained dictionary is offered and enabled",
    ReasonCode.BR_CONTENT_SAMPLE_LOW_ENTROPY: "response sample is low-entropy; brotli wins",
    ReasonCode.GZIP_NO_ZSTD_IN_ACCEPT: "client did not offer zstd; gzip",
    ReasonCode.GZIP_NO_DICT: "no zstd dictionary for this stream_format; gzip instead",
    ReasonCode.GZIP_MIDDLEWARE_DISABLED: "zstd disabled (middleware would buffer it); gzip",
    ReasonCode.PER_STACK_OVERRODE_ZSTD: "stack profile drops zstd (slow first token); gzip",
    ReasonCode.PER_STACK_OVERRODE_BR: "stack profile drops brotli (slow first token)",
    ReasonCode.BR_FALLBACK_NO_GZIP: "brotli: neither zstd nor gzip is usable",
    ReasonCode.IDENTITY_LAST_RESORT: "no compressed coding is acceptable; identity",
}


@dataclass(frozen=True, slots=True)
class CodingProfile:
    """Measured behaviour of one coding on one stack: bytes relative to identity, TTFT ratio."""

    wire_coeff: float
    ttft_ratio: float


@dataclass(frozen=True, slots=True)
class StackProfile:
    """Per-stack measurements (§4.3 step 3). Codings absent from ``codings`` are kept."""

    name: str
    codings: Mapping[str, CodingProfile]


def _profile(name: str, gzip: float, br: float, zstd: float) -> StackProfile:
    return StackProfile(
        name,
        {
            "gzip": CodingProfile(gzip, 1.0),
            "br": CodingProfile(br, 1.0),
            "zstd": CodingProfile(zstd, 1.0),
        },
    )


#: The built-in profiles (§4.3). All TTFT ratios are 1, so step 3 only bites for custom ones.
BUILTIN_PROFILES: dict[str, StackProfile] = {
    "default": _profile("default", 0.05, 0.5, 0.04),
    "sglang": _profile("sglang", 0.023, 0.733, 0.017),
    "llama.cpp": _profile("llama.cpp", 1.0, 1.0, 1.0),
}


@dataclass(frozen=True, slots=True)
class AcceptedEncodings:
    """A parsed ``Accept-Encoding``: codings with q > 0 by descending q (stable)."""

    codings: tuple[str, ...]
    star: bool = False
    unspecified: bool = False


@dataclass(frozen=True, slots=True)
class Pick:
    """The decision: the coding, the closed reason code, a sentence, and what was considered.

    ``considered`` is the client's acceptable codings that the server supports, in the
    client's preference order (§4.3 step 1).
    """

    encoding: str
    reason_code: ReasonCode
    reason: str
    considered: tuple[str, ...] = field(default=())


def _q_value(params: list[str]) -> float | None:
    """The q parameter of one entry; ``None`` when it is malformed (the entry is dropped)."""
    for p in params:
        key, _, value = p.partition("=")
        if key.strip().lower() == "q":
            try:
                q = float(value.strip())
            except ValueError:
                return None
            return q if math.isfinite(q) else None
    return 1.0


def parse_accept_encoding(header: str | None) -> AcceptedEncodings:
    """Parse ``Accept-Encoding`` by the picker's rules (§4.3).

    ``None`` or empty -> ``[identity]`` (unspecified). Entries with q > 0 are kept, sorted by q
    descending (stable); names are lower-cased; a malformed q drops its entry (we never pick
    a coding the client did not clearly accept); ``*`` is recorded, not expanded. identity is
    appended unless ``identity;q=0``, or ``*;q=0`` with nothing else accepted.
    """
    if header is None or not header.strip():
        return AcceptedEncodings(("identity",), unspecified=True)
    ranked: list[tuple[float, str]] = []
    ranked_names: set[str] = set()  # one set for the whole header: work stays linear in it
    refused: set[str] = set()
    for entry in header.split(","):
        name, *params = entry.split(";")
        name = name.strip().lower()
        if not name:
            continue
        q = _q_value(params)
        if q is None or q <= 0:
            refused.add(name)
        elif name not in ranked_names:
            ranked_names.add(name)
            ranked.append((q, name))
    ranked.sort(key=lambda item: -item[0])  # list.sort is stable
    star = any(n == "*" for _, n in ranked)
    codings = [n for _, n in ranked if n != "*"]
    if "identity" not in codings and "identity" not in refused:
        if not ("*" in refused and not codings):
            codings.append("identity")
    return AcceptedEncodings(tuple(codings), star=star)


def shannon_entropy(sample: bytes) -> float:
    """Shannon entropy of a byte string in bits per byte (0.0 for an empty sample)."""
    if not sample:
        return 0.0
    n = len(sample)
    return -sum(c / n * math.log2(c / n) for c in Counter(sample).values())


def _resolve_profile(stack: str | StackProfile | None) -> StackProfile:
    if isinstance(stack, StackProfile):
        return stack
    # An unknown name falls back to the default profile like the reference does.
    return BUILTIN_PROFILES.get(stack or "default", BUILTIN_PROFILES["default"])


def pick_encoding(
    accept_encoding: str | None,
    *,
    zstd_has_dict: bool = False,
    zstd_enabled: bool = True,
    server_supports: Iterable[str] = DEFAULT_SERVER_SUPPORTS,
    stack_profile: str | StackProfile | None = None,
    sample_bytes: bytes | None = None,
    estimated_size: int | None = None,
    interactive: bool = True,
) -> Pick:
    """Choose the response coding exactly as the v0.5 picker (codec-spec §4.3 steps 1-9).

    ``zstd_has_dict`` must be true only when a dictionary for this response's
    ``stream_format`` is loaded: zstd is never picked without one (§4.1). An empty
    ``sample_bytes`` counts as no sample. ``estimated_size`` and ``interactive`` are ignored.
    """
    del estimated_size, interactive  # accepted for API parity; no effect since v0.5
    accepted = parse_accept_encoding(accept_encoding)
    supported = {s.lower() for s in server_supports}
    # Step 1: what the client accepts and the server can produce.
    considered = tuple(c for c in accepted.codings if c in supported)
    alive = {c for c in considered if c in _COMPRESSED}

    # Step 2: zstd gates. The reason is kept for step 7.
    gate: ReasonCode | None = None
    if "zstd" not in alive:
        gate = ReasonCode.GZIP_NO_ZSTD_IN_ACCEPT
    elif not zstd_has_dict:
        alive.discard("zstd")
        gate = ReasonCode.GZIP_NO_DICT
    elif not zstd_enabled:
        alive.discard("zstd")
        gate = ReasonCode.GZIP_MIDDLEWARE_DISABLED

    # Step 3: the stack profile drops codings whose first token is too slow.
    profile = _resolve_profile(stack_profile)
    overrode_zstd = False
    for coding in sorted(alive):
        prof = profile.codings.get(coding)
        if prof is not None and prof.ttft_ratio > MAX_TTFT_RATIO:
            alive.discard(coding)
            overrode_zstd = overrode_zstd or coding == "zstd"

    def done(encoding: str, code: ReasonCode) -> Pick:
        return Pick(encoding, code, _REASON_TEXT[code], considered)

    # Step 4: low-entropy content compresses better with brotli.
    if sample_bytes and {"br", "zstd"} <= alive:
        if shannon_entropy(sample_bytes) < LOW_ENTROPY_BITS:
            return done("br", ReasonCode.BR_CONTENT_SAMPLE_LOW_ENTROPY)
    if "zstd" in alive:  # step 5
        return done("zstd", ReasonCode.DICT_ZSTD_DEFAULT)
    if overrode_zstd and "gzip" in alive:  # step 6
        return done("gzip", ReasonCode.PER_STACK_OVERRODE_ZSTD)
    if "gzip" in alive:  # step 7
        assert gate is not None  # zstd survived step 2 only if step 5 or 6 returned
        return done("gzip", gate)
    if "br" in alive:  # step 8
        return done("br", ReasonCode.BR_FALLBACK_NO_GZIP)
    return done("identity", ReasonCode.IDENTITY_LAST_RESORT)  # step 9
