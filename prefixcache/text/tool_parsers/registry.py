"""Tool-call parsers by name (``--tool-call-parser``, vLLM's names), and the choice of
one from a chat template's own tool syntax.

:func:`detect_parser` reads the template source: ``<tool_call>`` -> ``hermes``,
``[TOOL_CALLS]`` -> ``mistral``, ``<|python_tag|>`` or Llama 3's ``"parameters"`` call
format -> ``llama3_json``; ``None`` when it finds none.
"""
from __future__ import annotations

from prefixcache.text.tool_parsers.base import ToolParser
from prefixcache.text.tool_parsers.hermes import HermesParser
from prefixcache.text.tool_parsers.llama3_json import Llama3JsonParser
from prefixcache.text.tool_parsers.mistral import MistralParser

PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesParser,
    "llama3_json": Llama3JsonParser,
    "mistral": MistralParser,
}


def get_parser(name: str) -> ToolParser:
    """The parser called ``name``. Raises ValueError naming the known ones."""
    try:
        return PARSERS[name]()
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r}; known: "
                         f"{', '.join(sorted(PARSERS))}") from None


def detect_parser(template: str | None) -> str | None:
    """The parser whose syntax the chat template writes, or ``None``."""
    if not template:
        return None
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template or ('"parameters": ' in template and "ipython" in template):
        return "llama3_json"
    return None
