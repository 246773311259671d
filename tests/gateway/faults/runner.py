"""Runs one fault-table row on one client API and checks it against the row.

Shared by ``test_faults.py`` (assertions) and ``report.py`` (the markdown table), so the
table printed for the docs is exactly what the tests measured.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from tokenwire.codec.maps import TokenizerMap, bundled_map_path, load_map_file
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.supervision.supervisor import SERVED_MODEL_HEADER

from .harness import (
    FALLBACK,
    FALLBACK_FIRST_ID,
    FALLBACK_PROMPT_TOKENS,
    MODEL,
    Env,
    Outcome,
    environment,
    run_in_looptime,
    send,
)
from .scripted_upstream import FIRST_ID
from .table import FALLBACK_TEXT, TEXT, Row

__all__ = ["GRADES", "Result", "check", "grade", "run_row"]

#: pass: the client got a whole, right answer; safe: a clear typed failure (or an honest
#: partial one ending in an error), by design; fail: anything the row does not allow.
GRADES = ("pass", "safe", "fail")
_OTHER_MAP = Path(__file__).parents[2] / "fixtures" / "maps" / "microsoft" / "phi-3.json"


@cache
def _maps(which: str) -> tuple[TokenizerMap, TokenizerMap]:
    """The two models' maps with a fallback: SmolLM2's for the primary, the same or Phi-3's
    (tests/fixtures/maps, MIT) for the fallback."""
    smol = load_map_file(bundled_map_path("huggingfacetb/smollm2"))
    return smol, smol if which == "same" else load_map_file(_OTHER_MAP)


@dataclass
class Result:
    """What one row did on one API: per client request, its outcome and attempt times."""

    row: Row
    api: str
    outcomes: list[Outcome] = field(default_factory=list)
    attempts: list[list[float]] = field(default_factory=list)  # loop times from the request
    disconnects: int = 0
    with_fallback: bool = False
    fallback_attempts: list[int] = field(default_factory=list)  # per client request
    fallbacks_counted: float = 0.0  # tokenwire_fallbacks_total at the end

    @property
    def first(self) -> Outcome:
        return self.outcomes[0]


def run_row(row: Row, api: str, *, fallback: bool = False) -> Result:
    """One fresh deployment (upstream, gateway, client in one looptime loop) per run;
    ``fallback``: with a second upstream serving the primary's fallback model."""
    async def main() -> Result:
        settings = dataclasses.replace(ServerSettings(), **row.settings)
        extra = dict(fallback=list(row.fallback_script),
                     maps=_maps(row.fallback_map)) if fallback else {}
        async with environment(list(row.script), cycle=row.cycle, settings=settings,
                               refused=row.refused, kind=row.kind, **extra) as env:
            return await _requests(env, row, api)
    return run_in_looptime(main)


async def _requests(env: Env, row: Row, api: str) -> Result:
    loop = asyncio.get_running_loop()
    result = Result(row=row, api=api, with_fallback=env.fallback is not None)
    for _ in range(row.requests):
        seen = len(env.upstream.attempts)
        fb_seen = len(env.fallback.attempts) if env.fallback is not None else 0
        t0 = loop.time()
        result.outcomes.append(await send(env, api))
        result.attempts.append([a.at - t0 for a in env.upstream.attempts[seen:]])
        if env.fallback is not None:
            result.fallback_attempts.append(len(env.fallback.attempts) - fb_seen)
    result.disconnects = env.upstream.disconnects
    if env.fallback is not None:
        result.fallbacks_counted = env.fallbacks_counted()
    return result


def _effective(row: Row, api: str, with_fallback: bool) -> tuple[Row, str, int]:
    """(the row as it holds on ``api``, the answer's text, its first id): with a fallback
    that serves this API, a whole answer of the fallback's, once the primary gave up."""
    if with_fallback and row.fallback_elapsed is not None:
        row = dataclasses.replace(row, elapsed=row.fallback_elapsed)
    if not with_fallback or api not in row.falls_back:
        return row, TEXT, FIRST_ID
    served = dataclasses.replace(
        row, responses="completed", chat="finish:stop", codec="eos_token", partial=None,
        message=None, chat_status=None)
    return served, FALLBACK_TEXT, FALLBACK_FIRST_ID


def _expected(row: Row, api: str) -> tuple[str, str | None]:
    """(terminal kind, code) the row expects on ``api``."""
    spec = {"responses": row.responses, "chat": row.chat, "codec": row.codec}[api]
    if api == "codec":
        return "frame", spec
    kind, _, code = spec.partition(":")
    return kind, code or None


def check(result: Result) -> list[str]:
    """Every way the result differs from its row; empty when it matches."""
    api, problems = result.api, []
    row, text, first_id = _effective(result.row, api, result.with_fallback)
    want_kind, want_code = _expected(row, api)
    for n, (out, times) in enumerate(zip(result.outcomes, result.attempts, strict=True)):
        where = f"request {n + 1}: " if row.requests > 1 else ""
        found = _check_one(row, api, out, times, want_kind, want_code, text, first_id)
        if result.with_fallback:
            found += _check_fallback(result, out, result.fallback_attempts[n])
        problems += [where + p for p in found]
    if result.with_fallback:
        took = _fallback_taken(result.row, api)
        want = float(row.requests if took else 0)
        if result.fallbacks_counted != want:
            problems.append(f"tokenwire_fallbacks_total is {result.fallbacks_counted:g}, "
                            f"expected {want:g}")
    return problems


def _fallback_taken(row: Row, api: str) -> bool:
    return api in row.falls_back or (row.fallback_attempts or (0, 0))[0] > 0


def _check_fallback(result: Result, out: Outcome, fb_attempts: int) -> list[str]:
    """Who served it, seen by the client: attempts on the fallback, the ``model`` the body
    names, the served-model header, and the fallback's own usage."""
    row, api, problems = result.row, result.api, []
    serves = api in row.falls_back
    lo, hi = row.fallback_attempts or ((1, 1) if serves else (0, 0))
    if not lo <= fb_attempts <= hi:
        problems.append(f"{fb_attempts} fallback attempts, expected {lo}..{hi}")
    named = FALLBACK if serves else MODEL
    # An error body names no model; an answer always does (and a failed stream's chunks).
    if api != "codec" and ((serves and not out.models) or out.models[-1:] not in ([], [named])):
        problems.append(f"the answer names model {out.models[-1:]}, expected {named!r}")
    if api == "chat" and set(out.models) - {named}:
        problems.append(f"chunks name models {sorted(set(out.models))}, expected {named!r}")
    header = out.headers.get(SERVED_MODEL_HEADER.lower())
    # Sent only when the fallback came before the head: never on a Responses stream (its
    # head goes out at once), nor after a heartbeat opened the stream.
    if serves and api != "responses" and not out.heartbeats and header != FALLBACK:
        problems.append(f"{SERVED_MODEL_HEADER} is {header!r}, expected {FALLBACK!r}")
    if not _fallback_taken(row, api) and header is not None:
        problems.append(f"{SERVED_MODEL_HEADER} is {header!r} without a fallback")
    if serves and api == "responses" and out.prompt_tokens != FALLBACK_PROMPT_TOKENS:
        problems.append(f"usage.input_tokens is {out.prompt_tokens}, expected the "
                        f"fallback's {FALLBACK_PROMPT_TOKENS}")
    if not serves and row.fallback_message and row.fallback_message not in (out.message or ""):
        problems.append(f"message {out.message!r} lacks {row.fallback_message!r}")
    return problems


def grade(result: Result) -> str:
    """One of :data:`GRADES` for the docs' table."""
    if check(result):
        return "fail"
    row, _, _ = _effective(result.row, result.api, result.with_fallback)
    return "pass" if row.success and all(o.succeeded for o in result.outcomes) else "safe"


def _check_one(row: Row, api: str, out: Outcome, times: list[float], want_kind: str,
               want_code: str | None, text: str = TEXT,
               first_id: int = FIRST_ID) -> list[str]:
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
    if row.success and api != "codec" and out.text != text:
        problems.append(f"the answer is {out.text!r}")
    if row.success and api == "codec" and out.ids != _ids(text, first_id):
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


def _ids(text: str, first_id: int = FIRST_ID) -> list[int]:
    """The ids the scripted upstream sends for ``text``: one per space-separated piece."""
    return [first_id + i for i in range(len(text.split(" ")))]


def _seen(out: Outcome) -> str:
    return f"{out.summary()} after {out.elapsed:.2f} s"
