"""Work measured without a clock: the lines the interpreter runs.

A test that something is linear (or does not grow per item) compares two of these counts;
a loop's line counts once per pass, so Python work per item shows and C work does not.
Timings are not used: they depend on the machine and on what else it runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def lines_run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """How many lines run in ``fn(*args, **kwargs)`` and everything it calls."""
    count = 0

    def trace(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return trace

    sys.settrace(trace)
    try:
        fn(*args, **kwargs)
    finally:
        sys.settrace(None)
    return count
