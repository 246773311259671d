"""How long each test file takes and which worker ran it: the suite's timeline.

Loaded by tests/conftest.py. On the xdist controller (or a single process) every test
report's setup/call/teardown time is added to its file. At the end a short per-worker summary
is printed (when each worker finished, its slowest files, where it started each one), so a CI
log shows whether the workers finished together. ``--durations-out=PATH`` also writes the
per-file seconds as JSON; ``tests/durations.json`` (written this way, see
``tests/suite_order.py``) is what orders the files so the slowest start first.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

#: Files listed per worker in the end-of-run summary: the tail of a run is what matters.
SUMMARY_FILES = 8


@dataclass
class FileSpan:
    """One file as one worker ran it: summed test time and its first start/last stop."""

    seconds: float = 0.0
    start: float = float("inf")
    stop: float = 0.0


@dataclass
class Timeline:
    #: worker id ("main" without xdist) -> file -> span
    workers: dict[str, dict[str, FileSpan]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(FileSpan)))

    def add(self, report: pytest.TestReport) -> None:
        node = getattr(report, "node", None)
        worker = node.gateway.id if node is not None else "main"
        span = self.workers[worker][report.nodeid.split("::", 1)[0]]
        span.seconds += report.duration
        if report.start:
            span.start = min(span.start, report.start)
            span.stop = max(span.stop, report.stop)

    def per_file(self) -> dict[str, float]:
        files: dict[str, float] = defaultdict(float)
        for spans in self.workers.values():
            for path, span in spans.items():
                files[path] += span.seconds
        return dict(sorted(files.items(), key=lambda kv: -kv[1]))

    def summary(self) -> list[str]:
        spans = [s for files in self.workers.values() for s in files.values() if s.stop]
        if not spans:
            return []
        t0 = min(s.start for s in spans)
        lines = []
        for worker in sorted(self.workers):
            files = self.workers[worker]
            busy = sum(s.seconds for s in files.values())
            end = max((s.stop for s in files.values()), default=t0) - t0
            lines.append(f"{worker}: {len(files)} files, {busy:.0f} s of tests, "
                         f"finished at +{end:.0f} s")
            slowest = sorted(files.items(), key=lambda kv: -kv[1].seconds)[:SUMMARY_FILES]
            for path, span in sorted(slowest, key=lambda kv: kv[1].start):
                lines.append(f"    +{span.start - t0:5.0f} .. +{span.stop - t0:5.0f} s "
                             f"{span.seconds:6.0f} s  {path}")
        return lines


def addoption(parser: pytest.Parser) -> None:
    parser.addoption("--durations-out", metavar="PATH", default=None,
                     help="write each test file's summed test seconds to PATH as JSON "
                          "(tests/durations.json orders the suite; see tests/suite_order.py)")


def configure(config: pytest.Config) -> None:
    """Record on the controller, or in a run without xdist (workers report to it)."""
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(TimelineRecorder(config), "suite-timeline")


class TimelineRecorder:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.timeline = Timeline()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.timeline.add(report)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        lines = self.timeline.summary()
        if lines:
            terminalreporter.section("suite timeline (tests/suite_timeline.py)")
            for line in lines:
                terminalreporter.write_line(line)
        out = self.config.getoption("durations_out")
        if out:
            per_file = {path: round(s, 1) for path, s in self.timeline.per_file().items()}
            Path(out).write_text(json.dumps(per_file, indent=1) + "\n", "utf-8")
            terminalreporter.write_line(f"per-file durations written to {out}")
