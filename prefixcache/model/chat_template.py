"""Rendering of Jinja chat templates, in the environment Hugging Face tokenizers use
(sandboxed, ``trim_blocks``, ``lstrip_blocks``, loop controls, a non-escaping ``tojson``,
``raise_exception`` and ``strftime_now``), for tokenizers that do not come from
transformers (the builtin byte tokenizer, ``tokenizer.json``-only directories).
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def render_chat_template(template: str, messages: list[dict[str, Any]],
                         tools: list[dict[str, Any]] | None = None,
                         add_generation_prompt: bool = True, **special_tokens: Any) -> str:
    """Render ``messages`` (OpenAI-style dicts with ``role`` and ``content``) to the
    prompt text. ``special_tokens`` (``bos_token``, ``eos_token``...) are passed to the
    template as variables.

    Raises:
        ValueError: the template is invalid or calls ``raise_exception``.
    """
    try:
        return _compile(template).render(messages=messages, tools=tools,
                                         add_generation_prompt=add_generation_prompt,
                                         **special_tokens)
    except jinja2.exceptions.TemplateError as e:
        raise ValueError(f"chat template error: {e}") from e
