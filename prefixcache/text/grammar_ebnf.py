"""EBNF text for structured outputs, in xgrammar's dialect (``root ::= ...``).

Builders for the grammars a server composes: a JSON schema as EBNF rules
(:func:`json_schema_ebnf`), a literal string (:func:`ebnf_literal`), and tool calls
wrapped in literal markers (:func:`tool_call_grammar`). Each returns EBNF text to pass as
``StructuredOutputsParams(grammar=...)``; xgrammar renames the rules of composed
grammars, so several schemas never clash.
"""
from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from prefixcache.sampling_params import ParamError

if TYPE_CHECKING:  # xgrammar imports torch and transformers: only where a grammar is built
    import xgrammar as xgr

MAX_JSON_WHITESPACE = 16  # characters in one run of free whitespace between JSON tokens


def json_schema_grammar(schema: dict[str, Any] | str, *, any_whitespace: bool = True,
                        strict: bool = True,
                        param: str = "structured_outputs.json") -> xgr.Grammar:
    """xgrammar's grammar of the JSON values that validate against ``schema``.

    Args:
        schema: a JSON schema (dict or JSON text).
        any_whitespace: allow whitespace between JSON tokens, at most
            :data:`MAX_JSON_WHITESPACE` characters in a run (a small model can otherwise
            write newlines until ``max_tokens``); ``False`` fixes it (one space after
            ``:`` and ``,``, none elsewhere).
        strict: objects hold only the properties the schema lists unless it says
            otherwise (``additionalProperties`` defaults to false; the output still
            validates); ``False`` follows JSON Schema's default (any extra property).
        param: the name in the error raised for a schema xgrammar cannot convert.

    Raises:
        ParamError: the schema is invalid or uses a feature xgrammar does not support.
    """
    import xgrammar as xgr

    text = schema if isinstance(schema, str) else json.dumps(schema)
    try:
        grammar = xgr.Grammar.from_json_schema(
            text, any_whitespace=any_whitespace, strict_mode=strict,
            max_whitespace_cnt=MAX_JSON_WHITESPACE if any_whitespace else None)
        ebnf = fixed = grammar_text(grammar)
        for loose in _LOOSE_CHARS:
            fixed = fixed.replace(loose, _JSON_CHAR)
        return grammar if fixed == ebnf else xgr.Grammar.from_ebnf(fixed)
    except Exception as exc:  # xgrammar raises RuntimeError/ValueError/InvalidJSONError
        raise ParamError(param, f"cannot be compiled: {xgrammar_error_text(exc)}") from None


# Characters xgrammar lets into a JSON string, written as it prints them, and what they
# become: a length-bounded string (minLength/maxLength) admits control characters
# (invalid unescaped in JSON), and every string admits UTF-16 surrogates encoded as UTF-8
# (invalid UTF-8: reachable through byte tokens, which byte-level BPE vocabularies have).
_JSON_CHAR = r'[^\0-\x1f\"\\\uD800-\uDFFF]'
_LOOSE_CHARS = (r'[^\"\\\r\n]', r'[^\0-\x1f\"\\\r\n]')


def json_schema_ebnf(schema: dict[str, Any] | str, *, any_whitespace: bool = True) -> str:
    """EBNF text (``root`` rule first) of the JSON values that validate against
    ``schema``. Raises ParamError as :func:`json_schema_grammar`."""
    return grammar_text(json_schema_grammar(schema, any_whitespace=any_whitespace))


_ESCAPE = re.compile(r"\\(x([0-9a-fA-F]{2})|.)", re.S)


def grammar_text(grammar: xgr.Grammar) -> str:
    """``grammar`` as EBNF text that ``from_ebnf`` reads back as the same grammar.

    xgrammar prints a code point from U+0080 to U+00FF as ``\\xHH``, which its parser
    reads back as a raw byte inside a string literal (``"é"`` would become byte 0xE9,
    invalid UTF-8); it is written ``\\u00HH`` here, which both readings agree on.
    """
    def fix(m: re.Match) -> str:
        hex_digits = m.group(2)
        if hex_digits is not None and int(hex_digits, 16) >= 0x80:
            return "\\u00" + hex_digits
        return m.group(0)

    return _ESCAPE.sub(fix, str(grammar))


def ebnf_literal(text: str) -> str:
    """``text`` as an EBNF string literal (quotes and control characters escaped)."""
    return json.dumps(text, ensure_ascii=False)


def tool_call_grammar(begin: str, schemas: list[dict[str, Any]], end: str,
                      min_calls: int = 1, max_calls: int | None = None, *,
                      separator: str = "\n", any_whitespace: bool = False) -> str:
    """EBNF text of tool calls: ``min_calls`` to ``max_calls`` (``None``: no bound) calls
    separated by ``separator``, each ``begin``, one JSON value that validates against
    one of ``schemas``, then ``end``. For Hermes-style templates: ``begin="<tool_call>\\n"``,
    ``end="\\n</tool_call>"``, one schema per tool of the shape ``{"type": "object",
    "properties": {"name": {"const": NAME}, "arguments": PARAMETERS}, "required":
    ["name", "arguments"]}``.

    Raises:
        ValueError: no schema, ``min_calls < 0``, ``max_calls < max(min_calls, 1)``.
        ParamError: a schema xgrammar cannot convert (``param`` is ``tools``).
    """
    if not schemas:
        raise ValueError("tool_call_grammar needs at least one schema")
    if min_calls < 0 or (max_calls is not None and max_calls < max(min_calls, 1)):
        raise ValueError(f"bad call bounds: min_calls={min_calls}, max_calls={max_calls}")
    import xgrammar as xgr

    values = xgr.Grammar.union(*[json_schema_grammar(s, any_whitespace=any_whitespace,
                                                     param="tools") for s in schemas])
    call = xgr.Grammar.concat(xgr.Grammar.from_ebnf(f"root ::= {ebnf_literal(begin)}"),
                              values,
                              xgr.Grammar.from_ebnf(f"root ::= {ebnf_literal(end)}"))
    text = grammar_text(call)
    name = _fresh_name(text, "tool_call")
    lines = text.splitlines()
    assert lines[0].startswith("root ::= ")  # xgrammar prints the root rule first
    body = [f"{name} ::= {lines[0][len('root ::= '):]}"] + lines[1:]
    rest = f"({ebnf_literal(separator)} {name})"
    if max_calls is None:
        more = f"{rest}*"
    elif max_calls > 1:
        more = f"{rest}{{0, {max_calls - 1}}}"
    else:
        more = ""
    one_or_more = f"{name} {more}".strip()
    if min_calls == 0:
        root = f'root ::= "" | ({one_or_more})'
    elif min_calls == 1:
        root = f"root ::= {one_or_more}"
    else:
        upper = "" if max_calls is None else str(max_calls - 1)
        root = f"root ::= {name} {rest}{{{min_calls - 1}, {upper or -1}}}"
    return grammar_text(xgr.Grammar.from_ebnf("\n".join([root, *body]) + "\n"))  # checked


def _fresh_name(ebnf: str, base: str) -> str:
    taken = {line.split(" ::= ", 1)[0] for line in ebnf.splitlines() if " ::= " in line}
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    return name


_WHERE = re.compile(r"^\[[0-9:]+\] \S+:[0-9]+: ")  # xgrammar's "[time] file.cc:line: "


def xgrammar_error_text(exc: Exception) -> str:
    """The first line of an xgrammar error, without its ``[time] file.cc:line:`` prefix."""
    text = str(exc).strip() or type(exc).__name__
    return _WHERE.sub("", text.splitlines()[0])[:500]
