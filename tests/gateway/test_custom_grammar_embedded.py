"""A custom tool's grammar on the embedded engine: Codex's ``apply_patch`` (its Lark
grammar, as Codex 0.171.0 sends the tool) called by SmolLM2-135M yields a patch that the
grammar parses (the ``lark`` package is the oracle), through the Responses API."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import lark
import pytest

pytestmark = pytest.mark.slow

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "codex" / "apply_patch_tool.json"
#: Codex 0.171.0's apply_patch tool, as its request sends it (tests/fixtures/README.md).
APPLY_PATCH = json.loads(FIXTURE.read_text())
#: Lark refuses a terminal that matches the empty string; ``/(.+)/?`` is ``/(.*)/``.
ORACLE = lark.Lark(APPLY_PATCH["format"]["definition"].replace("/(.*)/", "/(.+)/?"),
                   parser="earley", lexer="dynamic_complete")


#: What Codex's own instructions say of apply_patch, in short, with its example's shape.
INSTRUCTIONS = ("You are a coding agent. Edit files with the apply_patch tool. A patch that "
                "creates a file looks like this:\n*** Begin Patch\n*** Add File: a.txt\n"
                "+first line\n*** End Patch")


@pytest.fixture(scope="module")
def live(engine, serve):
    return serve(engine)


@pytest.mark.parametrize("task", [
    "Create the file hello.txt containing the line: hello world",
    'Delete the file "old\\notes.md".',
])
def test_a_forced_apply_patch_call_is_a_patch_its_grammar_parses(live, task) -> None:
    body = {"model": "smollm2", "instructions": INSTRUCTIONS,
            "input": [{"type": "message", "role": "user",
                       "content": [{"type": "input_text", "text": task}]}],
            "tools": [APPLY_PATCH], "tool_choice": {"type": "custom", "name": "apply_patch"},
            "parallel_tool_calls": False, "temperature": 0, "max_output_tokens": 160,
            "stream": False}
    done = httpx.post(live.url + "/v1/responses", json=body, timeout=600)
    assert done.status_code == 200, done.text
    answer = done.json()
    calls = [item for item in answer["output"] if item["type"] == "custom_tool_call"]
    print(answer["status"], json.dumps(answer["output"], ensure_ascii=False)[:600])
    assert calls, answer  # greedy, bounded: SmolLM2 closes the patch well before the bound
    assert calls[0]["name"] == "apply_patch"
    ORACLE.parse(calls[0]["input"])


def test_a_grammar_outside_the_subset_is_a_400_naming_the_format(live) -> None:
    tool = {**APPLY_PATCH, "format": {"type": "grammar", "syntax": "regex",
                                      "definition": "(?=a)a"}}
    done = httpx.post(live.url + "/v1/responses", timeout=60, json={
        "model": "smollm2", "input": "Hi", "tools": [tool], "max_output_tokens": 5})
    assert done.status_code == 400, done.text
    error = done.json()["error"]
    assert error["param"] == "tools[0].format" and "'(?='" in error["message"]
