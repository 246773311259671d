"""OpenAI Completions (``POST /v1/completions``): request parsing and the JSON renderer.

The renderer writes what the ``openai`` SDK's ``Completion`` model expects, for a stream
(``text_completion`` chunks, one per text delta, a last chunk with ``finish_reason``, an
optional usage chunk with ``choices: []`` when ``stream_options.include_usage``, then
``data: [DONE]``) and for a single JSON body. vLLM's ``return_token_ids`` adds the ids to
each choice (``token_ids``), which lets a client compare the JSON and binary streams.

A failure after the stream started is an SSE event ``{"error": {...}}`` followed by
``[DONE]``: the SDK raises ``APIError`` with our message (STYLE §6 item 10).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from tokenwire.codec.frames import StreamFormat
from tokenwire.gateway.apis.limits import check_logit_bias, check_openai_attribution
from tokenwire.gateway.apis.logprobs import CompletionsLogprobs
from tokenwire.gateway.apis.params import (
    bad_request,
    parse_logprobs,
    parse_openai_fields,
    refuse_binary_logprobs,
)
from tokenwire.gateway.apis.sse import (
    SSE_CONTENT_TYPE,
    SSE_DONE,
    SSE_KEEPALIVE,
    failure_output,
    internal_error_output,
    json_bytes,
    openai_finish_reason,
    sse_data,
)
from tokenwire.gateway.apis.usage_json import openai_usage
from tokenwire.gateway.defaults import COMPLETIONS_MAX_TOKENS
from tokenwire.gateway.ir import (
    Event,
    Failure,
    Finish,
    GenerationRequest,
    Heartbeat,
    Prompt,
    PromptIds,
    PromptText,
    ResponseMeta,
    TokenDelta,
    TokenLogprob,
    Usage,
)
from tokenwire.gateway.request_fields import extensions_of, refuse_unsupported

__all__ = ["CompletionsCall", "CompletionsRenderer", "parse_completions_request"]

#: A prompt of token ids as msgspec checks it, in C: integers (not booleans, not floats),
#: none negative. A body near the limit holds millions of ids, and checking them one by one
#: in Python held the event loop for most of a second; what is wrong with a refused list is
#: found with C loops too (``map``, ``min``, ``list.index``).
_PROMPT_IDS = tuple[Annotated[int, msgspec.Meta(ge=0)], ...]

class CompletionsCall:
    """A parsed ``/v1/completions`` body: the IR request plus how to answer it."""

    __slots__ = ("include_usage", "model", "request", "return_token_ids", "stream",
                 "stream_format")

    def __init__(
        self, request: GenerationRequest, *, model: str | None, stream: bool,
        stream_format: StreamFormat | None, include_usage: bool, return_token_ids: bool,
    ) -> None:
        self.request = request
        self.model = model
        self.stream = stream
        self.stream_format = stream_format
        self.include_usage = include_usage
        self.return_token_ids = return_token_ids


def parse_completions_request(body: Any, *, request_id: str = "") -> CompletionsCall:
    """Validate a decoded JSON body (codec-spec §2.3); raise a 400-class error. An omitted
    ``max_tokens`` is OpenAI's documented 16 (``gateway/defaults.py``)."""
    common = parse_openai_fields(body, default_max_tokens=COMPLETIONS_MAX_TOKENS)
    sampling, fmt, model = common.sampling, common.stream_format, common.model
    refuse_unsupported("completions", body)  # fields no upstream can take here
    logprobs, top_logprobs = parse_logprobs(body, chat=False)
    refuse_binary_logprobs(fmt, logprobs)
    check_openai_attribution(body)  # forwarded as hints: bounded here
    check_logit_bias(body.get("logit_bias"))
    request = GenerationRequest(
        prompt=_prompt(body.get("prompt")), **sampling.request_fields(),
        logprobs=logprobs, top_logprobs=top_logprobs, api="completions",
        extensions=extensions_of("completions", body), request_id=request_id,
    )
    return CompletionsCall(
        request, model=model, stream=common.stream, stream_format=fmt,
        include_usage=common.include_usage,
        return_token_ids=bool(body.get("return_token_ids", False)),
    )


def _prompt(value: Any) -> Prompt:
    # OpenAI accepts a string, a list of ints, or a batch of either; we serve one prompt.
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]
    if isinstance(value, str):
        return PromptText(text=value)
    if isinstance(value, list) and value:
        try:
            return PromptIds(ids=msgspec.convert(value, _PROMPT_IDS, strict=True))
        except msgspec.ValidationError:
            pass  # refused: the checks below say why
        types = list(map(type, value))
        if bool in types:  # JSON true is not the id 1
            raise bad_request(f"prompt[{types.index(bool)}] is a boolean; token ids are "
                              "integers")
        if set(types) == {int}:
            raise bad_request("prompt token ids must be non-negative", param="prompt")
    if isinstance(value, list) and len(value) > 1:
        raise bad_request("batched prompts are not supported; send one prompt per request",
                          param="prompt", code="unsupported_value")
    if value is None:
        raise bad_request("prompt is required", param="prompt",
                          code="missing_required_parameter")
    raise bad_request("prompt must be a string or a non-empty list of token ids",
                      param="prompt", code="invalid_type")


class CompletionsRenderer:
    """IR -> Completions SSE chunks (``stream=True``) or one JSON body (``stream=False``)."""

    def __init__(
        self, *, completion_id: str, model: str, created: int, stream: bool,
        include_usage: bool = False, return_token_ids: bool = False,
    ) -> None:
        self.stream = stream
        self.content_type = SSE_CONTENT_TYPE if stream else "application/json"
        self._base = {"id": completion_id, "object": "text_completion", "created": created,
                      "model": model}
        self._include_usage = include_usage
        self._token_ids = return_token_ids
        self._text: list[str] = []
        self._ids: list[int] = []
        self._usage: Usage | None = None
        #: Logprobs not sent yet: a stream sends them with the next text (or the last chunk).
        self._pending: list[TokenLogprob] = []
        self._arrays = CompletionsLogprobs()
        self.done = False

    def on_event(self, event: Event) -> list[bytes]:
        match event:
            case TokenDelta(ids=ids, text=text, logprobs=logprobs):
                self._pending += logprobs
                if not self.stream:
                    self._text.append(text)
                    self._ids.extend(ids)
                elif text or (ids and self._token_ids):
                    return [sse_data(self._chunk(text, None, ids))]
            case Usage():
                self._usage = event
            case ResponseMeta(model=model) if model:  # a fallback model serves the request
                self._base["model"] = model
            case Finish(reason=reason):
                self.done = True
                return self._finish(openai_finish_reason(reason, chat=False))
            case Failure():
                self.done = True
                return failure_output(event, stream=self.stream)
            case Heartbeat() if self.stream:
                return [SSE_KEEPALIVE]
        return []

    def on_error(self, exc: BaseException) -> list[bytes]:
        if self.done:
            return []
        self.done = True
        return internal_error_output(exc, stream=self.stream)

    def _chunk(self, text: str, finish: str | None, ids: tuple[int, ...] = ()) -> dict:
        logprobs = None
        if self._pending:
            logprobs, self._pending = self._arrays.render(self._pending), []
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": logprobs,
                                  "finish_reason": finish}
        if self._token_ids:
            choice["token_ids"] = list(ids)
        return {**self._base, "choices": [choice]}

    def _usage_dict(self) -> dict[str, Any] | None:
        return openai_usage(self._usage)

    def _finish(self, reason: str) -> list[bytes]:
        if not self.stream:
            body = self._chunk("".join(self._text), reason, tuple(self._ids))
            body["usage"] = self._usage_dict()
            return [json_bytes(body)]
        out = [sse_data(self._chunk("", reason))]
        if self._include_usage:
            out.append(sse_data({**self._base, "choices": [], "usage": self._usage_dict()}))
        out.append(SSE_DONE)
        return out
