"""The fault table as measured, in markdown (for docs/failure-semantics.md).

Run ``.venv/bin/python -m tests.gateway.faults.report``: every row of ``table.py`` on the
Responses, Chat Completions and Codec APIs, each in its own looptime loop exactly as
``test_faults.py`` runs it, printed as two markdown tables on stdout: without a fallback,
and with one configured (issue 13). Attempts and times are what was measured (loop seconds
from the request to the end of the response, so the numbers are deterministic up to the
seed's jitter); each API's grade is ``pass`` (a whole, right answer), ``safe`` (a clear
typed failure, by design) or ``fail`` (anything the row does not allow, marked with a
warning sign and listed under the table).
"""

from __future__ import annotations

import sys

from .harness import APIS, FALLBACK
from .runner import Result, check, grade, run_row
from .table import ROWS, Row

__all__ = ["main", "markdown"]

_HEADER = ("| Fault | Budget | Upstream attempts | Loop time (s) | Responses | Chat Completions "
           "| Codec (msgpack) | Grade (R / C / Codec) |\n|---|---|---|---|---|---|---|---|")
_FB_HEADER = ("| Fault | The fallback | Primary / fallback attempts | Loop time (s) | Responses "
              "| Chat Completions | Codec (msgpack) | Grade (R / C / Codec) |\n"
              "|---|---|---|---|---|---|---|---|")


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
    if result.with_fallback and result.api in result.row.falls_back:
        cell += f" from `{FALLBACK}`"
    if out.text and not out.succeeded and result.row.partial:
        cell += f" after {out.text!r}"
    if out.heartbeats:
        cell += f", {len(out.heartbeats)} heartbeats"
    return cell + (" ⚠" if check(result) else "")


def _grades(results: dict[str, Result]) -> str:
    return " / ".join(grade(results[api]) if api in results else "n/a" for api in APIS)


def _fallback_role(row: Row) -> str:
    """What the fallback does in this row, in words."""
    if row.falls_back:
        served = "it" if set(row.falls_back) == set(row.apis) else " and ".join(
            {"responses": "Responses", "chat": "Chat", "codec": "Codec"}[a]
            for a in row.falls_back)
        return f"serves {served}" + ("; Codec: not tried (another map)"
                                     if row.fallback_map != "same" else "")
    if row.fallback_attempts:
        return "asked, fails: the client gets the primary's failure"
    if row.success:
        return "not asked (the primary answers)"
    if row.id.startswith("content-filter"):
        return "not asked (a filter never falls back)"
    if row.partial is not None:
        return "not asked (output was already sent)"
    return "not asked (the request's own failure)"


def _notes(row: Row, results: list[Result]) -> list[str]:
    notes = []
    for r in results:
        problems = check(r)
        if problems:
            known = r.row.xfail.get(r.api)
            where = " with a fallback" if r.with_fallback else ""
            notes.append(f"- `{row.id}` on {r.api}{where}: " + "; ".join(problems)
                         + (f" (known defect: {known})" if known else ""))
    return notes


def markdown(rows: tuple[Row, ...] = ROWS) -> str:
    """Run every row on every API, without and with a fallback; the tables and notes."""
    lines, fb_lines, notes = [_HEADER], [_FB_HEADER], []
    for row in rows:
        cells_na = "n/a (text-only upstream)"
        if not row.fallback_only:
            results = {api: run_row(row, api) for api in APIS if api in row.apis}
            ran = list(results.values())
            cells = [_cell(results[api]) if api in results else cells_na for api in APIS]
            lines.append(f"| {row.fault} | {row.budget} | {_attempts(ran)} "
                         f"(expected {_range(row.attempts)}) | {_times(ran)} "
                         f"(bound {_range(row.elapsed)}) | " + " | ".join(cells)
                         + f" | {_grades(results)} |")
            notes += _notes(row, ran)
        fb = {api: run_row(row, api, fallback=True) for api in APIS if api in row.apis}
        fb_ran = list(fb.values())
        fb_cells = [_cell(fb[api]) if api in fb else cells_na for api in APIS]
        fb_counts = sorted({n for r in fb_ran for n in r.fallback_attempts})
        fb_lines.append(f"| {row.fault} | {_fallback_role(row)} | {_attempts(fb_ran)} / "
                        + "-".join(str(c) for c in dict.fromkeys((fb_counts[0],
                                                                 fb_counts[-1])))
                        + f" | {_times(fb_ran)} | " + " | ".join(fb_cells)
                        + f" | {_grades(fb)} |")
        notes += _notes(row, fb_ran)
    text = "\n".join(lines) + "\n\n### With a fallback configured\n\n" + "\n".join(fb_lines)
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
