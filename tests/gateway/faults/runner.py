"""Runs one fault-table row on one client API and checks it against the row.

Shared by ``test_faults.py`` (assertions) and ``report.py`` (the markdown table), so the
table printed for the docs is exactly what the tests measured.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from dataclasses import dataclass, field

from tokenwire.gateway.settings import ServerSettings

from .harness import Env, Outcome, environment, run_in_looptime, send
from .scripted_upstream import FIRST_ID
from .table import TEXT, Row

__all__ = ["Result", "check", "run_row"]


@dataclass
class Result:
    """What one row did on one API: per client request, its outcome and attempt times."""

    row: Row
    api: str
    outcomes: list[Outcome] = field(default_factory=list)
    attempts: list[list[float]] = field(default_factory=list)  # loop times from the request
    disconnects: int = 0

    @property
    def first(self) -> Outcome:
        return self.outcomes[0]


def run_row(row: Row, api: str) -> Result:
    """One fresh deployment (upstream, gateway, client in one looptime loop) per run."""
    async def main() -> Result:
        settings = dataclasses.replace(ServerSettings(), **row.settings)
        async with environment(list(row.script), cycle=row.cycle, settings=settings,
                               refused=row.refused, kind=row.kind) as env:
            return await _requests(env, row, api)
    return run_in_looptime(main)


async def _requests(env: Env, row: Row, api: str) -> Result:
    loop = asyncio.get_running_loop()
    result = Result(row=row, api=api)
    for _ in range(row.requests):
        seen = len(env.upstream.attempts)
        t0 = loop.time()
        result.outcomes.append(await send(env, api))
        result.attempts.append([a.at - t0 for a in env.upstream.attempts[seen:]])
    result.disconnects = env.upstream.disconnects
    return result


def _expected(row: Row, api: str) -> tuple[str, str | None]:
    """(terminal kind, code) the row expects on ``api``."""
    spec = {"responses": row.responses, "chat": row.chat, "codec": row.codec}[api]
    if api == "codec":
        return "frame", spec
    kind, _, code = spec.partition(":")
    return kind, code or None


def check(result: Result) -> list[str]:
    """Every way the result differs from its row; empty when it matches."""
    row, api, problems = result.row, result.api, []
    want_kind, want_code = _expected(row, api)
    for n, (out, times) in enumerate(zip(result.outcomes, result.attempts, strict=True)):
        where = f"request {n + 1}: " if row.requests > 1 else ""
        problems += [where + p for p in _check_one(row, api, out, times, want_kind, want_code)]
    return problems


def _check_one(row: Row, api: str, out: Outcome, times: list[float], want_kind: str,
               want_code: str | None) -> list[str]:
    problems: list[str] = []
    got = _seen(out)
    # The invariant above all: a fault never reaches a client as a whole answer.
    if not row.success and out.succeeded and not row.responses.startswith("incomplete"):
        problems.append(f"a failure presented as success: {got}")
    if api == "chat" and out.terminal == "finish" and want_kind == "error":
        problems.append(f"a failed Chat stream ended with finish_reason {out.code!r}")
    if out.terminal == "http":
        ok = want_kind in ("failed", "error") or (api == "codec" and want_code == "error")
        if not ok:
            problems.append(f"expected {want_kind}:{want_code}, got {got}")
        elif api == "responses" and out.code != want_code:
            problems.append(f"expected code {want_code!r}, got {got}")
        elif api == "chat" and out.code != want_code:
            problems.append(f"expected code {want_code!r}, got {got}")
        if api == "chat" and row.chat_status is not None and out.status != row.chat_status:
            problems.append(f"expected HTTP {row.chat_status}, got {got}")
    elif (out.terminal, out.code) != (want_kind, want_code):
        problems.append(f"expected {want_kind}:{want_code}, got {got}")
    if row.partial is not None and api != "codec" and out.text != row.partial:
        problems.append(f"expected the partial text {row.partial!r}, got {out.text!r}")
    if row.partial is not None and api == "codec" and out.ids != _ids(row.partial):
        problems.append(f"expected the partial ids {_ids(row.partial)}, got {out.ids}")
    if row.success and api != "codec" and out.text != TEXT:
        problems.append(f"the answer is {out.text!r}")
    if row.success and api == "codec" and out.ids != _ids(TEXT):
        problems.append(f"the answer's ids are {out.ids}")
    if row.message is not None and api == "responses" and row.message not in (out.message or ""):
        problems.append(f"message {out.message!r} lacks {row.message!r}")
    lo, hi = row.attempts
    if not lo <= len(times) <= hi:
        problems.append(f"{len(times)} upstream attempts, expected {lo}..{hi}")
    lo_t, hi_t = row.elapsed
    if not lo_t <= out.elapsed <= hi_t:
        problems.append(f"took {out.elapsed:.2f} loop s, expected {lo_t}..{hi_t}")
    waits = [b - a for a, b in itertools.pairwise(times)]
    for i, ((g_lo, g_hi), wait) in enumerate(zip(row.gaps, waits, strict=False)):
        if not g_lo <= wait <= g_hi:
            problems.append(f"wait {i + 1} was {wait:.2f} s, expected {g_lo:.2f}..{g_hi:.2f}")
    return problems


def _ids(text: str) -> list[int]:
    """The ids the scripted upstream sends for ``text``: one per space-separated piece."""
    return [FIRST_ID + i for i in range(len(text.split(" ")))]


def _seen(out: Outcome) -> str:
    return f"{out.summary()} after {out.elapsed:.2f} s"
