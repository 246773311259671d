"""finish_reason (codec-spec §5.7): engine -> wire mapping, legacy mode, client normalisation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenwire.codec.finish_reason import (
    ClientFinishReason,
    FinishReason,
    normalize_finish_reason,
    wire_finish_reason,
)

SPEC_SET = {"eos_token", "stop_sequence", "length", "error", "policy_violation"}

# engine reason, matched stop, spec value, legacy value
SERVER_TABLE = [
    ("stop", None, "eos_token", "stop"),
    ("stop", 151643, "eos_token", "stop"),  # sglang reports the EOS id as an int
    ("stop", "\n\n", "stop_sequence", "stop"),  # a stop string matched
    ("STOP", "###", "stop_sequence", "stop"),
    ("eos", None, "eos_token", "stop"),
    ("eos_token", None, "eos_token", "stop"),
    ("stop_sequence", None, "stop_sequence", "stop"),
    ("length", None, "length", "length"),
    ("max_tokens", None, "length", "length"),
    ("abort", None, "error", "error"),
    ("error", None, "error", "error"),
    ("policy_violation", None, "policy_violation", "policy_violation"),
    ("content_filter", None, "policy_violation", "policy_violation"),
    ("tool_calls", None, "eos_token", "stop"),
    ("something_new", None, "error", "error"),
    ("", None, "error", "error"),
    (None, None, "error", "error"),
]


@pytest.mark.parametrize(("engine", "matched", "spec", "legacy"), SERVER_TABLE)
def test_server_maps_engine_reasons_to_the_spec_set(engine, matched, spec, legacy):
    assert wire_finish_reason(engine, matched_stop=matched) == spec
    assert wire_finish_reason(engine, matched_stop=matched, legacy=True) == legacy


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ((0, 2), "error"),
        ((0, 3), "error"),
        ((0, 4), "policy_violation"),
        ((0, 5), "policy_violation"),
    ],
)
def test_policy_violation_only_for_v04_clients(version, expected):
    assert wire_finish_reason("policy_violation", client_version=version) == expected


CLIENT_TABLE = [
    ("stop", ClientFinishReason.STOP),
    ("length", ClientFinishReason.LENGTH),
    ("eos_token", ClientFinishReason.EOS_TOKEN),
    ("stop_sequence", ClientFinishReason.STOP_SEQUENCE),
    ("abort", ClientFinishReason.ABORT),
    ("error", ClientFinishReason.ERROR),
    ("policy_violation", ClientFinishReason.POLICY_VIOLATION),
    ("content_filter", ClientFinishReason.ERROR),  # unknown -> error
    ("Stop", ClientFinishReason.ERROR),  # wire values are exact lower case
    ("", ClientFinishReason.ERROR),
    (None, None),  # non-final frames carry none
]


@pytest.mark.parametrize(("value", "expected"), CLIENT_TABLE)
def test_client_normalises_both_vocabularies_unknown_is_error(value, expected):
    assert normalize_finish_reason(value) == expected


def test_natural_stops():
    natural = {r for r in ClientFinishReason if r.is_natural_stop}
    assert {r.value for r in natural} == {"stop", "eos_token", "stop_sequence"}


@given(st.one_of(st.none(), st.text(max_size=20)), st.booleans())
def test_server_output_is_always_in_the_wire_set(engine, legacy):
    out = wire_finish_reason(engine, legacy=legacy)
    assert out in (SPEC_SET | {"stop"} if legacy else SPEC_SET)
    assert normalize_finish_reason(out) is not ClientFinishReason.ERROR or out == "error"


def test_spec_enum_is_the_spec_set():
    assert {r.value for r in FinishReason} == SPEC_SET
