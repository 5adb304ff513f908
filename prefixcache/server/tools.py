"""Tools on ``/v1/chat/completions`` (and ``/v1/messages``, which is served through it):
the checks of ``tools`` and ``tool_choice``, and the per-request plan.

The parser (vLLM's ``--tool-call-parser``) is chosen once at start
(:func:`choose_parser`): the flag if given, else the chat template's own syntax
(:func:`~prefixcache.text.tool_parsers.registry.detect_parser`), else ``hermes`` (the
Hermes fallback of :mod:`prefixcache.text.tool_prompt` for templates without tool
syntax, or a template with a syntax we do not know, which should then be named).

``tool_choice`` (default ``"auto"`` with tools, ``"none"`` without):

=================  ==============================================================
``"none"``         no parsing: the reply is content; tools still go to the template
                   (vLLM's behaviour), so the prompt is the same as with ``auto``
``"auto"``         the reply is parsed; calls become ``tool_calls``
``"required"``     the output is constrained to one or more calls of the tools
named function     the output is constrained to one call of that function
=================  ==============================================================

A constrained choice is a grammar (:func:`forced_grammar`, built with
:func:`prefixcache.text.grammar_ebnf.tool_call_grammar`) in the parser's own syntax: one
call object per tool, ``{"name": <the tool's name>, "arguments": <its parameters
schema>}`` (``"parameters"`` for ``llama3_json``), with ``json.dumps`` spacing, so a
forced call renders back through the template exactly as it was generated.
A named function allows exactly one call, and so does ``required`` unless the request
sets ``parallel_tool_calls: true`` (a model that does not end its turn after a call
would otherwise repeat it up to ``max_tokens``). The
``mistral`` syntax's markers are special tokens, which a grammar cannot write: a forced
choice there is a 400 naming ``tool_choice``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from prefixcache.http.errors import bad_request
from prefixcache.sampling_params import ParamError
from prefixcache.text.grammar_ebnf import tool_call_grammar
from prefixcache.text.tool_parsers.base import ToolParser
from prefixcache.text.tool_parsers.registry import PARSERS, detect_parser, get_parser


def choose_parser(flag: str | None, chat_template: str | None) -> str:
    """The parser's name: ``flag``, else the template's syntax, else ``hermes``. Raises
    ValueError (an unknown ``flag``, naming the known ones)."""
    if flag is not None:
        get_parser(flag)
        return flag
    return detect_parser(chat_template) or "hermes"


@dataclass
class ToolPlan:
    """What a chat request does with tools.

    Attributes:
        parser: parses the reply (``None``: no parsing, ``tool_choice`` ``"none"``).
        choice: ``"auto"``, ``"required"``, or the one function's name.
        tools: the request's function definitions (``{name, description?,
            parameters?}``), in order.
        parallel_asked: ``parallel_tool_calls`` as the request sent it (``None``: not
            sent).
    """

    parser: ToolParser | None
    choice: str
    tools: list[dict[str, Any]] = field(default_factory=list)
    parallel_asked: bool | None = None

    @property
    def parallel(self) -> bool:
        """More than one call allowed in a parsed reply (unless ``parallel_tool_calls`` is
        false; a forced reply's grammar allows one unless it is true)."""
        return self.parallel_asked is not False

    @property
    def forced(self) -> bool:
        return self.choice != "auto"


_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """The function definitions of an OpenAI ``tools`` list. Raises APIError (400)
    naming the field (``tools[1].function.name``)."""
    out = []
    seen: set[str] = set()
    for i, t in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type", "function") != "function":
            raise bad_request(f"{at}: only tools of type 'function' are supported", at)
        fn = t.get("function")
        if not isinstance(fn, dict):
            raise bad_request(f"{at}.function must be an object", f"{at}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise bad_request(f"{at}.function.name must be 1-64 letters, digits, '_' or "
                              f"'-' (as OpenAI requires), got {name!r}", f"{at}.function.name")
        if name in seen:
            raise bad_request(f"{at}.function.name {name!r} is defined twice",
                              f"{at}.function.name")
        seen.add(name)
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            raise bad_request(f"{at}.function.parameters must be a JSON schema of an object "
                              "(the call's arguments are an object)",
                              f"{at}.function.parameters")
        if not isinstance(fn.get("description", ""), str):
            raise bad_request(f"{at}.function.description must be a string",
                              f"{at}.function.description")
        out.append({**fn, "parameters": params})
    return out


def plan_tools(tools: Any, tool_choice: Any, parallel: bool | None, parser_name: str
               ) -> ToolPlan | None:
    """The request's :class:`ToolPlan` (``None``: no tools, nothing to parse). Raises
    APIError (400) naming ``tools`` or ``tool_choice``."""
    defs = check_tools(tools) if tools else []
    choice = tool_choice if tool_choice is not None else ("auto" if defs else "none")
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise bad_request("tool_choice must be 'none', 'auto', 'required' or "
                              "{'type': 'function', 'function': {'name': ...}}", "tool_choice")
        if name not in {d["name"] for d in defs}:
            raise bad_request(f"tool_choice names function {name!r}, which is not in tools",
                              "tool_choice")
        choice = name
    elif choice not in ("none", "auto", "required"):
        raise bad_request("tool_choice must be 'none', 'auto', 'required' or "
                          "{'type': 'function', 'function': {'name': ...}}", "tool_choice")
    elif choice == "required" and not defs:
        raise bad_request("tool_choice 'required' needs a non-empty tools list", "tool_choice")
    if choice == "none" or not defs:
        return None
    return ToolPlan(get_parser(parser_name), choice, defs, parallel)


# per parser: (begin, end, separator between calls, the arguments key)
_FORCED_SYNTAX = {
    "hermes": ("<tool_call>\n", "\n</tool_call>", "\n", "arguments"),
    "llama3_json": ("", "", "; ", "parameters"),
}


def forced_grammar(plan: ToolPlan) -> str:
    """EBNF of the calls a forced ``tool_choice`` allows. Raises APIError (400 naming
    ``tool_choice`` for a parser without a forced form, ``tools`` for a parameters
    schema the grammar engine cannot compile)."""
    assert plan.parser is not None and plan.forced
    syntax = _FORCED_SYNTAX.get(plan.parser.name)
    if syntax is None:
        raise bad_request(f"tool_choice {plan.choice!r} cannot be enforced with the "
                          f"{plan.parser.name} tool-call syntax; use 'auto'", "tool_choice")
    begin, end, sep, key = syntax
    tools = plan.tools if plan.choice == "required" else [
        t for t in plan.tools if t["name"] == plan.choice]
    schemas = [{"type": "object", "properties": {"name": {"const": t["name"]},
                                                 key: t["parameters"]},
                "required": ["name", key], "additionalProperties": False} for t in tools]
    # one call unless the client asked for parallel calls: a model that never ends its
    # turn after a call (SmolLM2 under the fallback) would repeat it up to max_tokens
    one = plan.choice != "required" or plan.parallel_asked is not True
    try:
        return tool_call_grammar(begin, schemas, end, 1, 1 if one else None, separator=sep)
    except ParamError as exc:
        text = str(exc).split(": ", 1)[-1]
        raise bad_request(f"tools: a parameters schema {text}", "tools") from None


__all__ = ["PARSERS", "ToolPlan", "check_tools", "choose_parser", "forced_grammar",
           "plan_tools"]
