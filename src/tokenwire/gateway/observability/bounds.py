"""What every value of a request record passes through before a log line or a metric
label: the bounds, the closed vocabularies and the sanitisers (``records.py`` uses them; the
privacy and cardinality rules they enforce are described there).

Nothing here keeps state but :class:`LabelGuard`, which bounds one open label.
"""

from __future__ import annotations

import math
import re
import threading
from typing import Final

from tokenwire.gateway.ir import FailureClass

__all__ = [
    "APIS", "API_BY_PATH", "BUDGETS", "ENCODINGS", "FAILOVER", "FAILURE_CLASSES", "MAX_COUNT",
    "MAX_ID_CHARS", "MAX_LABEL_CHARS", "MAX_LABEL_VALUES", "OTHER", "OUTCOMES", "UNSPECIFIED",
    "USAGE_SOURCES", "LabelGuard", "api_for_path", "bounded_count", "bounded_id",
    "bounded_seconds", "closed_value", "safe_code", "to_ms",
]

#: Seed: "bounded request/provider/model identifiers". 128 keeps a UUID, a ``resp_`` id and
#: any realistic model path whole while capping what a client-chosen string can cost.
MAX_ID_CHARS: Final = 128
#: Prometheus label values: shorter than log identifiers, because every value is a series.
MAX_LABEL_CHARS: Final = 64
#: Distinct values kept per open label before new ones fold into ``"other"``. Configured
#: models and upstreams are far fewer; the cap only bites on client-invented names.
MAX_LABEL_VALUES: Final = 64
#: Codes are kept in logs only in this shape (upstream codes such as ``rate_limit_exceeded``,
#: ``exceed_context_size_error``): a sentence, a key or a token does not fit it.
_CODE_RE: Final = re.compile(r"[a-z0-9_.-]{1,64}")
OTHER: Final = "other"
UNSPECIFIED: Final = "unspecified"

#: The APIs tokenwire serves, as ``api`` label values. ``codec`` is any Codec binary stream
#: (``/v1/completions`` with a binary ``stream_format`` and ``/v1/completions/codec``).
APIS: Final = frozenset({"responses", "messages", "chat_completions", "completions", "codec"})
#: The ``api`` of a request refused before its route ran (middleware rejections); a route
#: that knows better (``/v1/completions`` with a binary ``stream_format``) passes ``codec``.
API_BY_PATH: Final = {
    "/v1/responses": "responses", "/v1/messages": "messages",
    "/v1/chat/completions": "chat_completions", "/v1/completions": "completions",
    "/v1/completions/codec": "codec",
}
#: Content codings of the bytes written to the client.
ENCODINGS: Final = frozenset({"identity", "gzip", "br", "zstd"})
#: The retry budgets of :mod:`tokenwire.gateway.supervision.retry` that can schedule a retry.
BUDGETS: Final = frozenset({"single", "connection", "throttle"})
#: A pool's failover to another replica before output (``routing/pool.py``): a retry that
#: spends no budget. Counted with the budgets, and in the log line only when it happened.
FAILOVER: Final = "failover"
#: How a request ended. ``cancelled`` means the client went away (see :meth:`finished`).
OUTCOMES: Final = frozenset({"completed", "failed", "cancelled"})
#: Failure classes: the IR's, plus ``cancelled`` for client disconnects and ``unspecified``
#: when a caller reports a failure without a class.
FAILURE_CLASSES: Final = frozenset({c.value for c in FailureClass} | {"cancelled", UNSPECIFIED})


#: Who counted a request's usage (``ir.UsageSource``), as the request log names it.
USAGE_SOURCES: Final = frozenset({"engine", "upstream", "gateway"})
MAX_COUNT: Final = 2**53  # exact in a JSON double; no real count gets near it


# -- sanitising ------------------------------------------------------------------------------

# Printable ASCII is kept; everything else (controls, newlines, non-ASCII) becomes "?", so an
# identifier can neither break a line nor smuggle look-alike characters into a log search.
_NON_PRINTABLE_RE: Final = re.compile(r"[^\x20-\x7e]")


def api_for_path(path: object) -> str:
    """The ``api`` label for a request path (``"other"`` for anything not an inference API)."""
    return API_BY_PATH.get(path, OTHER) if isinstance(path, str) else OTHER


def bounded_id(value: object, limit: int = MAX_ID_CHARS) -> str:
    """``value`` cut to ``limit`` characters of printable ASCII; non-strings become ``""``.

    Non-strings are not ``str()``-ed: the ``repr`` of an arbitrary object is exactly the kind
    of text (headers, bodies) that must not reach a log.
    """
    if not isinstance(value, str):
        return ""
    cut = value[:limit]
    if cut.isascii() and cut.isprintable():
        return cut
    return _NON_PRINTABLE_RE.sub("?", cut)


def safe_code(value: object) -> str | None:
    """An error code as logged: kept when it is code-shaped, else ``"other"``; None stays."""
    if value is None:
        return None
    if isinstance(value, str) and _CODE_RE.fullmatch(value):
        return str.__str__(value)  # a plain str, even from a StrEnum member
    return OTHER


def closed_value(value: object, vocabulary: frozenset[str]) -> str:
    """A value from a closed vocabulary (as a plain str, even from a StrEnum), or ``"other"``."""
    return str.__str__(value) if isinstance(value, str) and value in vocabulary else OTHER


def bounded_count(n: object) -> int:
    """A count as recorded: an int in ``[0, 2**53]`` (a bool is 0 or 1); anything else is 0."""
    if isinstance(n, int):
        return 0 if n < 0 else min(n, MAX_COUNT)
    if isinstance(n, float) and math.isfinite(n) and n > 0:
        return min(int(n), MAX_COUNT)
    return 0


def bounded_seconds(s: object) -> float:
    """A duration as recorded: finite and non-negative, else 0 (JSON has no NaN)."""
    if isinstance(s, int | float) and math.isfinite(s) and s > 0:
        return float(min(s, 1e9))
    return 0.0


def to_ms(s: float) -> float:
    return round(s * 1000.0, 1)


class LabelGuard:
    """Bounds one open label: values cut to 64 characters, at most 64 distinct kept.

    Raw strings are cached only for admitted labels, and the cache itself is capped, so a
    flood of random names costs a string cut each and no memory.
    """

    def __init__(self, max_values: int = MAX_LABEL_VALUES, max_chars: int = MAX_LABEL_CHARS):
        self._max_values = max_values
        self._max_chars = max_chars
        self._labels: set[str] = set()
        self._cache: dict[str, str] = {}
        self._lock = threading.Lock()  # scrapes and requests may run on different threads

    def __call__(self, value: object) -> str:
        if isinstance(value, str):
            hit = self._cache.get(value)
            if hit is not None:
                return hit
        bounded = bounded_id(value, self._max_chars) or "unknown"
        if bounded == OTHER:
            return OTHER
        with self._lock:
            if bounded not in self._labels:
                if len(self._labels) >= self._max_values:
                    return OTHER
                self._labels.add(bounded)
            if isinstance(value, str) and len(self._cache) < 4 * self._max_values:
                self._cache[value] = bounded
        return bounded
