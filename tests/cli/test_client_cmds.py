"""`tokenwire complete` and `tokenwire dict record | train`, run in-process through the real
entry point against the scripted loopback Codec server (tests/client/_scripted.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard

from tests.client._loopback import serve
from tests.client._scripted import ANSWER_IDS, MAP, ScriptedCodecServer, frame_bytes
from tokenwire.cli.client_cmds import estimate_json_sse_bytes, training_samples
from tokenwire.cli.main import main
from tokenwire.codec.detokenizer import Detokenizer
from tokenwire.codec.frames import StreamFormat
from tokenwire.codec.maps import sha256_hash

TEXT = Detokenizer(MAP).decode(ANSWER_IDS)


@pytest.fixture(scope="module")
def origin() -> Iterator[str]:
    with serve(ScriptedCodecServer().app) as url:
        yield url


@pytest.mark.parametrize("fmt", [f.value for f in StreamFormat])
@pytest.mark.parametrize("path", ["a", "b", "c"])
def test_complete_streams_the_text_and_ends_with_a_summary(origin, capsys, fmt, path) -> None:
    rc = main(["complete", "Hello", "--url", f"{origin}/s/ok", "--format", fmt,
               "--path", path, "--encoding", "br"])
    out, err = capsys.readouterr()
    assert rc == 0
    assert out == TEXT + "\n"
    summary = err.strip().splitlines()[-1]
    m = re.match(r"-- (\d+) tokens, ([\d,]+) B on the wire \((\S+), br; .*path (\w)\); "
                 r"as JSON-SSE ~([\d,]+) B", summary)
    assert m, summary
    assert int(m.group(1)) == len(ANSWER_IDS) and m.group(3) == fmt and m.group(4) == path.upper()
    assert int(m.group(5).replace(",", "")) > int(m.group(2).replace(",", ""))


def test_json_sse_estimate_is_one_openai_chunk_per_frame_plus_done() -> None:
    texts = ["Hel", "lo", " ✓"]
    size = estimate_json_sse_bytes(texts, "eos_token", "m")
    one = ('data: {"id":"cmpl-' + "x" * 24 + '","object":"text_completion","created":'
           '1700000000,"model":"m","choices":[{"index":0,"text":%s,"logprobs":null,'
           '"finish_reason":%s}]}\n\n')
    expected = sum(len((one % (json.dumps(t), "null")).encode()) for t in texts)
    expected += len((one % ('""', '"eos_token"')).encode()) + len(b"data: [DONE]\n\n")
    assert size == expected


def test_complete_reports_a_json_sse_fallback_as_an_error(origin, capsys) -> None:
    rc = main(["complete", "Hello", "--url", f"{origin}/s/json-sse"])
    err = capsys.readouterr().err
    assert rc == 1 and "text/event-stream" in err


def test_complete_reports_426_as_an_error(origin, capsys) -> None:
    rc = main(["complete", "Hello", "--url", f"{origin}/s/426"])
    assert rc == 1 and "requires Codec >= 0.4" in capsys.readouterr().err


def test_record_then_train_makes_a_dictionary_the_server_can_use(origin, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"prompt {i}" for i in range(4)) + "\n", "utf-8")
    rec = tmp_path / "rec"
    assert main(["dict", "record", "--url", f"{origin}/s/ok", "--format", "protobuf",
                 "--prompts", str(prompts), "-o", str(rec), "--encoding", "gzip"]) == 0
    files = sorted(rec.glob("*.protobuf.bin"))
    assert len(files) == 4
    # Recorded bodies are the raw, decompressed frames even though gzip was on the wire.
    assert files[0].read_bytes() == b"".join(frame_bytes(StreamFormat.PROTOBUF))
    out = tmp_path / "protobuf.zstd"
    assert main(["dict", "train", "--format", "protobuf", "-o", str(out), "--size", "4096",
                 *map(str, files)]) == 0
    raw = out.read_bytes()
    assert 0 < len(raw) <= 4096 and raw[:4] == b"\x37\xa4\x30\xec"  # a real zstd dictionary
    err = capsys.readouterr().err
    assert sha256_hash(raw) in err and f"--zstd-dict protobuf={out}" in err
    body = files[0].read_bytes()
    zd = zstandard.ZstdCompressionDict(raw)
    with_dict = zstandard.ZstdCompressor(level=3, dict_data=zd).compress(body)
    assert len(with_dict) < len(zstandard.ZstdCompressor(level=3).compress(body))


def test_complete_record_stores_the_decompressed_body(origin, tmp_path, capsys) -> None:
    rc = main(["complete", "Hi", "--url", f"{origin}/s/ok", "--encoding", "br",
               "--record", str(tmp_path)])
    capsys.readouterr()
    [stored] = list(tmp_path.glob("*.msgpack.bin"))
    assert rc == 0 and stored.read_bytes() == b"".join(frame_bytes(StreamFormat.MSGPACK))


def test_train_refuses_compressed_or_foreign_files(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "x.bin"
    bad.write_bytes(b"\x1f\x8b\x08\x00 not a codec body")
    assert main(["dict", "train", "--format", "msgpack", "-o", str(tmp_path / "d"),
                 str(bad)]) == 1
    assert "not a raw msgpack Codec body" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_few_bodies_are_sliced_so_zstd_can_train() -> None:
    bodies = [bytes(3000), bytes(10)]
    samples = training_samples(bodies)
    assert samples[:2] == bodies and len(samples) == 2 + 3 + 1
    many = [bytes(5)] * 40
    assert training_samples(many) == many


# -- what a person sees (issue 10) --------------------------------------------------------------


def test_complete_ends_the_answer_line_before_the_stats_line(origin) -> None:
    """stdout and stderr in one pipe (a terminal, `2>&1 | less`): the answer's newline must
    be flushed before the stats line is written, not after it."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # a user's shell
    env["PYTHONPATH"] = str(Path(__file__).parents[2] / "src")
    proc = subprocess.run(
        [sys.executable, "-m", "tokenwire.cli.main", "complete", "Hello", "--url",
         f"{origin}/s/ok"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
        timeout=120)
    out = proc.stdout.decode()
    assert proc.returncode == 0, out
    assert TEXT + "\n-- " in out, out


def test_complete_says_loudly_when_ids_cannot_be_rendered(origin, capsys) -> None:
    rc = main(["complete", "Hello", "--url", f"{origin}/s/no-map-header"])
    out, err = capsys.readouterr()
    assert rc == 1
    assert "without naming a tokenizer map" in err and "could not be rendered" in err
    assert out.split() == [str(i) for i in ANSWER_IDS]  # the ids, not an empty line


def test_complete_shows_the_servers_error_message_whole(origin, capsys) -> None:
    from tests.client._scripted import LONG_ERROR

    rc = main(["complete", "Hello", "--url", f"{origin}/s/long-error"])
    err = capsys.readouterr().err
    assert rc == 1
    assert LONG_ERROR["error"]["message"] in err and "context_length_exceeded" in err
    assert '{"error"' not in err  # parsed, not a raw JSON fragment
