"""The Codex CLI against the balancer in front of three instances on one Redis (issue 16).

A two-turn session: ``codex exec`` runs a tool call (two requests: the call, then its
output), then ``codex exec resume --last`` asks a follow-up (a third request carrying the
whole conversation). The balancer gives each request to the next instance, so the three
requests land on three different instances (its counters say so); the upstream is a
scripted Chat Completions server (the faster choice: the embedded-engine Codex runs are
in tests/gateway/test_codex_cli*.py). What must hold: both turns complete without a
reconnect, the tool's real output comes back under the upstream's call id, and the third
request, served by the third instance, carries the first two turns' content.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.cluster.harness import balancer_url, pool_config, running_cluster
from tests.gateway.codex_cli import CODEX, KEY_ENV, CodexRun, codex_config, exec_codex
from tests.gateway.test_codex_cli import _command_call
from tests.gateway.upstreams.fakes import Reply, ToolScript, chat_stream, start_fake

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CODEX.exists(), reason=(
    "the Codex CLI is not installed: run scripts/codex-install.sh (needs node + npm)"))]


def _codex(args: list[str], home: Path, work: Path, tmp: Path) -> CodexRun:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp),
           "CODEX_HOME": str(home), KEY_ENV: "tw-dummy-key", "LANG": "C.UTF-8"}
    return exec_codex(args, env, work)


def _respond(path: str, body: dict) -> Reply:
    msgs = body["messages"]
    if msgs[-1]["role"] == "tool":
        return Reply(chunks=chat_stream("vllm", ["The command printed hello."]))
    if any(m["role"] == "tool" for m in msgs):  # the resumed turn: history is replayed
        return Reply(chunks=chat_stream("vllm", ["It printed hello, as before."]))
    name, args = _command_call(body.get("tools") or [])
    return Reply(chunks=chat_stream("vllm", tools=[ToolScript(
        0, "call_tw1", name, (args[:6], args[6:]))], finish="tool_calls"))


def test_codex_two_turns_across_three_instances(redis_server, tmp_path) -> None:
    fake = start_fake(_respond)
    try:
        config = pool_config(tmp_path / "up.toml", [("only", fake.url)])
        with running_cluster(3, ["--config", str(config)], state_url=redis_server.url,
                             log_dir=tmp_path / "logs") as cluster:
            home, work = tmp_path / "codex-home", tmp_path / "work"
            home.mkdir()
            work.mkdir()
            (home / "config.toml").write_text(codex_config(balancer_url(cluster), "m"))
            common = ["--json", "--strict-config", "--skip-git-repo-check", "--color",
                      "never", "-C", str(work)]
            first = _codex([*common, "run echo hello"], home, work, tmp_path)
            assert first.returncode == 0, first.stdout + first.stderr
            [cmd] = first.items("command_execution")
            assert cmd["exit_code"] == 0 and cmd["aggregated_output"].strip() == "hello"
            assert [m["text"] for m in first.items("agent_message")] == [
                "The command printed hello."]
            second = _codex(["resume", "--last", *common[:2], "--skip-git-repo-check",
                             "what did it print?"], home, work, tmp_path)
            assert second.returncode == 0, second.stdout + second.stderr
            assert [m["text"] for m in second.items("agent_message")] == [
                "It printed hello, as before."]
            for run in (first, second):
                assert run.of_type("turn.completed") and not run.reconnected, run.stdout
            assert [b.requests for b in cluster.balancer.backends] == [1, 1, 1]
            assert len(fake.requests) == 3
            third = fake.requests[2][1]["messages"]
            [tool] = [m for m in third if m["role"] == "tool"]
            assert tool["tool_call_id"] == "call_tw1" and "hello" in json.dumps(tool["content"])
            assert any(m["role"] == "assistant" and "The command printed hello." in
                       json.dumps(m.get("content")) for m in third)
            assert third[-1]["role"] == "user" and "what did it print?" in json.dumps(
                third[-1]["content"])
    finally:
        fake.stop()
