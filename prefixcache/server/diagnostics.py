"""Cache-miss diagnostics on the HTTP APIs: how a request asks, and the answer's shapes.

OpenAI routes (``/v1/completions``, ``/v1/chat/completions``): the body field
``prompt_cache_diagnostics`` (``true`` or ``{"compare_to": "<response id>"}``), or the
header ``X-Cache-Diagnostics: 1`` for clients that cannot add fields; the response has a
top-level ``prompt_cache_diagnostics`` object (a list, one per prompt, for several
completions prompts). Messages (``/v1/messages``): the body's ``diagnostics``
(``{"previous_message_id": "<msg id>" | null}``, Anthropic's beta) or the header
``anthropic-beta: cache-diagnosis-...`` (or ``X-Cache-Diagnostics``); the response's
``diagnostics.cache_miss_reason`` uses Anthropic's types where they exist
(``system_changed``, ``tools_changed``, ``messages_changed``, ``model_changed``,
``previous_message_not_found``), our reason code otherwise, and carries the full
answer under ``diagnostics.prefixcache``; a streamed Messages response carries the same
object in its ``message_delta`` event (the last before ``message_stop``). The answer's
keys and codes are :meth:`prefixcache.engine.miss_diagnostics.MissDiagnostics.diagnose`'s.
"""
from __future__ import annotations

from typing import Any

from prefixcache.engine.miss_diagnostics import (
    DiagnosticsRequest,
    diagnostics_request,
)
from prefixcache.http.errors import bad_request
from prefixcache.sampling_params import ParamError

HEADER = "x-cache-diagnostics"
ANTHROPIC_BETA = "cache-diagnosis-"
_TRUE = {"1", "true", "yes", "on"}


def _header_on(headers: Any) -> bool:
    value = headers.get(HEADER)
    if value is None:
        return False
    if value.strip().lower() not in _TRUE | {"0", "false", "no", "off"}:
        raise bad_request(f"the {HEADER} header must be 1 or 0, got {value[:32]!r}", HEADER)
    return value.strip().lower() in _TRUE


def openai_ask(value: Any, headers: Any, anchors: tuple[tuple[str, str], ...] = ()
               ) -> DiagnosticsRequest | None:
    """The ask of an OpenAI body's ``prompt_cache_diagnostics`` and the header (the body
    wins). Raises APIError 400 naming the field."""
    if value is None and _header_on(headers):
        value = True
    try:
        return diagnostics_request(value, anchors, "prompt_cache_diagnostics")
    except ParamError as exc:
        raise bad_request(str(exc), exc.param) from None


def anthropic_ask(body: dict, headers: Any) -> DiagnosticsRequest | None:
    """The ask of a Messages body (``diagnostics``, the beta header or ours), without
    anchors. Raises APIError 400 naming ``diagnostics``."""
    d = body.get("diagnostics")
    beta = any(b.strip().startswith(ANTHROPIC_BETA)
               for b in (headers.get("anthropic-beta") or "").split(","))
    if d is None:
        return DiagnosticsRequest() if beta or _header_on(headers) else None
    if not (isinstance(d, dict) and set(d) <= {"previous_message_id"}):
        raise bad_request("diagnostics must be {\"previous_message_id\": \"<message id>\" "
                          "| null}", "diagnostics")
    ref = d.get("previous_message_id")
    try:
        return diagnostics_request({"compare_to": ref}, (), "diagnostics")
    except ParamError:
        raise bad_request("diagnostics.previous_message_id must be a message id (a string "
                          "of 1 to 256 characters) or null",
                          "diagnostics.previous_message_id") from None


def anthropic_diagnostics(diag: dict) -> dict:
    """The Messages ``diagnostics`` object for an engine answer."""
    reason, section = diag["reason"], (diag.get("divergence") or {}).get("section") or ""
    if diag.get("compare_to_found") is False:
        kind: str | None = "previous_message_not_found"
    elif reason == "prefix_changed":
        kind = ("system_changed" if section.startswith("system") else
                "tools_changed" if section.startswith("tools") else "messages_changed")
    else:
        kind = None if reason == "none" else reason
    missed = diag["prompt_tokens"] - diag["cached_tokens"]
    return {"cache_miss_reason": None if kind is None else {
        "type": kind, "cache_missed_input_tokens": missed}, "prefixcache": diag}
