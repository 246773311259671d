"""Run every benchmark in one process, one after the other, and write BENCHMARKS.md.

    TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 .venv/bin/python -m bench.run

Figures, not pass/fail: compare rows within one run (the machine is shared and noisy).
Each bench module exposes ``run() -> list[dict]``; rows are printed as markdown tables
grouped by module, followed by the module's ``NOTES`` (markdown) when it has them.
``--only NAME`` runs one module and replaces only its section (stamped with the command), so
a long bench can be rerun alone; ``--no-write`` leaves BENCHMARKS.md alone.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "BENCHMARKS.md"
MODULES = ["bench_encode", "bench_decode", "bench_maps", "bench_frames", "bench_compression",
           "bench_serve", "bench_upstreams", "bench_load"]
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def _cell(value: object) -> str:
    """Floats to a readable precision: 3 significant digits, never scientific notation."""
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def table(rows: list[dict]) -> str:
    """Markdown tables; rows with different columns (one bench measuring two things) get
    a table each, in order of first appearance."""
    groups: dict[tuple[str, ...], list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row), []).append(row)
    out = []
    for cols, group in groups.items():
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(_cell(r[c]) for c in cols) + " |" for r in group]
        out.append("\n".join(lines))
    return "\n\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=MODULES)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    sections = []
    for name in [args.only] if args.only else MODULES:
        module = importlib.import_module(f"bench.{name}")
        print(f"## {name}", file=sys.stderr, flush=True)
        rows = module.run()
        doc = (module.__doc__ or "").strip().splitlines()[0]
        notes = getattr(module, "NOTES", "").strip()  # how to read the tables, if it says
        sections.append(f"### {name}: {doc}\n\n{table(rows)}\n"
                        + (f"\n{notes}\n" if notes else ""))
        print(table(rows), file=sys.stderr, flush=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    if args.no_write:
        return 0
    text = OUT.read_text("utf-8") if OUT.exists() else f"# Benchmarks\n\n{BEGIN}\n{END}\n"
    head, _, rest = text.partition(BEGIN)
    block, _, tail = rest.partition(END)
    if args.only:
        where = (f"Run separately (`.venv/bin/python -m bench.run --only {args.only}`, {stamp} "
                 f"on {platform.machine()}, {os.cpu_count()} cores, Python "
                 f"{platform.python_version()}).\n\n")
        title, _, rest_of_section = sections[0].partition("\n\n")
        body = BEGIN + _replace_section(block, args.only,
                                         f"{title}\n\n{where}{rest_of_section}") + END
    else:
        body = (f"{BEGIN}\nRun {stamp} on {platform.machine()}, {os.cpu_count()} cores, Python "
                f"{platform.python_version()}, single-threaded.\n\n" + "\n".join(sections) + END)
    OUT.write_text(head + body + tail, "utf-8")
    return 0


def _replace_section(block: str, name: str, section: str) -> str:
    """``block`` with the section headed ``### name:`` (up to the next ``### ``) replaced by
    ``section``, or with ``section`` appended when there is none."""
    start = block.find(f"### {name}:")
    if start < 0:
        return block.rstrip("\n") + "\n\n" + section
    end = block.find("\n### ", start + 1)
    return block[:start] + section + (block[end + 1:] if end >= 0 else "")


if __name__ == "__main__":
    sys.exit(main())
