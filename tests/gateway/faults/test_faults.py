"""The fault table (``table.py``) on the Responses, Chat Completions and Codec APIs.

Each case starts a scripted upstream and a gateway over it in one ``looptime`` loop, sends one
streaming request (several for a flapping upstream), and compares the client's outcome, the
upstream attempts and the elapsed loop time with the row. A product defect is an
``xfail(strict=True)`` case naming the defect (the row's ``xfail``), so the fix flips it.
"""

from __future__ import annotations

import pytest

from .runner import check, run_row
from .table import ROWS, Row


def _cases(*, fallback: bool) -> list[object]:
    cases = []
    for row in ROWS:
        if row.fallback_only and not fallback:
            continue
        for api in row.apis:
            marks = [pytest.mark.xfail(strict=True, reason=row.xfail[api])] \
                if api in row.xfail else []
            cases.append(pytest.param(row, api, id=f"{row.id}-{api}", marks=marks))
    return cases


@pytest.mark.parametrize(("row", "api"), _cases(fallback=False))
def test_fault(row: Row, api: str) -> None:
    result = run_row(row, api)
    problems = check(result)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("row", "api"), _cases(fallback=True))
def test_fault_with_fallback(row: Row, api: str) -> None:
    """The same row with a fallback model configured (issue 13): it serves the rows it
    should, whole and named, and changes nothing in the others."""
    result = run_row(row, api, fallback=True)
    problems = check(result)
    assert not problems, "\n".join(problems)
