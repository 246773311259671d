"""Profile ``tokenwire serve`` with py-spy under the phases of :mod:`bench.bench_upstreams`.

Starts the scripted upstream and ``tokenwire serve`` from the tree given (as
:mod:`bench.ab_gateway` does), then records the gateway with ``py-spy record -f raw`` while
the bench's client runs 40 sequential streams and then 4 waves of 64, and prints, per phase,
the shares of the samples by module (self and inclusive) and the top functions by self time.
The raw profiles stay in ``--out`` for any other cut. Needs ``py-spy`` in the venv
(``pip install py-spy``); BENCHMARKS.md "The hot path (issue 15)" quotes its output.

    PYTHONPATH=src .venv/bin/python -m bench.profile_gateway --tree src --out /tmp/prof

The innermost frame ``Runner.run`` is uvloop's loop in C: its own work and its idle time.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench import ab_gateway as ab
from bench import bench_upstreams as bu

PHASES = ((1, 40), (64, 4))  # (concurrency, rounds)


def _key(frame: str) -> str:
    match = re.search(r"\((.*?):\d+\)", frame)
    if not match:
        return frame
    path = match.group(1)
    return path if path.startswith("tokenwire/") else path.split("/")[0]


def summarize(raw: Path, top: int = 25) -> str:
    total, own, incl, funcs = 0, collections.Counter(), collections.Counter(), \
        collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames, count = stack.split(";"), int(n)
        total += count
        own[_key(frames[-1])] += count
        funcs[frames[-1]] += count
        for k in {_key(f) for f in frames}:
            incl[k] += count
    out = [f"{total} samples"]
    out += [f"  self {100 * n / total:5.1f}%  incl {100 * incl[k] / total:5.1f}%  {k}"
            for k, n in own.most_common(top)]
    out += ["top functions (self):"]
    out += [f"  {100 * n / total:5.1f}%  {f}" for f, n in funcs.most_common(top)]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default="src", help="the tree that holds tokenwire/")
    parser.add_argument("--out", default="/tmp/tokenwire-profile", help="raw profiles here")
    parser.add_argument("--format", choices=("chat", "msgpack"), default="chat")
    args = parser.parse_args()
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
    fmt = None if args.format == "chat" else "msgpack"
    headers = {"Codec-Client-Version": "0.5"} if fmt else {}
    procs: list[subprocess.Popen] = []
    try:
        up, up_port = bu.start_upstream(procs)
        port = bu._free_port()
        tw = ab._start(args.tree, up_port, port, [])
        procs.append(tw)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        asyncio.run(bu._phase(url, fmt, headers, 1, 3))  # warm-up
        for concurrency, rounds in PHASES:
            raw = Path(f"{args.out}-{concurrency}.txt")
            rec = subprocess.Popen([spy, "record", "-r", "200", "-f", "raw", "-o", str(raw),
                                    "-p", str(tw.pid), "--nonblocking"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # py-spy attached
            cpu0, up0 = bu._cpu_seconds(tw.pid), bu._cpu_seconds(up.pid)
            asyncio.run(bu._phase(url, fmt, headers, concurrency, rounds))
            ratio = (bu._cpu_seconds(tw.pid) - cpu0) / (bu._cpu_seconds(up.pid) - up0)
            rec.send_signal(2)
            rec.wait(30)
            print(f"== {concurrency} streams: cpu_x_upstream {ratio:.2f}, load average "
                  f"{os.getloadavg()[0]:.1f}; {raw}")
            print(summarize(raw))
    finally:
        bu.stop_all(procs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
