"""Decoding JSON a peer sent (a Codec server's error body, a discovery document).

``json.loads`` and msgspec recurse once per nesting level and stop at Python's recursion
limit with a ``RecursionError``, which is no ``ValueError``: 60 KB of ``[`` in a 426 or 500
body, ``index.json`` or a map document crashed the client with it, past every
``except ValueError`` written for a body that is not JSON. Here it is one more way for a
body not to be JSON.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["loads"]


def loads(data: bytes | str) -> Any:
    """``json.loads``, raising ``ValueError`` (never ``RecursionError``) for any bad body."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("the JSON nests deeper than Python's recursion limit") from None
