"""The whole-request deadline's arithmetic (the trickling servers are in test_hostile_server)."""

from __future__ import annotations

import math

import httpx
import pytest

from tokenwire.cli.main import main
from tokenwire.client.codec_client import CodecClient
from tokenwire.client.deadline import Deadline


def test_each_wait_is_cut_to_the_time_left() -> None:
    cut = Deadline(30.0).timeout(httpx.Timeout(60.0, connect=10.0))
    assert cut.connect == 10.0 and 29.0 < cut.read <= 30.0 and cut.pool <= 30.0


@pytest.mark.parametrize("seconds", [None, math.inf])
def test_no_deadline_leaves_the_waits_as_they_are(seconds) -> None:
    # An infinite deadline must not become an infinite socket timeout (OverflowError).
    base = httpx.Timeout(None)
    assert Deadline(seconds).timeout(base) is base


@pytest.mark.parametrize("seconds", [0, -1, math.nan])
def test_a_deadline_that_is_not_a_positive_number_is_refused_at_once(seconds) -> None:
    with pytest.raises(ValueError, match="positive number of seconds"):
        CodecClient("http://127.0.0.1:1", deadline=seconds)


@pytest.mark.parametrize("value", ["-1", "nan"])
def test_the_command_line_refuses_a_negative_or_nan_deadline(value, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["complete", "--url", "http://127.0.0.1:1", "--deadline", value, "Hi"])
    assert "--deadline: must be 0 (no deadline) or more" in capsys.readouterr().err
