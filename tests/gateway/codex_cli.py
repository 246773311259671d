"""Running the Codex CLI (``@openai/codex`` 0.171.0, from npm) as a real client in a test.

One launcher for every Codex test (``test_codex_cli*.py``, the llama_cpp.server overflow
test): ``codex exec --json`` against a tokenwire URL, with a throw-away ``CODEX_HOME`` whose
``config.toml`` (:func:`codex_config`) is offline (``test_codex_cli.py`` says how that was
found), no approvals, no sandbox, ``HOME`` a temp dir (no user ``.bashrc`` runs). The CLI
is installed by ``scripts/codex-install.sh`` (run by ``./dev``) into ``.codex-cli/``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CODEX = REPO / ".codex-cli" / "node_modules" / ".bin" / "codex"
#: Generous: Codex itself answers in well under a second against a local server, but the
#: gateway behind it shares 2 cores with the rest of the suite.
CODEX_TIMEOUT_S = 300
#: Codex's own default; a gateway-caused reconnect would show as up to 6 requests.
STREAM_MAX_RETRIES = 5
KEY_ENV = "TW_CODEX_KEY"
#: The key Codex sends unless a test names one (a gateway without keys ignores it).
DUMMY_KEY = "tw-dummy-key"
#: What Codex logs when its WebSocket fails (``codex_api::endpoint::responses_websocket``).
WS_ERROR_MARKERS = ("responses_websocket", "Falling back from WebSockets", "falling back to HTTP")
#: Features that reach the network (plugins, apps, updates) or run the user's shell.
OFF_FEATURES = ("plugins", "remote_plugin", "plugin_sharing", "apps", "in_app_updates",
                "shell_snapshot")
#: A short stand-in for Codex's base instructions (its first ``developer`` message, ~4.6k
#: SmolLM2 tokens): for the tests on the embedded engine, where every request is a CPU
#: prefill and what is under test is the transport or the tools, not Codex's prose.
SHORT_INSTRUCTIONS = "You are a coding agent. Run shell commands with the exec_command tool."
#: The embedded engine's bound on an answer whose request sets none (Codex sends none), in
#: the tests that run Codex on it (:func:`bounded_answers`): sampled at Codex's default
#: temperature, SmolLM2 now and then repeats one word until the bound (seen in CI), and the
#: product's 4096 tokens are minutes of decoding on this CPU; its real answers to these
#: prompts are tens of tokens (11 to ~80: a prose answer, an ``exec_command`` call), so 256
#: is ample room and ends a run-away at half the decoding 512 took. Reaching it ends the turn
#: as ``max_output_tokens``. (Codex 0.171.0 has no setting that sends ``max_output_tokens``:
#: its config keys hold none, and ``--strict-config`` refuses unknown ones.)
CODEX_ANSWER_BOUND = 256
#: Codex turns a test on the embedded engine runs when a turn only ran out of tokens
#: (:func:`run_retrying_out_of_tokens`). Three: on 2026-12-04 both of two tries ran away in 2
#: of 5 clean-clone CI runs (the engine draws a new seed per request, and SmolLM2 repeats
#: a word until the bound often enough), failing CI for the model's content.
OUT_OF_TOKENS_TRIES = 3
#: The features whose tools Codex declares besides ``request_user_input`` (which it always
#: sends): off with ``tools=False``, with ``web_search = "disabled"`` for the hosted one.
TOOL_FEATURES = ("shell_tool", "multi_agent", "goals", "view_image")

# In CI the CLI must be there (./dev installs it): a skipped interop test would hide that.
if not CODEX.exists() and os.environ.get("CI") == "true":
    raise RuntimeError(f"{CODEX} is absent in CI: scripts/codex-install.sh failed")

#: A Codex test module's ``pytestmark``.
CODEX_MARKS = [
    pytest.mark.slow,
    pytest.mark.skipif(not CODEX.exists(), reason=(
        "the Codex CLI is not installed: run scripts/codex-install.sh (needs node + npm)")),
]


def codex_config(base_url: str, model: str, *, builtin: bool = False,
                 websockets: bool = False, instructions: Path | None = None,
                 tools: bool = True) -> str:
    """``config.toml``: the built-in ``openai`` provider pointed at ``base_url``
    (``builtin``), else one custom provider ``[model_providers.tw]`` with Codex's default
    retry budget (a reconnect caused by the gateway must show); ``websockets`` sets its
    ``supports_websockets``.

    ``instructions``: a file whose text replaces Codex's base instructions
    (``model_instructions_file``), and the skills catalogue (~600 tokens, its second
    ``developer`` message) left out; ``tools=False``: only ``request_user_input`` declared.
    (Codex 0.171.0's keys; what each removes was read in its recorded request.)
    """
    lean = [f'model_instructions_file = "{instructions}"'] if instructions else []
    off = OFF_FEATURES if tools else (*OFF_FEATURES, *TOOL_FEATURES)
    common = [f'model = "{model}"', 'approval_policy = "never"',
              'sandbox_mode = "danger-full-access"', "check_for_update_on_startup = false",
              *lean, *([] if tools else ['web_search = "disabled"']), "",
              *(["[skills]", "include_instructions = false", ""] if instructions else []),
              "[analytics]", "enabled = false", "", "[feedback]", "enabled = false", "",
              "[features]", *(f"{f} = false" for f in off), ""]
    if builtin:
        return "\n".join([f'openai_base_url = "{base_url}/v1"', *common])
    return "\n".join([
        'model_provider = "tw"', *common,
        "[model_providers.tw]", 'name = "tokenwire"', f'base_url = "{base_url}/v1"',
        'wire_api = "responses"', f'env_key = "{KEY_ENV}"',
        *(["supports_websockets = true"] if websockets else []),
        f"stream_max_retries = {STREAM_MAX_RETRIES}", "request_max_retries = 4",
        "stream_idle_timeout_ms = 300000", ""])


@contextmanager
def bounded_answers() -> Iterator[None]:
    """While open, the embedded engine stops an unbounded answer at
    :data:`CODEX_ANSWER_BOUND` tokens instead of its default."""
    from tokenwire.gateway.upstreams import embedded

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(embedded, "DEFAULT_MAX_TOKENS", CODEX_ANSWER_BOUND)
        yield


@dataclass
class CodexRun:
    returncode: int
    events: list[dict]
    stdout: str
    stderr: str

    def of_type(self, type_: str) -> list[dict]:
        return [e for e in self.events if e.get("type") == type_]

    def items(self, type_: str) -> list[dict]:
        return [e["item"] for e in self.of_type("item.completed") if e["item"]["type"] == type_]

    @property
    def ran_out_of_tokens(self) -> bool:
        """The turn failed only because the model's answer reached ``max_output_tokens``
        (:data:`CODEX_ANSWER_BOUND` on the embedded engine): the model's content, not what
        a test of the gateway is about."""
        failed = [e.get("error", {}).get("message", "") for e in self.of_type("turn.failed")]
        return bool(failed) and all("max_output_tokens" in m for m in failed)

    def failure(self) -> str:
        """Why the turn did not complete, short enough to survive pytest's truncation: the
        exit code, Codex's error events and the end of its stderr."""
        errors = [json.dumps(e) for e in self.events if e.get("type") in ("turn.failed", "error")]
        return (f"codex exit {self.returncode}; events: {' | '.join(errors) or 'none'};"
                f" stderr: {self.stderr[-600:]}")

    @property
    def reconnected(self) -> bool:
        """A top-level ``error`` event is what Codex prints for each retry ("Reconnecting")."""
        return "Reconnecting" in self.stdout or bool(self.of_type("error"))

    def websocket_errors(self) -> list[str]:
        """Codex's log lines about a failed WebSocket (needs ``rust_log`` with
        ``codex_api=info``)."""
        return [ln for ln in (self.stdout + self.stderr).splitlines()
                if any(m in ln for m in WS_ERROR_MARKERS)
                and any(w in ln for w in ("ERROR", "WARN", "Falling"))]


def run_retrying_out_of_tokens(run: Callable[[Path], CodexRun], tmp: Path,
                               seen: Callable[[], int]) -> tuple[CodexRun, int]:
    """``run(dir)`` in a fresh ``tmp/try<n>``, once more when its turn only
    :attr:`~CodexRun.ran_out_of_tokens`: Codex sends no temperature, so SmolLM2 samples,
    and now and then repeats one word until :data:`CODEX_ANSWER_BOUND` (seen in CI). That is
    the model's content, not what the tests are about; every other failure is the test's.
    Returns the last run and ``seen()`` taken just before it (what the gateway had recorded:
    requests, sockets), so the test checks only that try's traffic."""
    for attempt in range(OUT_OF_TOKENS_TRIES):
        first = seen()
        (tmp / f"try{attempt}").mkdir()
        result = run(tmp / f"try{attempt}")
        if not result.ran_out_of_tokens:
            break
    return result, first


def run_codex(base_url: str, model: str, prompt: str, tmp: Path, *, builtin: bool = False,
              websockets: bool = False, key: str = DUMMY_KEY,
              timeout_s: float = CODEX_TIMEOUT_S, rust_log: str | None = None,
              instructions: str | None = None, tools: bool = True) -> CodexRun:
    """One ``codex exec --json`` turn; its JSON events, output and exit code.
    ``instructions`` (e.g. :data:`SHORT_INSTRUCTIONS`) replace Codex's own, and ``tools``
    off leaves only ``request_user_input`` (:func:`codex_config`)."""
    home, work = tmp / "codex-home", tmp / "work"
    home.mkdir()
    work.mkdir()
    instructions_file = None
    if instructions is not None:
        instructions_file = home / "instructions.md"
        instructions_file.write_text(instructions + "\n")
    (home / "config.toml").write_text(codex_config(
        base_url, model, builtin=builtin, websockets=websockets,
        instructions=instructions_file, tools=tools))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp),
           "CODEX_HOME": str(home), KEY_ENV: key, "LANG": "C.UTF-8"}
    if rust_log is not None:
        env["RUST_LOG"] = rust_log
    if builtin:
        env["CODEX_API_KEY"] = key
    return exec_codex(["--json", "--strict-config", "--skip-git-repo-check", "--ephemeral",
                       "--color", "never", "-C", str(work), prompt], env, work, timeout_s)


def exec_codex(args: list[str], env: dict[str, str], work: Path,
               timeout_s: float = CODEX_TIMEOUT_S) -> CodexRun:
    """``codex exec *args`` in ``work`` with exactly ``env``; its JSON events and exit code."""
    # Its own process group, so teardown kills Codex and whatever it spawned. The `with`
    # closes the pipes however the run ends: a timed-out run's pipes, left to the collector,
    # once failed an unrelated module's teardown with a ResourceWarning.
    with subprocess.Popen([str(CODEX), "exec", *args], env=env, cwd=work,
                          stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate(timeout=10)  # what it printed before the kill
            raise AssertionError(f"codex exec ran past its {timeout_s:.0f} s safety net; "
                                 f"stdout: {out[-3000:]!r} stderr: {err[-2000:]!r}") from None
        finally:
            _kill_group(proc)
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return CodexRun(proc.returncode, events, out, err)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)
