"""Tools and structured output for the embedded engine: what to constrain, and when.

A request's :class:`ToolPlan` says which tools go into the prompt, which may be called, and
which grammar (llama.cpp GBNF, :mod:`.json_schema_grammar`) constrains decoding:

=============================== ============================================================
request                          decoding
=============================== ============================================================
``response_format`` only         the schema's grammar from the first token
``tool_choice`` ``required``     a grammar of calls (one of the tools each) from the first token
a named tool                     a grammar of calls to that tool only
``auto`` (or unset), no format   free text; when the answer starts ``<tool_call>``, the
                                 generation restarts at that point under the grammar of the
                                 call's remainder (llama.cpp's "lazy grammar", done here:
                                 llama-cpp-python's ``generate`` takes eager grammars only)
``auto`` with a format           the format's grammar *or* the calls' grammar
``none``                         no tools in the prompt, no calls parsed; the format if any
=============================== ============================================================

So a call is always well-formed and its arguments match the tool's parameters (or, cut off
by ``max_tokens``, it is text: :mod:`.tool_output`); free text pays no grammar cost (about
+70% per token for a grammar that allows any text, measured on SmolLM2). Grammars are parsed
by llama.cpp once per distinct text and cached (:class:`GrammarCache`); a schema outside the
supported subset is refused before queueing, naming the keyword (:class:`ToolRequestError`).
"""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokenwire.gateway.ir import GenerationRequest, TokenDelta, ToolCallDelta, ToolSpec
from tokenwire.gateway.upstreams.base import new_call_id
from tokenwire.gateway.upstreams.escaped_gbnf import check_format
from tokenwire.gateway.upstreams.grammar_ir import UnsupportedGrammar
from tokenwire.gateway.upstreams.json_schema_grammar import (
    CALL_OPEN,
    UnsupportedSchema,
    call_grammar,
    check_repeats,
    describes_objects,
    normalise,
    response_grammar,
)
from tokenwire.gateway.upstreams.tool_output import CallScanner, ParsedCall

__all__ = ["GrammarCache", "Restart", "ToolPlan", "ToolRequestError", "ToolTurn", "plan_tools"]

#: Distinct grammars kept parsed: one per (tool set, format) a deployment sees; Codex sends
#: the same tools every turn, so a few dozen cover many clients.
GRAMMAR_CACHE_SIZE = 64


class ToolRequestError(ValueError):
    """The request's tools or format cannot be served; ``param`` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """What one request does with tools and formats (see the module table)."""

    prompt_tools: tuple[ToolSpec, ...] = ()  # rendered into the prompt
    callable_tools: tuple[ToolSpec, ...] = ()  # calls to these are parsed
    grammar: str | None = None  # from the first token
    tail_grammar: str | None = None  # after ``<tool_call>`` in auto mode

    @property
    def active(self) -> bool:
        return bool(self.callable_tools)


NO_TOOLS = ToolPlan()


class GrammarCache:
    """Grammar text, checked once by llama.cpp's own parser (``check``), kept LRU."""

    def __init__(self, check: Callable[[str], bool], size: int = GRAMMAR_CACHE_SIZE) -> None:
        self._check, self._size = check, size
        self._texts: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, build: Callable[[], str]) -> str:
        with self._lock:
            if key in self._texts:
                self._texts.move_to_end(key)
                return self._texts[key]
        text = build()
        if not self._check(text):
            raise ValueError("llama.cpp could not parse the grammar")
        with self._lock:
            self._texts[key] = text
            while len(self._texts) > self._size:
                self._texts.popitem(last=False)
        return text


def plan_tools(request: GenerationRequest, cache: GrammarCache) -> ToolPlan:
    """The request's :class:`ToolPlan`; raises :class:`ToolRequestError` (a 400)."""
    choice, fmt = request.tool_choice, request.response_format
    schema = _format_schema(request)
    if choice not in (None, "auto", "none") and not request.tools:
        raise ToolRequestError("tool_choice needs tools; none were declared", "tool_choice")
    if choice == "none" or not request.tools:
        if fmt is None:
            return NO_TOOLS
        _check_repeats([schema], fmt.param or "response_format")
        return ToolPlan(grammar=_cached(cache, "format", schema, lambda: response_grammar(
            schema), fmt.param or "response_format"))
    enforced = _normalised_tools(request.tools)  # what the grammar enforces
    _check_repeats([schema, *(t.parameters for t in enforced)], "tools",
                   _grammar_copies(request.tools))
    parallel = request.parallel_tool_calls is not False
    called, grammar_tools = request.tools, enforced
    if isinstance(choice, dict):
        picked = [i for i, t in enumerate(request.tools) if t.name == choice.get("name")]
        if not picked:
            raise ToolRequestError(f"tool_choice names {choice.get('name')!r}, which is not "
                                   "among the declared tools", "tool_choice")
        called, grammar_tools = (request.tools[picked[0]],), (enforced[picked[0]],)
    key = [[[t.name, t.kind, t.parameters, t.format] for t in grammar_tools], parallel]
    plan = functools.partial(ToolPlan, prompt_tools=request.tools, callable_tools=called)
    if choice in (None, "auto") and fmt is None:
        return plan(tail_grammar=_cached(cache, "tail", key, lambda: call_grammar(
            grammar_tools, parallel=parallel, after_open=True), "tools"))
    if choice in (None, "auto"):
        return plan(grammar=_cached(cache, "auto+format", [*key, schema], lambda: call_grammar(
            grammar_tools, parallel=parallel, or_schema=schema, or_object=schema is None),
            "tools"))
    return plan(grammar=_cached(cache, "calls", key, lambda: call_grammar(
        grammar_tools, parallel=parallel), "tools"))


def _format_schema(request: GenerationRequest) -> dict[str, Any] | None:
    fmt = request.response_format
    if fmt is None or fmt.schema is None:
        return None
    try:
        return normalise(fmt.schema)
    except UnsupportedSchema as exc:
        raise ToolRequestError(str(exc), fmt.param or "response_format") from None


def _check_repeats(schemas: list[dict[str, Any] | None], param: str, grammars: int = 0
                   ) -> None:
    try:
        check_repeats(schemas, grammars)
    except UnsupportedSchema as exc:
        raise ToolRequestError(str(exc), param) from None


def _grammar_copies(tools: tuple[ToolSpec, ...]) -> int:
    """What the custom tools' grammar formats write out; a format this engine cannot
    enforce is a 400 naming it (``tools[i].format``), like a schema's keyword."""
    total = 0
    for i, tool in enumerate(tools):
        if tool.kind != "custom":
            continue
        try:
            checked = check_format(tool.format)
        except UnsupportedGrammar as exc:
            raise ToolRequestError(f"tool {tool.name!r}: {exc}", f"tools[{i}].format"
                                   ) from None
        total += checked.copies if checked is not None else 0
    return total


def _normalised_tools(tools: tuple[ToolSpec, ...]) -> tuple[ToolSpec, ...]:
    out = []
    for i, tool in enumerate(tools):
        if tool.kind == "custom" or tool.parameters is None:
            out.append(tool)
            continue
        try:
            params = normalise(tool.parameters)
        except UnsupportedSchema as exc:
            raise ToolRequestError(f"tool {tool.name!r}: {exc}", f"tools[{i}]") from None
        if params and not describes_objects(params):  # ({} is an object's: no parameters)
            # The grammar would force a call whose arguments are, say, a string: no API can
            # carry it as a call, so it came back as text, even under tool_choice required.
            raise ToolRequestError(f"tool {tool.name!r}: its parameters must be a JSON Schema "
                                   'of "type": "object" (a call\'s arguments are an object)',
                                   f"tools[{i}]")
        out.append(ToolSpec(name=tool.name, kind=tool.kind, parameters=params))
    return tuple(out)


def _cached(cache: GrammarCache, kind: str, key: Any, build: Callable[[], str],
            param: str) -> str:
    try:
        return cache.get(json.dumps([kind, key], sort_keys=True), build)
    except (UnsupportedSchema, UnsupportedGrammar) as exc:
        raise ToolRequestError(str(exc), param) from None
    except (ValueError, AssertionError, KeyError, TypeError) as exc:
        # The port asserts on what it cannot convert; llama.cpp refuses what it cannot parse
        # (in practice a `pattern` repeating what can be empty, ^(a*)*$, which would loop).
        raise ToolRequestError(f"this schema cannot be enforced by constrained decoding "
                               f"({type(exc).__name__}: {exc}); a 'pattern' may use only "
                               "the regular part of Python's re, and repeat with * or + "
                               "only what cannot be empty", param) from None


# -- one generation ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Restart:
    """Regenerate from ``kept`` generated tokens, after ``text`` (up to ``<tool_call>``)."""

    kept: int
    text: str


class ToolTurn:
    """Per generation: each token's text in, text deltas and calls out (``feed``); in auto
    mode, sets ``restart`` when the answer began a call (the engine then regenerates from
    there under the call grammar)."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.scanner = CallScanner(plan.callable_tools)
        self.constrained = plan.grammar is not None
        self.restart: Restart | None = None
        self._answer = ""  # the answer's text as generated (the scanner's offsets)
        self._ends = [0]  # len(self._answer) after each token
        self._pending: list[int] = []  # ids of text not yet released
        self.calls = 0
        #: The model repeated a call it already made in this answer: the engine stops there
        #: (a tiny model repeats a forced call until ``max_tokens``; an identical second
        #: call would only run the same thing twice).
        self.repeated = False
        self._made: set[tuple[str, str]] = set()

    def feed(self, tok: int | None, text: str) -> list[TokenDelta | ToolCallDelta]:
        """One token's text; ``tok=None`` at the end, with the detokenizer's flushed text."""
        self._answer += text
        self._ends.append(len(self._answer))
        if tok is None:
            return self._events([*self.scanner.feed(text), *self.scanner.flush()])
        self._pending.append(tok)
        items = self.scanner.feed(text)
        if self.scanner.in_call and not self.constrained:
            start = self.scanner.call_start
            kept = max(i for i, end in enumerate(self._ends) if end <= start)
            # Text between the last kept token and the tag was shown already; the engine
            # sends it again as prompt text, whole, followed by the tag.
            self.restart = Restart(kept=kept,
                                   text=self._answer[self._ends[kept]:start] + CALL_OPEN)
            self.scanner.restart_call()
            self.constrained = True
            self._answer = self._answer[:start + len(CALL_OPEN)]
        return self._events(items)

    def _events(self, items: list[str | ParsedCall]) -> list[TokenDelta | ToolCallDelta]:
        out: list[TokenDelta | ToolCallDelta] = []
        for item in items:
            if isinstance(item, str):
                out.append(TokenDelta(ids=tuple(self._pending), text=item))
            elif (item.name, item.arguments) in self._made or self.repeated:
                self.repeated = True
            else:
                self._made.add((item.name, item.arguments))
                out.append(ToolCallDelta(index=self.calls, id=new_call_id(),
                                         name=item.name, arguments=item.arguments,
                                         kind=item.kind))
                self.calls += 1
            self._pending = []
        return out
