"""Every example of README.md and docs/*.md runs as written (issue 10), or says why not.

Each fenced block is preceded by an HTML comment: ``<!-- runs: KIND ... -->`` names how
this test runs it, ``<!-- illustrative: REASON -->`` says why it cannot run here (files or
hosts of the reader's own). A block with neither, or with a kind this test does not know,
fails the test: a new example cannot be added without deciding which it is.

The kinds, against one real ``tokenwire serve`` (the embedded SmolLM2) the module starts on
a free port:

* ``python``: executed; ``http://127.0.0.1:8080`` is replaced by the server's URL.
* ``sh``: each command line runs in bash (``tokenwire`` is this checkout's CLI); a bare
  ``tokenwire serve`` is the server itself; ``complete``, ``models`` and ``chat`` get
  ``--url`` (``chat`` gets two lines on stdin: a question, then ``/exit``). Exit status 0.
* ``check``: a configuration file, given to ``tokenwire check --no-probe`` with every
  variable it names set; exit status 0 (keys, kinds, URLs and maps all valid).
* ``codex-config``: a Codex ``config.toml``; its model is asked for an answer on the
  server's Responses API at the block's ``base_url`` path.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SRC = ROOT / "src"
README_URL = "http://127.0.0.1:8080"
KINDS = ("python", "sh", "check", "codex-config")
#: Safety limits (not measurements): the model loads in seconds, answers are short.
START_TIMEOUT_S = 180
RUN_TIMEOUT_S = 180

#: Why the README's first block (``./dev run`` / ``./dev test``) is not run here.
SETUP_REASON = "the set-up commands, run by CI itself (.ci/run calls ./dev test)"
_FENCE = re.compile(r"^```(\S*)\s*$")
_MARK = re.compile(r"<!--\s*(runs|illustrative):\s*(.*?)\s*-->\s*\Z", re.S)


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    text: str
    mark: str | None  # "runs" or "illustrative"
    detail: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def kind(self) -> str:
        return self.detail.split()[0] if self.detail else ""


def blocks(path: Path) -> list[Block]:
    lines = path.read_text("utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = "\n".join(lines[max(0, i - 6):i])
        mark = _MARK.search(before)
        if i == 0 and path.name == "README.md":
            # The README must open with its two set-up commands and nothing before them;
            # they install everything (minutes), and CI runs `./dev test` itself.
            out.append(Block(path, 1, m.group(1), "\n".join(lines[1:end]), "illustrative",
                             SETUP_REASON))
            i = end + 1
            continue
        out.append(Block(path, i + 1, m.group(1), "\n".join(lines[i + 1:end]),
                         mark.group(1) if mark else None,
                         " ".join(mark.group(2).split()) if mark else ""))
        i = end + 1
    return out


ALL = [b for p in DOCS for b in blocks(p)]
RUNNABLE = [b for b in ALL if b.mark == "runs"]


def _problem(b: Block) -> str | None:
    if b.mark is None:
        return "no <!-- runs: KIND --> or <!-- illustrative: REASON --> comment before it"
    if b.mark == "illustrative" and not b.detail:
        return "illustrative without a reason"
    if b.mark == "runs" and b.kind not in KINDS:
        return f"unknown kind {b.kind!r}; this test runs {', '.join(KINDS)}"
    return None


def test_every_block_is_runnable_or_says_why_not() -> None:
    bad = [f"{b.where}: {p}" for b in ALL if (p := _problem(b)) is not None]
    assert bad == []
    assert len(RUNNABLE) >= 6  # the README's runnable examples did not silently vanish


# -- the server the examples talk to ------------------------------------------------------


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TOKENWIRE_", "CODEC_"))}
    env["PYTHONPATH"] = str(SRC)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tokenwire.cli.main", "serve", "--port",
                             str(port), "--threads", "1", "--request-log", "off"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env())
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/health").status_code == 200:
                    break
            assert proc.poll() is None, "tokenwire serve exited"
            assert time.monotonic() < deadline, "tokenwire serve did not start"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(60)


# -- the runners --------------------------------------------------------------------------


def _run_python(block: Block, url: str, tmp_path: Path) -> None:
    code = block.text.replace(README_URL, url)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, block.where, "exec"), {"__name__": "__readme__"})
    assert out.getvalue().strip(), f"{block.where} printed nothing"


_SERVER_COMMANDS = ("complete", "models", "chat")


def _sh_commands(block: Block) -> list[str]:
    cmds = []
    for raw in block.text.splitlines():
        line = re.sub(r"\s+#\s.*$", "", raw).strip()
        if not line or line.startswith("#"):
            continue
        assert line.startswith("tokenwire "), f"{block.where}: cannot run {line!r}"
        cmds.append(line)
    return cmds


def _run_sh(block: Block, url: str, tmp_path: Path) -> None:
    cli = f"{sys.executable} -m tokenwire.cli.main"
    for line in _sh_commands(block):
        words = line.split()
        if words[:2] == ["tokenwire", "serve"] and len(words) == 2:
            continue  # the module's server is this line
        stdin = None
        if len(words) > 1 and words[1] in _SERVER_COMMANDS:
            head, sep, tail = line.partition(" | ")
            line = f"{head} --url {url}" + (f" {sep}{tail}" if sep else "")
            if words[1] == "chat":
                stdin = "Say hi\n/exit\n"
        proc = subprocess.run(["bash", "-c", cli + line[len("tokenwire"):]],  # a plain shell
                              input=stdin, capture_output=True, text=True, env=_env(),
                              timeout=RUN_TIMEOUT_S, cwd=tmp_path)
        assert proc.returncode == 0, f"{block.where}: {line}\n{proc.stdout}\n{proc.stderr}"
        assert proc.stdout.strip(), f"{block.where}: {line} printed nothing"


def _run_check(block: Block, url: str, tmp_path: Path) -> None:
    doc = tomllib.loads(block.text)
    env = _env()
    variables = [doc.get("server", {}).get("api_keys_env")]
    variables += [u.get("api_key_env") for u in doc.get("upstreams", [])]
    variables.append(doc.get("state", {}).get("password_env"))
    for var in filter(None, variables):
        env[var] = "readme-test-key"
    for key in doc.get("keys", []):  # [[keys]]: each its own secret (two may not share one)
        if key.get("key_env"):
            env[key["key_env"]] = f"readme-test-key-{key['name']}"
    config = tmp_path / "gateway.toml"
    config.write_text(block.text, "utf-8")
    proc = subprocess.run([sys.executable, "-m", "tokenwire.cli.main", "check", "--no-probe",
                           "--config", str(config)], capture_output=True, text=True, env=env,
                          timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, f"{block.where}:\n{proc.stdout}\n{proc.stderr}"


def _run_codex_config(block: Block, url: str, tmp_path: Path) -> None:
    doc = tomllib.loads(block.text)
    provider = doc["model_providers"][doc["model_provider"]]
    assert provider["wire_api"] == "responses"
    base = provider["base_url"].replace(README_URL, url)
    resp = httpx.post(base + "/responses", timeout=RUN_TIMEOUT_S, json={
        "model": doc["model"], "input": "Say hi", "max_output_tokens": 8})
    assert resp.status_code == 200, f"{block.where}: {resp.text}"
    assert resp.json()["status"] in ("completed", "incomplete")


RUNNERS = {"python": _run_python, "sh": _run_sh, "check": _run_check,
           "codex-config": _run_codex_config}


@pytest.mark.slow
@pytest.mark.parametrize("block", RUNNABLE, ids=[b.where for b in RUNNABLE])
def test_the_block_runs_as_written(block: Block, server: str, tmp_path: Path) -> None:
    RUNNERS[block.kind](block, server, tmp_path)
