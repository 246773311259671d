"""The fault table as measured, in markdown (for BENCHMARKS.md or the docs).

Run ``.venv/bin/python -m tests.gateway.faults.report``: every row of ``table.py`` on the
Responses, Chat Completions and Codec APIs, each in its own looptime loop exactly as
``test_faults.py`` runs it, printed as one markdown table on stdout. Attempts and times are
what was measured (loop seconds from the request to the end of the response, so the
numbers are deterministic up to the seed's jitter); a cell that differs from its row's
expectation is marked with a warning sign, and the rows' known defects are listed under the
table.
"""

from __future__ import annotations

import sys

from .harness import APIS
from .runner import Result, check, run_row
from .table import ROWS, Row

__all__ = ["main", "markdown"]

_HEADER = ("| Fault | Budget | Upstream attempts | Loop time (s) | Responses | Chat Completions "
           "| Codec (msgpack) |\n|---|---|---|---|---|---|---|")


def _attempts(results: list[Result]) -> str:
    counts = sorted({len(times) for r in results for times in r.attempts})
    text = "-".join(str(c) for c in (counts[0], counts[-1])) if len(counts) > 1 \
        else str(counts[0])
    return text + (" per request" if results[0].row.requests > 1 else "")


def _times(results: list[Result]) -> str:
    times = sorted(o.elapsed for r in results for o in r.outcomes)
    lo, hi = times[0], times[-1]
    return f"{lo:.1f}" if hi - lo < 0.05 else f"{lo:.1f}-{hi:.1f}"


def _cell(result: Result) -> str:
    out = result.first
    cell = out.summary()
    if out.text and not out.succeeded and result.row.partial:
        cell += f" after {out.text!r}"
    if out.heartbeats:
        cell += f", {len(out.heartbeats)} heartbeats"
    return cell + (" ⚠" if check(result) else "")


def markdown(rows: tuple[Row, ...] = ROWS) -> str:
    """Run every row on every API; the table and the notes under it."""
    lines, notes = [_HEADER], []
    for row in rows:
        results = {api: run_row(row, api) for api in APIS if api in row.apis}
        ran = list(results.values())
        cells = [_cell(results[api]) if api in results else "n/a (text-only upstream)"
                 for api in APIS]
        lines.append(f"| {row.fault} | {row.budget} | {_attempts(ran)} "
                     f"(expected {_range(row.attempts)}) | {_times(ran)} "
                     f"(bound {_range(row.elapsed)}) | " + " | ".join(cells) + " |")
        for r in ran:
            problems = check(r)
            if problems:
                known = r.row.xfail.get(r.api)
                notes.append(f"- `{row.id}` on {r.api}: " + "; ".join(problems)
                             + (f" (known defect: {known})" if known else ""))
    text = "\n".join(lines)
    if notes:
        text += "\n\n⚠ differs from the expectation:\n\n" + "\n".join(notes)
    return text + "\n"


def _range(bounds: tuple[float, float]) -> str:
    lo, hi = bounds
    return f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"


def main() -> int:
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
