"""Tools in a conversation, prepared for the chat template before it renders.

Two cases, decided from the template source (:func:`renders_tool_syntax`):

- the template has its own tool syntax (it reads ``tools``, as Qwen2.5/Qwen3, Llama 3.x,
  Mistral templates do): messages go to it as the OpenAI API has them, except that each
  ``tool_calls[].function.arguments`` JSON string becomes an object (what these
  templates expect; vLLM does the same), so ``arguments | tojson`` writes it once (a
  template that fails on objects, one that concatenates the arguments as a string, is
  rendered again with the strings);
- the template has none (SmolLM2-Instruct's only renders role and content): the
  **Hermes fallback**. The tool list and the Hermes call format are written into the
  system turn (:func:`tool_instructions`, Qwen2.5's wording; a system message is added
  when there is none), an assistant turn's calls become ``<tool_call>`` blocks after its
  content, and a ``tool`` message becomes a ``user`` turn holding
  ``<tool_response>...</tool_response>``. The model's calls are then parsed with the
  ``hermes`` parser. A template that renders ``tool_calls`` but not ``tools`` gets only
  the tool list written into its system turn; its messages go to it unchanged.

Either way a call renders as ``{"name": ..., "arguments": ...}`` with ``json.dumps``
spacing, the form the Hermes grammar makes the model write, so the next request's prompt
repeats the previous output token for token and its pages hit.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from prefixcache.text.chat_template import ChatTemplateError
from prefixcache.text.tool_parsers.base import arguments_text

_INSTRUCTIONS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>')


def renders_tool_syntax(template: str | None) -> bool:
    """Whether the template renders tools itself (it reads ``tools``)."""
    return bool(template) and "tools" in str(template)


def renders_tool_calls(template: str | None) -> bool:
    """Whether the template renders an assistant turn's calls itself (it reads
    ``tool_calls``), with or without a tool list of its own."""
    return bool(template) and "tool_calls" in str(template)


def tool_instructions(tools: list[dict[str, Any]]) -> str:
    """The Hermes fallback's system text: the tools' schemas, one JSON line each, and
    the call format."""
    return _INSTRUCTIONS.format(tools="\n".join(json.dumps(t, ensure_ascii=False)
                                                for t in tools))


def hermes_call_text(name: str, arguments: Any) -> str:
    """One call as the Hermes fallback renders it (``arguments``: an object or its JSON
    text)."""
    call = {"name": name, "arguments": _arguments_object(arguments)}
    return f"<tool_call>\n{arguments_text(call)}\n</tool_call>"


def prepare(template: str | None, messages: list[dict[str, Any]],
            tools: list[dict[str, Any]] | None, argument_objects: bool = True
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """``(messages, tools)`` to hand the template (new lists; the caller's are not
    modified). ``argument_objects=False`` keeps arguments as the JSON text the client
    sent (for a template that concatenates them as strings: the renderers retry with it
    when the objects make the template fail)."""
    if renders_tool_syntax(template):
        if not argument_objects:
            return list(messages), tools
        return [_with_argument_objects(m) for m in messages], tools
    if renders_tool_calls(template):  # only the tool list needs the fallback
        out = [_with_argument_objects(m) if argument_objects else dict(m) for m in messages]
    else:
        out = [_fallback_message(m) for m in messages]
    if tools:
        text = tool_instructions(tools)
        if out and out[0].get("role") in ("system", "developer"):
            first = out[0].get("content") or ""
            out[0] = {**out[0], "content": f"{first}\n\n{text}" if first else text}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out, None


def _arguments_object(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments if arguments is not None else {}


def _with_argument_objects(m: dict[str, Any]) -> dict[str, Any]:
    calls = m.get("tool_calls")
    if not calls:
        return m
    fixed = []
    for c in calls:
        fn = c.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
            c = {**c, "function": {**fn, "arguments": _arguments_object(fn["arguments"])}}
        fixed.append(c)
    return {**m, "tool_calls": fixed}


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def _fallback_message(m: dict[str, Any]) -> dict[str, Any]:
    role = m.get("role")
    if role == "tool":
        return {"role": "user",
                "content": f"<tool_response>\n{_text(m.get('content'))}\n</tool_response>"}
    calls = m.get("tool_calls")
    if not calls:
        return {**m, "content": _text(m.get("content"))} if m.get("content") is None else m
    blocks = [hermes_call_text((c.get("function") or {}).get("name", ""),
                               (c.get("function") or {}).get("arguments"))
              for c in calls]
    content = _text(m.get("content"))
    out = {k: v for k, v in m.items() if k != "tool_calls"}
    out["content"] = "\n".join(([content] if content else []) + blocks)
    return out


def has_text_arguments(messages: list[dict[str, Any]]) -> bool:
    """Whether any tool call's arguments are JSON text (which :func:`prepare` turns
    into objects)."""
    return any(isinstance((c.get("function") or {}).get("arguments"), str)
               for m in messages for c in m.get("tool_calls") or () if isinstance(c, dict))


def render_with_fallback(template: Any, messages: list[dict[str, Any]],
                         tools: list[dict[str, Any]] | None,
                         render: Callable[[list[dict[str, Any]], Any], str]) -> str:
    """Render a conversation through ``render(messages, tool_schemas)``, first with tool
    call arguments as objects (what most templates expect), then, when that template
    fails and some arguments were JSON text, with the text as sent.

    Raises:
        ChatTemplateError: as ``render`` raises it, on the last attempt.
    """
    try:
        return render(*prepare(template, messages, tools, True))
    except ChatTemplateError:
        if not has_text_arguments(messages):
            raise
        return render(*prepare(template, messages, tools, False))
