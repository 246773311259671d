"""``tokenwire chat`` in a real pseudo-terminal (pexpect): streaming, history, Ctrl-C stops
the answer and not the program, Ctrl-D and /exit quit. The server is a real gateway app
over a scripted upstream on a loopback socket; the upstream records every request, so the
history the chat sent is checked, and its slow answer is held open until the test has
pressed Ctrl-C (no timing is assumed)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.gateway.conftest import make_state, start_server
from tokenwire.codec.maps import bundled_map_path, load_map_file
from tokenwire.gateway.ir import Finish, FinishKind, TokenDelta
from tokenwire.gateway.settings import ServerSettings

pexpect = pytest.importorskip("pexpect")

SRC = Path(__file__).parents[2] / "src"
#: pexpect's wait for each expected output: a safety net, not a measurement.
EXPECT_TIMEOUT_S = 60


class _ChatUpstream:
    """Answers "one two" to the first question; to a question containing "long" it sends
    "tick" and then waits until cancelled (the client's Ctrl-C closes the stream)."""

    model_id = "chatty"

    def __init__(self) -> None:
        self.requests = []
        self.cancelled = 0

    def submit(self, request):
        self.requests.append(request)
        return _Stream(self, "long" in request.prompt.messages[-1].content)


class _Stream:
    def __init__(self, up: _ChatUpstream, endless: bool) -> None:
        import asyncio

        self._up = up
        self._events = [TokenDelta(ids=(1,), text="tick")] if endless else [
            TokenDelta(ids=(1,), text="one"), TokenDelta(ids=(2,), text=" two"),
            Finish(reason=FinishKind.EOS)]
        self._forever = asyncio.Event

    async def next_event(self):
        if self._events:
            return self._events.pop(0)
        await self._forever().wait()  # held until the gateway cancels us

    def cancel(self) -> None:
        self._up.cancelled += 1


@pytest.fixture
def chat_server():
    up = _ChatUpstream()
    tmap = load_map_file(bundled_map_path("huggingfacetb/smollm2"))
    served = start_server(make_state(ServerSettings(), up, tmap))
    yield served.url, up
    served.stop()


def _spawn(url: str):
    env = {**os.environ, "PYTHONPATH": str(SRC), "TERM": "dumb"}
    return pexpect.spawn(sys.executable, ["-m", "tokenwire.cli.main", "chat", "--url", url],
                         env=env, encoding="utf-8", timeout=EXPECT_TIMEOUT_S)


def _messages(request) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in request.prompt.messages]


def test_chat_streams_keeps_history_and_quits_on_exit(chat_server) -> None:
    url, up = chat_server
    child = _spawn(url)
    child.expect_exact(">>> ")
    child.sendline("hello")
    child.expect_exact("one two")
    child.expect_exact(">>> ")
    child.sendline("and again")
    child.expect_exact("one two")
    child.expect_exact(">>> ")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert _messages(up.requests[1]) == [("user", "hello"), ("assistant", "one two"),
                                         ("user", "and again")]


def test_ctrl_c_stops_the_answer_not_the_program_and_ctrl_d_quits(chat_server) -> None:
    url, up = chat_server
    child = _spawn(url)
    child.expect_exact(">>> ")
    child.sendline("a long story please")
    child.expect_exact("tick")  # streaming; the upstream now holds the rest
    child.sendintr()
    child.expect_exact("[stopped]")
    child.expect_exact(">>> ")  # still running, ready for the next question
    child.sendline("hello")
    child.expect_exact("one two")
    child.expect_exact(">>> ")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert up.cancelled >= 1  # the stopped answer's generation was cancelled
    assert _messages(up.requests[1]) == [("user", "a long story please"),
                                         ("assistant", "tick"), ("user", "hello")]


@pytest.mark.slow
def test_chat_without_a_url_talks_to_the_embedded_model() -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC), "TERM": "dumb"}
    child = pexpect.spawn(sys.executable, ["-m", "tokenwire.cli.main", "chat", "--max-tokens",
                                           "8", "--temperature", "0", "--seed", "1"],
                          env=env, encoding="utf-8", timeout=180)
    child.expect_exact(">>> ")
    child.sendline("Say hi")
    child.expect(r"\S+")  # some of the model's answer
    child.expect_exact(">>> ")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
