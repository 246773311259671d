"""``tokenwire complete`` and ``tokenwire dict train | record``: the client on the command line.

* ``complete`` streams a completion from a Codec server (Path A, B or C), prints the text as
  it is decoded, and ends with a one-line summary on stderr: tokens, bytes on the wire, and
  what the same answer would cost as OpenAI JSON-SSE. The JSON-SSE figure is an *estimate*:
  the same ids and text rendered locally as OpenAI ``text_completion`` chunks, one per frame,
  plus the final chunk and ``data: [DONE]`` (no second generation is requested, since a
  second run need not produce the same tokens).
* ``dict record`` drives a server with prompts from a file (one per line) and stores each
  raw, decompressed response body; ``complete --record DIR`` stores one.
* ``dict train`` trains a zstd dictionary from recorded bodies (codec-spec §3.7), with a
  progress bar, and reports the compression of the samples with and without it. The server
  loads it with ``tokenwire serve --zstd-dict FORMAT=PATH``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import httpx
from tqdm import tqdm

from tokenwire.cli.models import fetch_models
from tokenwire.client._base import PATHS, StreamStats
from tokenwire.client.codec_client import DEFAULT_TIMEOUT, CodecClient
from tokenwire.client.deadline import DEFAULT_DEADLINE_S
from tokenwire.codec import frames_delta, frames_msgpack, frames_protobuf
from tokenwire.codec.compression import DICT_SIZE, ZSTD_LEVEL, ZstdDict, train_dictionary
from tokenwire.codec.frames import FrameDecoderBase, StreamFormat
from tokenwire.errors import RemoteProtocolError, TokenwireError

__all__ = [
    "MIN_TRAIN_SAMPLES",
    "SPLIT_BYTES",
    "estimate_json_sse_bytes",
    "register",
    "summary_line",
    "training_samples",
]

DEFAULT_URL = "http://127.0.0.1:8080"
#: ``tokenwire complete --max-tokens``: a paragraph, enough to see a stream and its size.
DEFAULT_MAX_TOKENS = 128
#: zstd's trainer refuses fewer than ~10 samples ("Src size is incorrect"); with fewer whole
#: bodies than this we also train on slices of them, which keeps the byte statistics.
MIN_TRAIN_SAMPLES = 32
#: Slice size when bodies are split: a few dozen one-token frames, the part of a stream a
#: dictionary helps most (its start, before the window holds history of its own).
SPLIT_BYTES = 1024
# Placeholders with the real lengths of an OpenAI completion chunk's id and timestamp.
_SSE_ID = "cmpl-" + "x" * 24
_SSE_CREATED = 1_700_000_000

_DECODERS: dict[StreamFormat, type[FrameDecoderBase]] = {
    StreamFormat.MSGPACK: frames_msgpack.FrameDecoder,
    StreamFormat.PROTOBUF: frames_protobuf.FrameDecoder,
    StreamFormat.MSGPACK_DELTA: frames_delta.FrameDecoder,
}


def register(subparsers: argparse._SubParsersAction) -> None:
    comp = subparsers.add_parser("complete", help="stream a completion from a Codec server")
    comp.add_argument("prompt", help="the text to complete (sent as is: no chat template)")
    _client_args(comp)
    comp.add_argument("--path", choices=PATHS, default="a",
                      help="a: text prompt, b: token-id prompt, c: binary request body")
    comp.add_argument("--record", metavar="DIR", type=Path,
                      help="also store the raw (decompressed) response body in DIR")
    comp.set_defaults(func=cmd_complete)

    dct = subparsers.add_parser("dict", help="record Codec streams and train zstd dictionaries")
    sub = dct.add_subparsers(dest="dict_command", required=True, metavar="SUBCOMMAND")
    train = sub.add_parser("train", help="train a zstd dictionary from recorded streams")
    train.add_argument("--format", required=True, choices=[f.value for f in StreamFormat],
                       help="the stream_format the recorded bodies are in")
    train.add_argument("-o", "--output", required=True, type=Path,
                       help="where to write the dictionary")
    train.add_argument("--size", type=int, default=DICT_SIZE, help="dictionary size in bytes")
    train.add_argument("files", nargs="+", type=Path, metavar="RECORDED_STREAM_FILES",
                       help="raw (decompressed) bodies from `tokenwire dict record`")
    train.set_defaults(func=cmd_train)

    rec = sub.add_parser("record", help="record raw streams by sending prompts from a file")
    rec.add_argument("--prompts", required=True, type=Path, help="text file, one per line")
    rec.add_argument("-o", "--output-dir", required=True, type=Path,
                     help="directory for the recorded bodies (one file per prompt)")
    _client_args(rec)
    rec.set_defaults(func=cmd_record)


def _client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=DEFAULT_URL, help=f"server base URL (default {DEFAULT_URL})")
    p.add_argument("--format", default="msgpack", choices=[f.value for f in StreamFormat],
                   help="Codec frame format to ask for (default msgpack)")
    p.add_argument("--encoding", default=None,
                   help="Accept-Encoding to send, e.g. br, gzip, zstd, identity "
                        "(default: br, gzip; zstd only with --zstd)")
    p.add_argument("--zstd", action="store_true", help="offer zstd (dictionary fetched by hash)")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                   help=f"most tokens to generate (default {DEFAULT_MAX_TOKENS})")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature, 0 for greedy (default: the server's)")
    p.add_argument("--seed", type=int, default=None,
                   help="sampling seed, for repeatable answers (default: random)")
    p.add_argument("--model", default=None,
                   help="model name to ask for (default: the server's default model)")
    p.add_argument("--allow-http", action="store_true",
                   help="allow http discovery on a non-loopback origin")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT.read, metavar="SECONDS",
                   help="longest wait for the server to connect or send the next bytes "
                        f"(default {DEFAULT_TIMEOUT.read:g})")
    p.add_argument("--deadline", type=_deadline, default=DEFAULT_DEADLINE_S, metavar="SECONDS",
                   help="longest a whole request may take, discovery and the answer's stream "
                        f"included; 0 for none (default {DEFAULT_DEADLINE_S:g})")


def _deadline(value: str) -> float | None:
    seconds = float(value)
    if not seconds >= 0:  # (nan too)
        raise argparse.ArgumentTypeError("must be 0 (no deadline) or more")
    return seconds or None


def _client(args: argparse.Namespace) -> CodecClient:
    return CodecClient(args.url, stream_format=args.format, accept_encoding=args.encoding,
                       zstd=args.zstd, model=args.model,
                       allow_http=True if args.allow_http else None,
                       timeout=httpx.Timeout(args.timeout), deadline=args.deadline)


# -- complete -------------------------------------------------------------------------------


def estimate_json_sse_bytes(texts: Iterable[str], finish_reason: str | None,
                            model: str) -> int:
    """Bytes of the same answer as OpenAI ``/v1/completions`` SSE, one chunk per frame."""

    def chunk(text: str, reason: str | None) -> int:
        doc = {"id": _SSE_ID, "object": "text_completion", "created": _SSE_CREATED,
               "model": model, "choices": [{"index": 0, "text": text, "logprobs": None,
                                            "finish_reason": reason}]}
        return len(b"data: ") + len(json.dumps(doc, separators=(",", ":")).encode()) + 2

    total = sum(chunk(t, None) for t in texts)
    return total + chunk("", finish_reason or "stop") + len(b"data: [DONE]\n\n")


def summary_line(stats: StreamStats, json_sse: int) -> str:
    tokens = max(stats.tokens, 1)
    coding = stats.content_encoding + (" + dict" if stats.zstd_dict else "")
    ratio = json_sse / stats.wire_bytes if stats.wire_bytes else 0.0
    return (f"-- {stats.tokens} tokens, {stats.wire_bytes:,} B on the wire "
            f"({stats.stream_format}, {coding}; {stats.wire_bytes / tokens:.2f} B/token, "
            f"path {stats.path.upper()}); as JSON-SSE ~{json_sse:,} B "
            f"({json_sse / tokens:.1f} B/token, estimated locally): {ratio:.1f}x larger")


def _served_model(url: str) -> str:
    """The model id ``/v1/models`` lists (its length is in every JSON chunk); best effort."""
    try:
        data = fetch_models(url, timeout=5.0)["data"]
    except TokenwireError:
        return "model"
    return str(data[0].get("id", "model")) if data else "model"


def cmd_complete(args: argparse.Namespace) -> int:
    record_file = None
    if args.record is not None:
        args.record.mkdir(parents=True, exist_ok=True)
        name = f"{time.strftime('%Y%m%d-%H%M%S')}-{time.monotonic_ns() % 10**6:06d}"
        record_file = (args.record / f"{name}.{args.format}.bin").open("wb")
    texts: list[str] = []
    try:
        with _client(args) as client, client.stream(
            args.prompt, max_tokens=args.max_tokens, temperature=args.temperature,
            seed=args.seed, path=args.path,
            record=record_file.write if record_file else None,
        ) as stream:
            for chunk in stream:
                texts.append(chunk.text)
                if chunk.ids and not stream.renders_text:
                    _say_unrenderable(len(stream.ids) == len(chunk.ids))
                    sys.stdout.write(" ".join(map(str, chunk.ids)) + " ")
                else:
                    sys.stdout.write(chunk.text)
                sys.stdout.flush()
    finally:
        if record_file is not None:
            record_file.close()
    # The answer's line ends before the stats line starts (both may share a terminal).
    sys.stdout.write("\n")
    sys.stdout.flush()
    model = args.model or _served_model(args.url)
    json_sse = estimate_json_sse_bytes(texts, stream.raw_finish_reason, model)
    print(summary_line(stream.stats, json_sse), file=sys.stderr)
    if stream.ids and not stream.renders_text:
        print(f"tokenwire: error: {len(stream.ids)} token ids arrived but could not be "
              "rendered as text (printed as ids above)", file=sys.stderr)
        return 1
    return 0


def _say_unrenderable(first: bool) -> None:
    if first:
        print("tokenwire: warning: the server sent token ids without naming a tokenizer map "
              "(no Codec-Tokenizer-Map header), so they cannot be rendered as text; "
              "printing the ids. The server must serve this model with a map (see "
              "`tokenwire models`).", file=sys.stderr, flush=True)


# -- dict record / train --------------------------------------------------------------------


def cmd_record(args: argparse.Namespace) -> int:
    prompts = [line for line in args.prompts.read_text("utf-8").splitlines() if line.strip()]
    args.output_dir.mkdir(parents=True, exist_ok=True)
    total = 0
    with _client(args) as client:
        for i, prompt in enumerate(tqdm(prompts, desc="recording", unit="stream")):
            body = bytearray()
            with client.stream(prompt, max_tokens=args.max_tokens, seed=args.seed,
                               temperature=args.temperature, record=body.extend) as stream:
                for _ in stream:
                    pass
            (args.output_dir / f"{i:05d}.{args.format}.bin").write_bytes(bytes(body))
            total += len(body)
    print(f"recorded {len(prompts)} streams ({total:,} B) in {args.output_dir}", file=sys.stderr)
    return 0


def _check_body(data: bytes, fmt: StreamFormat) -> None:
    dec = _DECODERS[fmt]()
    dec.feed(data)
    dec.feed_eof()


def training_samples(bodies: Sequence[bytes]) -> list[bytes]:
    """Whole bodies, plus ``SPLIT_BYTES`` slices when there are too few to train on."""
    if len(bodies) >= MIN_TRAIN_SAMPLES:
        return list(bodies)
    slices = [b[i : i + SPLIT_BYTES] for b in bodies for i in range(0, len(b), SPLIT_BYTES)]
    return list(bodies) + slices


def _compressed_size(samples: Sequence[bytes], zdict: ZstdDict | None) -> int:
    import zstandard

    data = zstandard.ZstdCompressionDict(zdict.raw) if zdict else None
    comp = zstandard.ZstdCompressor(level=ZSTD_LEVEL, dict_data=data)
    return sum(len(comp.compress(s)) for s in samples)


def cmd_train(args: argparse.Namespace) -> int:
    fmt = StreamFormat(args.format)
    bodies: list[bytes] = []
    for path in tqdm(args.files, desc="reading streams", unit="file"):
        data = path.read_bytes()
        try:
            _check_body(data, fmt)
        except RemoteProtocolError as exc:
            print(f"tokenwire: error: {path} is not a raw {fmt.value} Codec body "
                  f"(record them decompressed): {exc}", file=sys.stderr)
            return 1
        bodies.append(data)
    samples = training_samples(bodies)
    with tqdm(total=1, desc=f"training {args.size} B dictionary on {len(samples)} samples",
              bar_format="{desc}: {elapsed}") as bar:
        try:
            raw = train_dictionary(samples, args.size)
        except Exception as exc:  # zstandard.ZstdError: too little or too uniform data
            print(f"tokenwire: error: zstd could not train a dictionary: {exc}; "
                  "record more or longer streams", file=sys.stderr)
            return 1
        bar.update(1)
    zdict = ZstdDict.from_bytes(raw)
    args.output.write_bytes(raw)
    plain, with_dict = _compressed_size(bodies, None), _compressed_size(bodies, zdict)
    print(f"wrote {args.output} ({len(raw):,} B, {zdict.hash}) for {fmt.value}; "
          f"zstd-{ZSTD_LEVEL} on the {len(bodies)} streams: {plain:,} B without, "
          f"{with_dict:,} B with the dictionary (in-sample, not a holdout)", file=sys.stderr)
    print(f"serve it with: tokenwire serve --zstd-dict {fmt.value}={args.output}",
          file=sys.stderr)
    return 0
