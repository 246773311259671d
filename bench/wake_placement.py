"""Where Linux runs a process woken by a loopback write, and what the writer's later work costs it.

A machine fact behind the first token's time (BENCHMARKS.md, "Session of 2026-12-05 (3)"):
two processes over a loopback TCP connection (or a Unix socket pair), as a gateway and its
upstream are. The writer sends one byte, optionally keeps its core busy for ``--after`` µs
(a gateway's work after writing the upstream request), then waits for the answer; the
other process answers after ``--work`` µs of its own. Printed: the write's duration, the
round trip, and on how many rounds the woken process ran on the writer's CPU.

If the woken process ran on the idle core, the writer's work after the write would overlap
its own and the round trip would stay ``work``; if it waits on the writer's core, the round
trip is ``after + work``.

    .venv/bin/python -m bench.wake_placement [--after 200] [--work 300] [--unix]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import socket
import statistics
import time

_libc = ctypes.CDLL(None)


def _cpu() -> int:
    return _libc.sched_getcpu()


def _pair(unix: bool) -> tuple[socket.socket, socket.socket]:
    if unix:
        return socket.socketpair()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    for s in (a, b):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return a, b


def _spin(seconds: float) -> None:
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        pass


def run(*, after_s: float, work_s: float, unix: bool, rounds: int = 200,
        gap_s: float = 0.005) -> dict[str, float]:
    a, b = _pair(unix)
    pid = os.fork()
    if pid == 0:  # the woken process: answer each byte after its work, with its CPU
        a.close()
        while b.recv(1):
            _spin(work_s)
            b.send(_cpu().to_bytes(2, "little"))
        os._exit(0)
    b.close()
    writes, trips, same = [], [], 0
    try:
        for _ in range(rounds):
            time.sleep(gap_s)  # both idle between rounds, as between a stream's chunks
            cpu, t0 = _cpu(), time.perf_counter()
            a.send(b"x")
            t1 = time.perf_counter()
            _spin(after_s)
            answer = a.recv(2)
            t2 = time.perf_counter()
            writes.append(t1 - t0)
            trips.append(t2 - t0)
            same += int.from_bytes(answer, "little") == cpu
    finally:
        a.close()
        os.waitpid(pid, 0)
    return {"write_us": statistics.median(writes) * 1e6,
            "round_trip_us": statistics.median(trips) * 1e6, "same_cpu": same,
            "rounds": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--after", type=float, default=200.0,
                        help="µs the writer keeps working after its write")
    parser.add_argument("--work", type=float, default=300.0,
                        help="µs the woken process works before it answers")
    parser.add_argument("--unix", action="store_true", help="a Unix socket pair, not TCP")
    args = parser.parse_args()
    for after in (0.0, args.after):
        r = run(after_s=after / 1e6, work_s=args.work / 1e6, unix=args.unix)
        print(f"after {after:5.0f} µs, work {args.work:.0f} µs: write {r['write_us']:6.1f} µs, "
              f"round trip {r['round_trip_us']:6.1f} µs, woken on the writer's CPU "
              f"{r['same_cpu']}/{r['rounds']}")


if __name__ == "__main__":
    main()
