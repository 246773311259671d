"""What a user of ``tokenwire complete``, ``models`` and ``chat`` sees when the server is
hostile: one ``tokenwire: error:`` line and exit status 1, never a traceback, and no body
read past its limit. The server is a loopback one of canned answers (``_canned``)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator

import httpx
import pytest

from tests.client._canned import Answer, Trickle, canned_app
from tests.client._loopback import serve
from tokenwire.cli.chat import MAX_ANSWER_BYTES, stream_reply
from tokenwire.cli.main import main
from tokenwire.cli.models import MAX_MODELS_BYTES, fetch_models
from tokenwire.client._base import MAX_ERROR_BODY
from tokenwire.codec.frames import Frame
from tokenwire.codec.frames_msgpack import FrameEncoder
from tokenwire.errors import CodecDeadlineExceeded, CodecHTTPError

JSON = {"Content-Type": "application/json"}
DEEP = b"[" * 100_000
#: A valid model list that decodes to more than the limit from ~10 KB on the wire.
PADDED = gzip.compress(json.dumps({"data": [], "pad": " " * MAX_MODELS_BYTES}).encode())
FRAMES = FrameEncoder().encode(Frame(ids=(1,), done=True, finish_reason="stop"))
#: Sets the terminal's title, erases the line and writes one of its own, then another.
FORGED = "bad\x1b]0;pwned\x07\x1b[2K\rtokenwire: the answer was fine\nsecond line"
STREAM = (200, {"Content-Type": "application/x-msgpack"}, FRAMES)

ANSWERS: dict[str, Answer] = {
    "/deep-models/v1/models": (200, JSON, DEEP),
    "/deep-models/v1/completions": STREAM,
    "/padded-models/v1/models": (200, {**JSON, "Content-Encoding": "gzip"}, PADDED),
    "/not-a-list/v1/models": (200, JSON, b'{"data": "smol"}'),
    "/odd-fields/v1/models": (200, JSON, json.dumps({"data": [
        {"id": "smol", "aliases": 5, "codec_tokenizer_map": "a string"}]}).encode()),
    "/426-deep/v1/completions": (426, JSON, DEEP),
    "/silent/v1/completions": (200, {"Content-Type": "application/x-msgpack"}, None),
    "/trickle/v1/models": (200, JSON, Trickle(b" ")),  # JSON's whitespace, for ever
    "/trickle/v1/completions": (200, {"Content-Type": "application/x-msgpack"},
                                Trickle(FrameEncoder().encode(Frame(ids=(1,), done=False)))),
    "/escapes/v1/completions": (400, JSON, json.dumps({"error": {"message": FORGED}}).encode()),
    "/426-escapes/v1/completions": (426, JSON, json.dumps({
        "error": "codec_version_required", "minimum_version": "9.9\x1b[31m",
        "client_version": "0.6", "required_features": ["a\nb"],
        "docs_url": "https://x/\x1b[2J"}).encode()),
}


@pytest.fixture(scope="module")
def origin() -> Iterator[str]:
    with serve(canned_app(ANSWERS)) as url:
        yield url


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    [line] = [line for line in err.splitlines() if line.startswith("tokenwire: error:")]
    return line


@pytest.mark.parametrize(("scenario", "says"), [
    ("deep-models", "is not JSON: the JSON nests deeper"),
    ("padded-models", f"the model list is over {MAX_MODELS_BYTES:,} bytes"),
    ("not-a-list", "is not a model list"),
])
def test_models_refuses_a_list_it_cannot_read_in_one_line(origin, capsys, scenario,
                                                          says) -> None:
    assert main(["models", "--url", f"{origin}/{scenario}"]) == 1
    assert says in _one_error_line(capsys)


def test_models_shows_fields_of_the_wrong_type_as_absent(origin, capsys) -> None:
    assert main(["models", "--url", f"{origin}/odd-fields"]) == 0
    assert capsys.readouterr().out.splitlines() == ["smol  (no map)"]


def test_complete_survives_a_model_list_it_cannot_read(origin, capsys) -> None:
    # The stream is fine: the summary names a stand-in model instead of a RecursionError.
    assert main(["complete", "--url", f"{origin}/deep-models", "Hi"]) == 1  # ids, no map
    err = capsys.readouterr().err
    assert "Traceback" not in err and "-- 1 tokens" in err


def test_complete_reports_a_426_nested_too_deep_in_one_line(origin, capsys) -> None:
    assert main(["complete", "--url", f"{origin}/426-deep", "Hi"]) == 1
    assert "426 with a body that is not JSON" in _one_error_line(capsys)


def test_complete_gives_up_on_a_silent_stream_after_its_timeout(origin, capsys) -> None:
    # The server sends the head, then nothing, and keeps the connection open.
    assert main(["complete", "--url", f"{origin}/silent", "--timeout", "0.5", "Hi"]) == 1
    assert "the server sent nothing for 0.5 s" in _one_error_line(capsys)


def test_the_model_list_is_read_within_its_timeout_in_all(origin) -> None:
    # A byte every 50 ms: no single wait reaches the timeout, the whole list does.
    with pytest.raises(CodecDeadlineExceeded, match=r"deadline of 0\.5 s"):
        fetch_models(f"{origin}/trickle", timeout=0.5)


def test_complete_gives_up_on_a_trickling_stream_at_its_deadline(origin, capsys) -> None:
    # A frame every 50 ms, for ever: the 5 s read timeout never fires, the deadline does.
    assert main(["complete", "--url", f"{origin}/trickle", "--timeout", "5",
                 "--deadline", "0.5", "Hi"]) == 1
    assert "took longer than its deadline of 0.5 s" in _one_error_line(capsys)


@pytest.mark.parametrize("scenario", ["escapes", "426-escapes"])
def test_complete_shows_the_servers_control_characters_escaped_in_one_line(
        origin, capsys, scenario) -> None:
    assert main(["complete", "--url", f"{origin}/{scenario}", "Hi"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err and "\r" not in err
    assert "\\x1b" in err and "\\n" in err


# -- tokenwire chat ------------------------------------------------------------------------

SSE = {"Content-Type": "text/event-stream"}
CHAT_ANSWERS: dict[str, bytes] = {
    "not-json": b"data: {oops\n\n",
    "deep": b"data: " + DEEP + b"\n\n",
    "not-an-object": b"data: [1]\n\n",
    "choices-not-a-list": b'data: {"choices": "x"}\n\n',
    "delta-not-an-object": b'data: {"choices": [{"delta": "x"}]}\n\n',
}
ANSWERS.update({f"/chat-{name}/v1/chat/completions": (200, SSE, body)
                for name, body in CHAT_ANSWERS.items()})
ANSWERS["/chat-ok/v1/chat/completions"] = (200, SSE, b'data: {"choices": [{"delta": '
                                           b'{"content": "fine"}}]}\n\ndata: [DONE]\n\n')
#: One line of 64 MiB + 1 of spaces, 700 bytes of gzip: past the answer's budget.
ANSWERS["/chat-bomb/v1/chat/completions"] = (
    200, {**SSE, "Content-Encoding": "gzip"},
    gzip.compress(b"data: " + b" " * MAX_ANSWER_BYTES + b"\n\n"))
ANSWERS["/chat-error-bomb/v1/chat/completions"] = (
    500, {**JSON, "Content-Encoding": "gzip"}, gzip.compress(b"x" * MAX_ANSWER_BYTES))


def _chat(origin: str, scenario: str, monkeypatch, lines: list[str]) -> int:
    said = iter(lines)

    def user(prompt: str = "") -> str:
        try:
            return next(said)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", user)
    return main(["chat", "--url", f"{origin}/chat-{scenario}"])


@pytest.mark.parametrize(("scenario", "says"), [
    ("not-json", "sent a chunk that is not JSON"),
    ("deep", "the JSON nests deeper"),
    ("not-an-object", "is not a chat completion chunk"),
    ("choices-not-a-list", "is not a chat completion chunk"),
    ("delta-not-an-object", "sent a choice without a text delta"),
    ("bomb", f"past the {MAX_ANSWER_BYTES}-byte budget"),
])
def test_chat_reports_an_answer_it_cannot_read_and_carries_on(origin, capsys, monkeypatch,
                                                              scenario, says) -> None:
    assert _chat(origin, scenario, monkeypatch, ["hello", "again"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("tokenwire: error:")]
    assert len(lines) == 2 and says in lines[0]  # one per question: the session went on


def test_chat_reads_an_error_body_only_as_far_as_it_explains_the_error(origin) -> None:
    with httpx.Client() as http, pytest.raises(CodecHTTPError) as info:
        list(stream_reply(http, f"{origin}/chat-error-bomb", {"messages": []}))
    assert info.value.status == 500 and len(info.value.body) <= MAX_ERROR_BODY


def test_chat_still_shows_a_well_formed_answer(origin, capsys, monkeypatch) -> None:
    assert _chat(origin, "ok", monkeypatch, ["hello"]) == 0
    out, err = capsys.readouterr()
    assert "fine" in out and "error" not in err
