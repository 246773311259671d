"""The v0.5 picker (codec-spec §4.3): a readable table, the acceptance probes, grid invariants.

The 12,960 upstream vectors are not available; expectations below are derived by hand from
the nine steps of §4.3, and the full documented grid is checked against invariants.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenwire.codec.picker import (
    BUILTIN_PROFILES,
    CodingProfile,
    Pick,
    ReasonCode,
    StackProfile,
    parse_accept_encoding,
    pick_encoding,
    shannon_entropy,
)

from ..interpreter_work import lines_run

R = ReasonCode

# The grid of §4.3.
ACCEPT_ENCODINGS = [
    None,
    "",
    "identity",
    "gzip",
    "br",
    "zstd",
    "gzip, br",
    "gzip, br, zstd",
    "zstd, gzip, br",
    "br;q=0.5, gzip;q=1.0, zstd;q=0.8",
    "gzip;q=0, zstd;q=1.0",
    "gzip, identity;q=0",
    "br;q=1.0, gzip;q=1.0",
    "*;q=0",
    "gzip;q=1.0, br;q=0.5",
]
SIZES = [16, 64, 128, 200, 256, 512, 1024, 4096, 8192]
STACKS = [None, "default", "sglang", "llama.cpp"]
FLAGS = [(False, True), (True, True), (True, False), (False, False)]  # (dict, enabled)


def _xorshift_bytes(seed: int, n: int, modulo: int = 256) -> bytes:
    out, x = bytearray(), seed
    for _ in range(n):
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        out.append((x & 0xFF) % modulo)
    return bytes(out)


HIGH = _xorshift_bytes(0xC0DEC517, 256)  # ~7.2 bits/byte
LOW = _xorshift_bytes(0xC0DEC517, 256, modulo=4)  # <= 2 bits/byte
SAMPLES = {"none": None, "low": LOW, "high": HIGH}
SLOW_ZSTD = StackProfile("slow-zstd", {"zstd": CodingProfile(0.04, 10.0)})
SLOW_GZIP = StackProfile("slow-gzip", {"gzip": CodingProfile(0.05, 6.0)})


def test_samples_straddle_the_entropy_threshold():
    assert shannon_entropy(LOW) < 3.0 < shannon_entropy(HIGH)
    assert shannon_entropy(b"") == 0.0 and shannon_entropy(b"aaaa") == 0.0


# accept, has_dict, enabled, stack, sample -> encoding, reason
TABLE = [
    (None, False, True, None, "none", "identity", R.IDENTITY_LAST_RESORT),
    ("", True, True, None, "none", "identity", R.IDENTITY_LAST_RESORT),
    ("identity", True, True, None, "low", "identity", R.IDENTITY_LAST_RESORT),
    ("gzip", False, True, None, "none", "gzip", R.GZIP_NO_ZSTD_IN_ACCEPT),
    ("gzip", True, True, "sglang", "low", "gzip", R.GZIP_NO_ZSTD_IN_ACCEPT),
    ("br", True, True, None, "none", "br", R.BR_FALLBACK_NO_GZIP),
    ("zstd", False, True, None, "none", "identity", R.IDENTITY_LAST_RESORT),
    ("zstd", True, True, None, "none", "zstd", R.DICT_ZSTD_DEFAULT),
    ("zstd", True, False, None, "none", "identity", R.IDENTITY_LAST_RESORT),
    ("gzip, br", True, True, None, "low", "gzip", R.GZIP_NO_ZSTD_IN_ACCEPT),
    ("gzip, br, zstd", True, True, None, "none", "zstd", R.DICT_ZSTD_DEFAULT),
    ("gzip, br, zstd", True, True, "default", "low", "br", R.BR_CONTENT_SAMPLE_LOW_ENTROPY),
    ("gzip, br, zstd", True, True, "llama.cpp", "high", "zstd", R.DICT_ZSTD_DEFAULT),
    ("gzip, br, zstd", False, True, None, "low", "gzip", R.GZIP_NO_DICT),
    ("gzip, br, zstd", True, False, None, "low", "gzip", R.GZIP_MIDDLEWARE_DISABLED),
    ("zstd, gzip, br", False, False, None, "none", "gzip", R.GZIP_NO_DICT),
    ("br;q=0.5, gzip;q=1.0, zstd;q=0.8", True, True, None, "high", "zstd", R.DICT_ZSTD_DEFAULT),
    ("br;q=0.5, gzip;q=1.0, zstd;q=0.8", False, True, None, "none", "gzip", R.GZIP_NO_DICT),
    ("gzip;q=0, zstd;q=1.0", False, True, None, "none", "identity", R.IDENTITY_LAST_RESORT),
    ("gzip;q=0, zstd;q=1.0", True, True, None, "none", "zstd", R.DICT_ZSTD_DEFAULT),
    ("gzip, identity;q=0", False, True, None, "none", "gzip", R.GZIP_NO_ZSTD_IN_ACCEPT),
    ("br;q=1.0, gzip;q=1.0", True, True, None, "low", "gzip", R.GZIP_NO_ZSTD_IN_ACCEPT),
    ("*;q=0", True, True, None, "none", "identity", R.IDENTITY_LAST_RESORT),
    ("gzip;q=1.0, br;q=0.5", True, True, None, "low", "gzip", R.GZIP_NO_ZSTD_IN_ACCEPT),
    ("zstd, br", True, True, None, "low", "br", R.BR_CONTENT_SAMPLE_LOW_ENTROPY),
    ("zstd, br", False, True, None, "low", "br", R.BR_FALLBACK_NO_GZIP),
    ("gzip, zstd", True, True, SLOW_ZSTD, "none", "gzip", R.PER_STACK_OVERRODE_ZSTD),
    ("zstd, br", True, True, SLOW_ZSTD, "none", "br", R.BR_FALLBACK_NO_GZIP),
    ("gzip", True, True, SLOW_GZIP, "none", "identity", R.IDENTITY_LAST_RESORT),
    ("gzip, br", True, True, SLOW_GZIP, "none", "br", R.BR_FALLBACK_NO_GZIP),
]


@pytest.mark.parametrize(
    ("accept", "has_dict", "enabled", "stack", "sample", "enc", "reason"), TABLE
)
def test_picker_follows_the_nine_steps(accept, has_dict, enabled, stack, sample, enc, reason):
    p = pick_encoding(
        accept,
        zstd_has_dict=has_dict,
        zstd_enabled=enabled,
        stack_profile=stack,
        sample_bytes=SAMPLES[sample],
    )
    assert (p.encoding, p.reason_code) == (enc, reason)
    assert p.reason  # a human sentence accompanies every code


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        ("zstd, br, gzip, identity", "zstd"),
        ("zstd", "zstd"),
        ("br", "br"),
        ("gzip", "gzip"),
        ("identity", "identity"),
    ],
)
def test_acceptance_probes(accept, expected):
    # codec-spec §4.1: the engine acceptance probes, with the dictionary loaded.
    assert pick_encoding(accept, zstd_has_dict=True).encoding == expected


def test_server_support_limits_candidates():
    p = pick_encoding("br, zstd", zstd_has_dict=True, server_supports=("gzip", "identity"))
    assert p == Pick("identity", R.IDENTITY_LAST_RESORT, p.reason, ("identity",))
    assert pick_encoding("zstd, br", zstd_has_dict=True, server_supports=["br"]).encoding == "br"


@pytest.mark.parametrize(
    ("header", "codings", "star", "unspecified"),
    [
        (None, ("identity",), False, True),
        ("  ", ("identity",), False, True),
        ("GZIP, Br", ("gzip", "br", "identity"), False, False),
        ("br;q=0.5, gzip;q=1.0, zstd;q=0.8", ("gzip", "zstd", "br", "identity"), False, False),
        ("br;q=1.0, gzip;q=1.0", ("br", "gzip", "identity"), False, False),  # stable
        ("gzip, identity;q=0", ("gzip",), False, False),
        ("*;q=0", (), False, False),
        ("*;q=0, gzip", ("gzip", "identity"), False, False),
        ("*", ("identity",), True, False),  # recorded, not expanded
        ("gzip;q=abc, br", ("br", "identity"), False, False),  # malformed q drops the entry
        ("gzip ; q=0.000, br;Q=0.1", ("br", "identity"), False, False),
        ("identity;q=0.5, gzip", ("gzip", "identity"), False, False),
    ],
)
def test_accept_encoding_parsing(header, codings, star, unspecified):
    parsed = parse_accept_encoding(header)
    assert (parsed.codings, parsed.star, parsed.unspecified) == (codings, star, unspecified)


def _refused(header: str | None) -> set[str]:
    out = set()
    for entry in (header or "").split(","):
        name, _, params = entry.partition(";")
        if params.replace(" ", "").lower() in ("q=0", "q=0.0", "q=0.000"):
            out.add(name.strip().lower())
    return out


_ENCODING_OF = {
    R.DICT_ZSTD_DEFAULT: "zstd",
    R.BR_CONTENT_SAMPLE_LOW_ENTROPY: "br",
    R.BR_FALLBACK_NO_GZIP: "br",
    R.GZIP_NO_ZSTD_IN_ACCEPT: "gzip",
    R.GZIP_NO_DICT: "gzip",
    R.GZIP_MIDDLEWARE_DISABLED: "gzip",
    R.PER_STACK_OVERRODE_ZSTD: "gzip",
    R.IDENTITY_LAST_RESORT: "identity",
}


def _check_invariants(accept, has_dict, enabled, pick: Pick) -> None:
    accepted = parse_accept_encoding(accept).codings
    if pick.encoding == "zstd":
        assert has_dict and enabled, "zstd without a usable dictionary"
    assert pick.encoding in (*accepted, "identity")
    assert pick.encoding == "identity" or pick.encoding not in _refused(accept)
    assert _ENCODING_OF[pick.reason_code] == pick.encoding
    usable = {"gzip", "br"} | ({"zstd"} if has_dict and enabled else set())
    if pick.encoding == "identity":
        assert not usable & set(accepted), "identity although a coding was usable"
    if {"gzip", "br"} <= set(accepted) and pick.encoding == "br":
        assert pick.reason_code is R.BR_CONTENT_SAMPLE_LOW_ENTROPY


def test_full_documented_grid_invariants():
    for accept, (has_dict, enabled), stack, sample in itertools.product(
        ACCEPT_ENCODINGS, FLAGS, STACKS, SAMPLES.values()
    ):
        results = {
            pick_encoding(
                accept,
                estimated_size=size,
                interactive=interactive,
                zstd_has_dict=has_dict,
                zstd_enabled=enabled,
                stack_profile=stack,
                sample_bytes=sample,
            )
            for size in SIZES
            for interactive in (True, False)
        }
        # v0.5 dropped size thresholds and `interactive` has no effect.
        assert len(results) == 1
        pick = results.pop()
        _check_invariants(accept, has_dict, enabled, pick)
        # Built-in profiles all have ttftRatio 1: the stack never changes the choice.
        assert pick == pick_encoding(
            accept, zstd_has_dict=has_dict, zstd_enabled=enabled, sample_bytes=sample
        )


def test_builtin_profiles_match_the_spec():
    assert {
        k: (v.codings["zstd"].wire_coeff, v.codings["br"].wire_coeff)
        for k, v in BUILTIN_PROFILES.items()
    } == {"default": (0.04, 0.5), "sglang": (0.017, 0.733), "llama.cpp": (1.0, 1.0)}
    assert all(c.ttft_ratio == 1 for p in BUILTIN_PROFILES.values() for c in p.codings.values())


def test_reason_codes_are_a_closed_enum():
    assert {r.value for r in ReasonCode} == {
        "dict_zstd_default",
        "br_content_sample_low_entropy",
        "gzip_no_zstd_in_accept",
        "gzip_no_dict",
        "gzip_middleware_disabled",
        "per_stack_overrode_zstd",
        "per_stack_overrode_br",
        "br_fallback_no_gzip",
        "identity_last_resort",
    }


_token = st.sampled_from(["gzip", "br", "zstd", "identity", "*", "GZIP", "deflate", "x"])
_q = st.sampled_from(["", ";q=0", ";q=1", ";q=0.5", ";q=0.001", ";q=bad", "; q = 0.3"])


@settings(max_examples=200, deadline=None)
@given(
    entries=st.lists(st.tuples(_token, _q), max_size=6),
    has_dict=st.booleans(),
    enabled=st.booleans(),
    sample=st.one_of(st.none(), st.binary(max_size=256)),
    stack=st.sampled_from([None, "default", "sglang", "llama.cpp", "unknown", SLOW_ZSTD]),
)
def test_arbitrary_headers_keep_the_invariants(entries, has_dict, enabled, sample, stack):
    accept = ", ".join(t + q for t, q in entries)
    pick = pick_encoding(
        accept,
        zstd_has_dict=has_dict,
        zstd_enabled=enabled,
        stack_profile=stack,
        sample_bytes=sample,
    )
    if pick.encoding == "zstd":
        assert has_dict and enabled
    assert pick.encoding in (*parse_accept_encoding(accept).codings, "identity")
    assert _ENCODING_OF[pick.reason_code] == pick.encoding


def _distinct_codings(n: int) -> str:
    return ",".join(f"x{i}" for i in range(n))


def test_parsing_accept_encoding_is_linear_in_its_entries():
    # A 16 KiB header holds ~4,000 distinct codings; the parser rebuilt the set of the names
    # already ranked for every entry, so one such header held the event loop ~0.2 s.
    small = lines_run(parse_accept_encoding, _distinct_codings(500))
    large = lines_run(parse_accept_encoding, _distinct_codings(2000))
    assert large < 5 * small  # 4x the entries: linear work is ~4x, quadratic ~16x
