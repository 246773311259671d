"""``tokenwire serve`` settles its heap once built (``gateway/heap.py``). Checked in a child
process: freezing the test process's heap would keep every earlier test's objects."""

from __future__ import annotations

import subprocess
import sys

from tokenwire.gateway.heap import GEN0_THRESHOLD

CHILD = """
import gc
from tokenwire.gateway.heap import settle_after_startup
built = [[i] for i in range(1000)]  # what start-up built, still referenced
before = gc.get_threshold()
settle_after_startup()
after = gc.get_threshold()
print(gc.get_freeze_count() >= 1000, after[0], after[1:] == before[1:])
gc.collect()  # a full collection no longer walks the frozen objects, nor frees them
print(all(b == [i] for i, b in enumerate(built)))
"""


def test_settle_freezes_start_up_and_raises_only_the_youngest_threshold() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", str(GEN0_THRESHOLD), "True", "True"]
