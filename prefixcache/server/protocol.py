"""Request bodies of the OpenAI API, as pydantic models, and their validation.

Field names and defaults are OpenAI's (``/v1/completions``, ``/v1/chat/completions``),
plus the vLLM extensions that prefixcache implements (``top_k``, ``min_p``,
``repetition_penalty``, ``min_tokens``, ``ignore_eos``, ``stop_token_ids``,
``skip_special_tokens``, ``include_stop_str_in_output``, ``cache_salt``,
``add_special_tokens``, ``add_generation_prompt``, ``structured_outputs`` and the older
``guided_*`` fields, see ``server/structured.py``), and ``cache_ttl``: pin the prompt's
full pages for that long (seconds, or ``"30s"``, ``"5m"``, ``"1h"``; see
``prefixcache/cache/pins.py``); ``cache_control: {"type": "ephemeral", "ttl": "5m"}``
(Anthropic's shape; ``ttl`` defaults to ``"5m"``) says the same.

Bodies are parsed from JSON in pydantic's *strict* mode: ``"max_tokens": "10"`` or
``"stream": "true"`` is an error, not silently coerced (an int is accepted where a float
is expected, as JSON does not distinguish them).

Unknown fields follow vLLM: they are accepted and ignored, and the server logs a
warning naming them. OpenAI fields that are accepted but have no effect are listed in
:data:`IGNORED_FIELDS`; OpenAI features that would change the output and that
prefixcache does not implement are rejected with 400 naming the field
(:data:`UNSUPPORTED`), so an application never silently gets something else than it
asked for.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from prefixcache.http.errors import APIError, bad_request
from prefixcache.text.messages import MessageError, check_messages

# OpenAI fields accepted and ignored (they do not change the generated tokens).
IGNORED_FIELDS = {
    "completions": ("user",),
    "chat": ("user", "metadata", "store", "service_tier", "reasoning_effort",
             "prediction", "web_search_options"),
}
# ``tools`` and ``tool_choice`` are checked and planned in ``server/tools.py``. Fields
# rejected when set to a value we cannot honour: see ``check_unsupported``.
UNSUPPORTED = ("best_of > 1 with stream", "suffix", "logit_bias (non-empty)",
               "echo with logprobs",
               "response_format other than text, json_object, json_schema",
               "functions / function_call (deprecated: use tools)",
               "modalities other than ['text']", "audio", "non-text message content parts")

MAX_CACHE_SALT_CHARS = 1024


class _Body(BaseModel):
    # Unknown fields are kept in ``model_extra`` (logged and ignored by the server).
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Body):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False  # vLLM: usage in every chunk


class _SamplingFields(_Body):
    """Fields shared by completions and chat completions."""

    model: str | None = None
    frequency_penalty: float | None = 0.0
    presence_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    n: int | None = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    # vLLM extensions
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = 0
    ignore_eos: bool | None = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool | None = True
    include_stop_str_in_output: bool | None = False
    cache_salt: str | None = None
    cache_ttl: float | str | None = None
    cache_control: dict[str, Any] | None = None
    # structured outputs (server/structured.py): OpenAI's, then vLLM's
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    guided_decoding_backend: str | None = None
    prompt_cache_diagnostics: bool | dict[str, Any] | None = None  # server/diagnostics.py
    session_id: str | None = None  # an agent session (server/sessions.py)
    prompt_cache_key: str | None = None  # OpenAI's name for it


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions``. ``prompt`` is a string, an array of token ids, or an
    array of either (one choice per prompt, ``index`` in prompt order)."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16
    echo: bool | None = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None
    add_special_tokens: bool | None = True  # vLLM: prepend BOS to string prompts


class ChatMessage(_Body):
    # the same roles as prefixcache.text.messages.MESSAGE_ROLES (checked by a test)
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions``; the model's chat template renders ``messages``."""

    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    reasoning_effort: str | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    add_generation_prompt: bool | None = True  # vLLM


# Clearer messages for fields whose type is a union (pydantic lists every branch).
_UNION_MESSAGES = {
    "prompt": "prompt must be a string, an array of token ids (integers), or an array "
              "of strings or of token-id arrays",
    "stop": "stop must be a string or an array of strings",
    "content": "content must be a string or an array of content parts",
    "tool_choice": "tool_choice must be a string or an object",
}


def parse_body(model: type[_Body], raw: bytes) -> _Body:
    """Parse and type-check a JSON body. Raises :class:`APIError` (400) naming the
    field at fault (``messages[2].role``), or ``param=None`` for invalid JSON."""
    try:
        return model.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        raise _to_api_error(exc) from None


def _to_api_error(exc: ValidationError) -> APIError:
    errors = exc.errors(include_url=False)
    first = errors[0]
    kind, loc = first["type"], first["loc"]
    if kind == "json_invalid":
        return bad_request(f"the request body is not valid JSON: {first['msg']}")
    if not loc:
        return bad_request("the request body must be a JSON object")
    param = _param_name(loc)
    leaf = next((p for p in reversed(loc) if isinstance(p, str) and p in _UNION_MESSAGES), None)
    if kind == "missing":
        msg = f"{param} is required"
    elif leaf is not None and len([e for e in errors if e["loc"][:1] == loc[:1]]) > 1:
        msg = _UNION_MESSAGES[leaf]
    else:
        msg = f"{param}: {first['msg']}"
    return bad_request(msg, param=param)


def _param_name(loc: tuple) -> str:
    """``('messages', 0, 'role')`` -> ``messages[0].role``; union-branch tags that
    pydantic adds to the location (``'str'``, ``'list[int]'``) are dropped."""
    out = str(loc[0])
    fields = set(ChatMessage.model_fields) | set(StreamOptions.model_fields)
    for part in loc[1:]:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in fields:
            out += f".{part}"
        else:
            break
    return out


def check_unsupported(req: CompletionRequest | ChatCompletionRequest) -> None:
    """Reject OpenAI features that would change the output and are not implemented."""
    if req.logit_bias:
        raise bad_request("logit_bias is not supported", "logit_bias")
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed when stream is true",
                          "stream_options")
    if req.cache_salt is not None and not (0 < len(req.cache_salt) <= MAX_CACHE_SALT_CHARS):
        raise bad_request(f"cache_salt must be a non-empty string of at most "
                          f"{MAX_CACHE_SALT_CHARS} characters", "cache_salt")
    if isinstance(req, CompletionRequest):
        if req.stream and req.best_of is not None and req.best_of > 1:
            raise bad_request("best_of cannot be used with stream (which samples are "
                              "returned is known only when all finished)", "best_of")
        if req.suffix:
            raise bad_request("suffix is not supported", "suffix")
        if req.echo and req.logprobs is not None:
            raise bad_request("echo together with logprobs is not supported", "echo")
        return
    if not req.messages:
        raise bad_request("messages must contain at least one message", "messages")
    for old in ("functions", "function_call"):
        if getattr(req, old) is not None:
            raise bad_request(f"{old} is deprecated and not supported; use tools and "
                              "tool_choice", old)
    if req.modalities is not None and req.modalities != ["text"]:
        raise bad_request("only the 'text' modality is supported", "modalities")
    if req.audio is not None:
        raise bad_request("audio output is not supported", "audio")
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs requires logprobs to be true", "top_logprobs")
    try:
        check_messages(message_dicts(req))
    except MessageError as exc:
        raise bad_request(str(exc), exc.param) from None

def message_dicts(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    """Messages as plain dicts for the chat template (``None`` fields dropped; unknown
    message fields are passed through, as some templates read them)."""
    return [m.model_dump(exclude_none=True) for m in req.messages]


def ignored_fields(req: CompletionRequest | ChatCompletionRequest, kind: str) -> list[str]:
    """Fields present in the body that have no effect: unknown ones and
    :data:`IGNORED_FIELDS` that were set."""
    names = sorted(req.model_extra or {})
    names += [f for f in IGNORED_FIELDS[kind] if f in req.model_fields_set and f != "user"]
    return names


__all__ = ["APIError", "ChatCompletionRequest", "ChatMessage", "CompletionRequest",
           "IGNORED_FIELDS", "StreamOptions", "check_unsupported", "ignored_fields",
           "message_dicts", "parse_body"]
