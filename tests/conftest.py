"""Shared test fixtures: paths to the copied data under tests/fixtures/ (see its README)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
CODEC_FIXTURES = FIXTURES / "codec"
MAPS = FIXTURES / "maps"


def fixture_map_path(map_id: str) -> Path:
    return MAPS / f"{map_id}.json"


def corpus() -> dict[str, list[str]]:
    """The differential-test corpus: category -> samples (tests/fixtures/corpus/build.py)."""
    return json.loads((FIXTURES / "corpus" / "corpus.json").read_text("utf-8"))


@pytest.fixture(scope="session")
def corpus_samples() -> list[str]:
    return [s for samples in corpus().values() for s in samples]
