"""Every exception tokenwire raises on purpose derives from :class:`TokenwireError`.

The tree::

    TokenwireError
    ├── ProtocolError                 (abstract: the HTTP status, wire ``code`` and ``param``)
    │   ├── LocalProtocolError        we were asked to produce something the protocol forbids
    │   │   └── RetryStateError       a retry state machine driven out of order
    │   │       └── RetryDeadlinePassed  an attempt started past its budget's deadline
    │   └── RemoteProtocolError       the peer sent bytes that break the protocol
    │       ├── FrameTooLarge         a frame (or buffered partial frame) over the size limit
    │       ├── VarintOverflow        a varint longer than its type allows (5 bytes for uint32)
    │       ├── TruncatedStream       the stream ended inside a frame, or without `done`
    │       ├── DataAfterDone         bytes after the terminal frame
    │       ├── MalformedFrame        anything else that does not parse as a frame / request
    │       └── DecompressionError    a Content-Encoding body that does not decode
    │           └── DecompressionLimitExceeded  decodes past the decompressed-bytes budget
    ├── MapError                      tokenizer maps
    │   ├── HashFormatError           not a `sha256:<64 hex>` string
    │   ├── MapHashMismatch           sha256 of the raw bytes differs from the pinned hash
    │   ├── MapValidationError        a field is missing or wrong; `.field` names it
    │   └── MapNotFound               unknown id or alias
    ├── PretokError                   pre-tokenizer programs
    │   └── UnsupportedProgram        unknown program version, op or stage (never guessed)
    ├── TokenizeError                 text -> ids
    │   ├── VocabMiss                 a symbol with no id and no byte fallback
    │   └── PatternTimeout            a map's pre_tokenizer_pattern ran past its time budget
    ├── GenerateError                 building a map from a tokenizer.json or GGUF file
    ├── PolicyValidationError         a safety-policy descriptor field is wrong; `.field`
    ├── ConfigError                   a deployment setting (env value) is not understood
    │   ├── ConfigErrors              several at once: `.problems` lists each (one report)
    │   └── ListenError               the address to serve on cannot be bound (exit 3)
    ├── CodecVersionRequired          the server answered 426: upgrade the client
    ├── DiscoveryError                resolving a /.well-known/codec/ document failed (§6.3)
    │   ├── DiscoveryNotFound         404 for the document, the pointer target or the dict
    │   ├── DiscoveryHashMismatch     fetched bytes do not hash to the pinned/pointer hash
    │   ├── DiscoveryPointerError     a malformed pointer, another id, or a second hop
    │   ├── DiscoveryDocumentInvalid  not JSON, or not a valid map / policy / id
    │   └── DiscoveryInsecureURL      an http:// URL without allow_http=True
    ├── CodecHTTPError                the server answered an error status (`.status`, `.body`)
    ├── CodecTransportError           the connection failed (an httpx error, translated)
    │   └── CodecDeadlineExceeded     the whole request outlasted the client's deadline=
    └── ServerBusy                    the gateway's request queue is full (503, retry later)

    RemoteProtocolError also has, for the client side of §2.7:
        TokenizerMapMismatch          Codec-Tokenizer-Map differs from the pinned map (fatal)
        ZstdDictError                 Codec-Zstd-Dict missing, misplaced or malformed
        ContentTypeMismatch           not the binary type asked for (e.g. a JSON-SSE fallback)
    and, for the gateway's APIs (refused before any upstream is asked):
        InvalidRequest                a request field is wrong; ``param`` names it
            UnknownModel              the request names a model not served here (404)
            ResponsesRequestError     a Responses request refused before any upstream
                CompactionRefused     a ``compaction_trigger`` item: final, never retried
                PreviousResponseNotFound  ``previous_response_id`` unknown or expired

Every :class:`ProtocolError` carries what a server answers with: ``status_hint`` (the HTTP
status), ``code`` (a stable machine-readable code: OpenAI's own where one exists, such as
``invalid_value`` or ``model_not_found``; ours, prefixed ``codec_``, for Codec framing) and
``param`` (the request field at fault, or None). The gateway renders them in one place per
API shape (``gateway/http/errors.py``); a class name never reaches the wire.

Other libraries' exceptions (msgspec, zstandard, json, ...) are translated at the
boundary of the layer that calls them, always with ``raise ... from exc``; anything
else escaping a decoder is a bug.
"""

from __future__ import annotations

import re


class TokenwireError(Exception):
    """Root of every error tokenwire raises deliberately."""


class ProtocolError(TokenwireError):
    """A Codec protocol violation. Abstract: raise a Local or Remote subclass.

    ``status_hint`` is the HTTP status a server should answer with when the violation is
    in a request it received; ``code`` the machine-readable code of its error body (None:
    the renderer picks one from the status) and ``param`` the request field it is about.
    Subclasses set a class-level ``code``; a raise site may override both.
    """

    status_hint: int = 400
    code: str | None = None
    param: str | None = None

    def __init__(self, msg: str, *, status_hint: int | None = None, code: str | None = None,
                 param: str | None = None) -> None:
        if type(self) is ProtocolError:
            raise TypeError("ProtocolError is abstract; raise Local- or RemoteProtocolError")
        super().__init__(msg)
        if status_hint is not None:
            self.status_hint = status_hint
        if code is not None:
            self.code = code
        if param is not None:
            self.param = param


class LocalProtocolError(ProtocolError):
    """We were asked to do something the protocol does not allow (an API misuse)."""


class RemoteProtocolError(ProtocolError):
    """The peer's bytes break the protocol."""


# The ``codec_`` codes are ours (no API has words for Codec framing); README "Error codes".


class FrameTooLarge(RemoteProtocolError):
    status_hint = 413
    code = "codec_frame_too_large"


class VarintOverflow(RemoteProtocolError):
    code = "codec_varint_overflow"


class TruncatedStream(RemoteProtocolError):
    code = "codec_truncated"


class DataAfterDone(RemoteProtocolError):
    code = "codec_data_after_done"


class MalformedFrame(RemoteProtocolError):
    code = "codec_malformed_frame"


class MapError(TokenwireError):
    """Problems loading, verifying or validating a tokenizer map."""


class HashFormatError(MapError, ValueError):
    pass


class MapHashMismatch(MapError):
    def __init__(self, expected: str, actual: str, source: str = "") -> None:
        where = f" for {source}" if source else ""
        super().__init__(f"sha256 mismatch{where}: expected {expected}, got {actual}")
        self.expected = expected
        self.actual = actual


class MapValidationError(MapError):
    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"invalid tokenizer map: `{field}` {problem}")
        self.field = field
        self.problem = problem


class MapNotFound(MapError, LookupError):
    pass


class PretokError(TokenwireError):
    pass


class UnsupportedProgram(PretokError):
    pass


class TokenizeError(TokenwireError):
    pass


class VocabMiss(TokenizeError):
    def __init__(self, symbol: str, map_id: str = "") -> None:
        where = f" of map {map_id}" if map_id else ""
        super().__init__(
            f"symbol {symbol!r} is not in the vocab{where} and the map has no byte fallback"
        )
        self.symbol = symbol


class PatternTimeout(TokenizeError):
    """A map's ``pre_tokenizer_pattern`` (a regex the map's publisher wrote) did not finish
    on a text within its time budget: a pattern that backtracks catastrophically."""


class GenerateError(TokenwireError):
    pass


class DecompressionError(RemoteProtocolError):
    """A body that does not decode under its Content-Encoding (codec-spec §2.7, §4.1)."""

    code = "invalid_content_encoding"


class DecompressionLimitExceeded(DecompressionError):
    """The body decodes to more than the decompressed-bytes budget (rejected, not truncated)."""

    status_hint = 413
    code = "request_too_large"


class PolicyValidationError(TokenwireError, ValueError):
    """A safety-policy descriptor breaks its schema (codec-spec §5.5); `.field` names where."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"invalid safety-policy descriptor: `{field}` {problem}")
        self.field = field
        self.problem = problem


class ConfigError(TokenwireError, ValueError):
    """A deployment setting (e.g. a CODEC_* environment value) is not understood."""

    #: The ``tokenwire`` command's exit status for this error (README "Exit statuses").
    exit_status = 1


class ConfigErrors(ConfigError):
    """Every problem a configuration has, found in one pass (keys, maps, variables, probes),
    so one start shows them all. ``problems`` holds each message; ``str()`` lists them."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        #: What did parse (a ``GatewayConfig`` of the valid upstreams), when known: its
        #: upstreams can still be probed so that the report also names unreachable ones.
        self.config: object | None = None
        if len(self.problems) == 1:
            super().__init__(self.problems[0])
        else:
            super().__init__(f"{len(self.problems)} problems in the configuration:\n"
                             + "\n".join(f"  - {p}" for p in self.problems))


class ListenError(ConfigError):
    """The host and port to serve on cannot be bound (in use, not an address of this host,
    a privileged port)."""

    exit_status = 3


class CodecVersionRequired(TokenwireError):
    """The server answered 426: it mandates a newer Codec version (codec-spec §5.4)."""

    def __init__(
        self,
        minimum_version: str,
        required_features: tuple[str, ...],
        client_version: str,
        *,
        docs_url: str | None = None,
        deployment_id: str | None = None,
        error: str = "codec_version_required",
    ) -> None:
        feats = ", ".join(required_features) or "none listed"
        super().__init__(_escaped(  # the server's words (§5.4 body)
            f"server requires Codec >= {minimum_version} (features: {feats}); "
            f"client declared {client_version}"
            + (f"; see {docs_url}" if docs_url else "")
        ))
        self.minimum_version = minimum_version
        self.required_features = required_features
        self.client_version = client_version
        self.docs_url = docs_url
        self.deployment_id = deployment_id
        self.error = error


# -- client side: discovery (codec-spec §6.3) and response checks (§2.7) --------------------


class DiscoveryError(TokenwireError):
    """A ``/.well-known/codec/`` document could not be resolved (§6.3); callers may fall back."""


class DiscoveryNotFound(DiscoveryError, LookupError):
    """404 for the discovery document, the pointer target or a dictionary (§6.3 step 1)."""


class DiscoveryHashMismatch(DiscoveryError):
    """Fetched bytes do not hash to the pinned or pointer hash (§6.3 step 5, §4.4)."""

    def __init__(self, expected: str, actual: str, source: str = "") -> None:
        where = f" for {source}" if source else ""
        super().__init__(f"sha256 mismatch{where}: expected {expected}, got {actual}")
        self.expected = expected
        self.actual = actual


class DiscoveryPointerError(DiscoveryError):
    """A pointer lacks id/url/hash, names another id, has a bad hash, or points to a pointer."""


class DiscoveryDocumentInvalid(DiscoveryError):
    """The document is not JSON, not a valid map or policy, or its inline id differs."""


class DiscoveryInsecureURL(DiscoveryError):
    """An ``http://`` (or other non-https) URL where https is required (§6.1, §10 item 14)."""


class CodecHTTPError(TokenwireError):
    """The server answered an error status other than 426; ``.status`` and ``.body`` say what."""

    def __init__(self, status: int, body: bytes, url: str = "") -> None:
        self.status = status
        self.body = body
        #: The server's own words: ``error.message`` of an OpenAI or Anthropic error body,
        #: whole; otherwise the start of the body as text.
        self.message, self.code = _error_message(body)
        super().__init__(f"{url or 'server'} answered {status}: {self.message}")


#: How much of a body that is not a JSON error document goes into the message (an HTML
#: error page from a proxy can be large; its start says what it is).
ERROR_TEXT_PREVIEW = 2000


def _error_message(body: bytes) -> tuple[str, str | None]:
    """``(message, code)`` from an error body: OpenAI's and Anthropic's ``{"error": {...}}``
    in full, anything else as (the start of) its text."""
    from tokenwire import peer_json

    try:
        doc = peer_json.loads(body)
    except ValueError:
        doc = None
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        code = err.get("code") or err.get("type")
        label = f" ({code})" if isinstance(code, str) and code else ""
        return _escaped(err["message"] + label), code if isinstance(code, str) else None
    text = body.decode("utf-8", "replace").strip()
    if len(text) > ERROR_TEXT_PREVIEW:
        text = text[:ERROR_TEXT_PREVIEW] + f"... ({len(body):,} B in all)"
    return _escaped(text) or "(empty body)", None


#: C0 and C1 control characters and DEL. A server's words end up on a user's terminal (the
#: CLI's one error line): ESC sequences there set the window title or erase the line and
#: write another, and a newline starts a line that looks like ours.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _escaped(text: str) -> str:
    """``text`` with each control character written as its Python escape (``\\x1b``)."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


class CodecTransportError(TokenwireError):
    """The connection to the server failed (an httpx error, translated at the client)."""


class CodecDeadlineExceeded(CodecTransportError):
    """The whole request (discovery, POST and body) ran past the client's ``deadline=``."""


class TokenizerMapMismatch(RemoteProtocolError):
    """``Codec-Tokenizer-Map`` names another map than the one pinned (§2.7): fatal."""

    code = "codec_tokenizer_map_mismatch"


class ZstdDictError(RemoteProtocolError):
    """zstd without ``Codec-Zstd-Dict``, the header on a non-zstd body, or a bad value (§2.7)."""

    code = "codec_zstd_dict"


class ContentTypeMismatch(RemoteProtocolError):
    """The response is not the binary type requested, e.g. a JSON-SSE fallback (§2.4, §2.7)."""

    code = "codec_content_type_mismatch"

    def __init__(self, msg: str, *, content_type: str, expected: str) -> None:
        super().__init__(msg)
        self.content_type = content_type
        self.expected = expected

    @property
    def is_json_sse(self) -> bool:
        return self.content_type.split(";")[0].strip().lower() == "text/event-stream"


class ServerBusy(TokenwireError):
    """The gateway's request queue is full; answered as 503 with ``Retry-After``."""

    status_hint = 503


class InvalidRequest(RemoteProtocolError):
    """An API request refused before any upstream is asked: ``param`` names the field and
    ``code`` is OpenAI's word for what is wrong with it (``invalid_value``, ``invalid_type``,
    ``missing_required_parameter``, ``unsupported_value``, ...)."""

    code = "invalid_value"


class UnknownModel(InvalidRequest):
    """The request names a model this gateway does not serve (404, OpenAI ``model_not_found``)."""

    status_hint = 404
    code = "model_not_found"
    param = "model"


class ResponsesRequestError(InvalidRequest):
    """A Responses request refused before any upstream (its own codes below)."""


class CompactionRefused(ResponsesRequestError):
    """A ``compaction_trigger`` input item: refused as final (400; ``invalid_prompt`` in-stream)."""

    code = "invalid_request"
    #: The code a stream's ``response.failed`` carries: Codex does not retry it.
    stream_code = "invalid_prompt"


class PreviousResponseNotFound(ResponsesRequestError):
    """``previous_response_id`` names no stored response (unknown, expired, or not stored)."""

    code = "previous_response_not_found"


class RetryStateError(LocalProtocolError):
    """A ``supervision.retry.RetryState`` method called out of order (a bug in the caller)."""


class RetryDeadlinePassed(RetryStateError):
    """An attempt was started at or after its retry budget's or the request's deadline."""
