"""Structured outputs from a request body: OpenAI's ``response_format`` and vLLM's fields.

Accepted on ``/v1/completions`` and ``/v1/chat/completions``, at most one of:

- ``response_format``: ``{"type": "text"}`` (no constraint), ``{"type": "json_object"}``
  (any JSON object), ``{"type": "json_schema", "json_schema": {"name": ..., "schema":
  {...}, "strict": ...}}`` (JSON valid against ``schema``; without ``schema``, any JSON
  value). ``strict`` is accepted either way: the output always validates.
- vLLM's ``structured_outputs: {"json" | "regex" | "choice" | "grammar" | "json_object":
  ..., "disable_any_whitespace": bool}``;
- vLLM's older ``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar``
  (``guided_whitespace_pattern`` and ``guided_decoding_backend`` are refused: only
  xgrammar's whitespace rules are implemented).

A bad value is a 400 naming the body field it came from.
"""
from __future__ import annotations

from typing import Any

from prefixcache.http.errors import bad_request
from prefixcache.sampling_params import ParamError, StructuredOutputsParams

GUIDED_FIELDS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
                 "guided_grammar": "grammar"}
_RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")


def structured_outputs(body: Any) -> tuple[StructuredOutputsParams | None, str]:
    """The constraint a body asks for, and the body field it came from (for errors).

    Raises:
        APIError: 400: two constraint fields set, an unknown ``response_format`` type, a
            malformed value (``param`` names the field, e.g.
            ``response_format.json_schema.schema``).
    """
    found: list[tuple[str, Any]] = []
    rf = getattr(body, "response_format", None)
    if rf is not None and rf.get("type", "text") != "text":
        found.append(("response_format", rf))
    so = getattr(body, "structured_outputs", None)
    if so is not None:
        found.append(("structured_outputs", so))
    for name in GUIDED_FIELDS:
        if getattr(body, name, None) is not None:
            found.append((name, getattr(body, name)))
    for name in ("guided_whitespace_pattern", "guided_decoding_backend"):
        if getattr(body, name, None) is not None:
            raise bad_request(f"{name} is not supported (the grammar engine is xgrammar; "
                              "use structured_outputs.disable_any_whitespace)", name)
    if rf is not None:
        _check_response_format(rf)
    if not found:
        return None, ""
    if len(found) > 1:
        raise bad_request(f"set only one of {found[0][0]} and {found[1][0]}", found[1][0])
    name, value = found[0]
    try:
        if name == "response_format":
            return _from_response_format(value), name
        if name == "structured_outputs":
            return StructuredOutputsParams.from_dict(value), name
        return StructuredOutputsParams(**{GUIDED_FIELDS[name]: value}), name
    except ParamError as exc:
        param = name if name != "structured_outputs" else exc.param
        raise bad_request(f"{param}: {_reason(exc)}", param) from None


def _check_response_format(rf: dict[str, Any]) -> None:
    kind = rf.get("type")
    if kind not in _RESPONSE_FORMAT_TYPES:
        raise bad_request(f"response_format.type must be one of "
                          f"{', '.join(_RESPONSE_FORMAT_TYPES)}, got {kind!r}",
                          "response_format.type")
    if kind == "json_schema" and not isinstance(rf.get("json_schema"), dict):
        raise bad_request("response_format.json_schema must be an object with 'name' and "
                          "'schema'", "response_format.json_schema")


def _from_response_format(rf: dict[str, Any]) -> StructuredOutputsParams:
    if rf["type"] == "json_object":
        return StructuredOutputsParams(json_object=True)
    js = rf["json_schema"]
    schema = js.get("schema", {})
    try:
        return StructuredOutputsParams(json=schema)
    except ParamError as exc:
        raise bad_request(f"response_format.json_schema.schema: {_reason(exc)}",
                          "response_format.json_schema.schema") from None


def rename_for(source: str) -> dict[str, str]:
    """Engine parameter names -> the body field ``source`` (errors raised later, when the
    grammar is compiled, name the field the client sent)."""
    if not source:
        return {}
    target = (source if source != "response_format"
              else "response_format.json_schema.schema")
    names = ["structured_outputs"] + [f"structured_outputs.{k}" for k in
                                      ("json", "regex", "choice", "grammar", "json_object")]
    if source == "structured_outputs":
        return {}
    return dict.fromkeys(names, target)


def _reason(exc: ParamError) -> str:
    text = str(exc)
    prefix = f"{exc.param}: "
    return text[len(prefix):] if text.startswith(prefix) else text
