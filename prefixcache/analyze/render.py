"""Rendering a chat request to prompt text, as a serving stack would before tokenizing.

Two renderers, both Jinja chat templates rendered by :mod:`prefixcache.text.chat_template`:

**builtin**: :data:`~prefixcache.text.chat_template.CHATML_TEMPLATE` (ChatML, as Qwen and
many open models use). A request renders as segments, each one message, in this order::

    <|im_start|>tools\n{tool}\n{tool}...<|im_end|>\n      (only if the request has tools)
    <|im_start|>{role}\n{content}{tool calls}<|im_end|>\n  (each message)
    <|im_start|>assistant\n                                 (the generation prompt)

Each tool is its schema as JSON, one per line. Each tool call is
``<tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>`` with ``ARGS`` the
parsed arguments (the raw string when they are not JSON); content and tool calls are
joined by newlines. A message's ``name`` is appended to the role (``user:alice``);
``tool_call_id`` is not rendered. The recorded response is what the model would
generate after the prompt: its content and tool calls, then ``<|im_end|>\n``.

**tokenizer**: the tokenizer's own chat template (``Tokenizer.render_chat``: what
``apply_chat_template`` renders, with the tokenizer's special tokens). A template may
drop what it does not know (the shared Qwen2 template drops ``tool`` messages and tool
calls) or refuse roles; ``auto`` then falls back to builtin for the whole log (see
:func:`template_covers`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

from prefixcache.text.chat_template import (
    CHATML_GENERATION_PROMPT,
    CHATML_TEMPLATE,
    ChatTemplateError,
    render_chat_template,
)
from prefixcache.text.tokenizer import Tokenizer

GENERATION_PROMPT = CHATML_GENERATION_PROMPT


def _chatml_message(message: dict, role: str | None = None) -> dict:
    """The fields the ChatML template reads, tool call arguments parsed from JSON."""
    out = {"role": role or message.get("role", "user"), "content": message.get("content")}
    if message.get("name") and role is None:
        out["name"] = message["name"]
    calls = []
    for tc in message.get("tool_calls") or []:
        fn = tc.get("function") or {}
        args = fn.get("arguments", "")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            pass
        calls.append({"function": {"name": fn.get("name", ""), "arguments": args}})
    if calls:
        out["tool_calls"] = calls
    return out


@lru_cache(maxsize=4096)
def _render_chatml(messages_json: str, tools_json: str) -> str:
    return render_chat_template(CHATML_TEMPLATE, json.loads(messages_json),
                                json.loads(tools_json), add_generation_prompt=False)


def _chatml(messages: list[dict], tools: list[dict] | None = None) -> str:
    # a log repeats each message in every later request: render each one once
    return _render_chatml(json.dumps(messages), json.dumps(tools or None))


def builtin_segments(messages: list[dict], tools: list[dict] | None) -> list[str]:
    """The prompt as segments: tools block (if any), one per message, and the
    generation prompt last. Their concatenation is the prompt text."""
    segs = [_chatml([], tools)] if tools else []
    segs.extend(_chatml([_chatml_message(m)]) for m in messages)
    segs.append(GENERATION_PROMPT)
    return segs


def builtin_response(response: dict | str) -> str:
    """The text the model generates for a recorded response (builtin renderer)."""
    msg = {"content": response} if isinstance(response, str) else response
    text = _chatml([_chatml_message(msg, role="assistant")])
    return text[len(GENERATION_PROMPT):]


def render_body(message: dict) -> str:
    """A message's content and its tool calls, separated by newlines (builtin)."""
    return builtin_response(message)[:-len("<|im_end|>\n")]


@dataclass
class TemplateRenderer:
    """A tokenizer's own chat template (see the module docstring)."""

    tokenizer: Tokenizer

    def render(self, messages: list[dict], tools: list[dict] | None,
               add_generation_prompt: bool) -> str:
        """Raises ChatTemplateError when the template fails on the request."""
        return self.tokenizer.render_chat(messages, tools or None, add_generation_prompt)

    def response_text(self, messages: list[dict], tools: list[dict] | None,
                      prompt_text: str, response: dict | str) -> str:
        """What follows the prompt once the response is appended (the generated
        part), or the bare response text when the template does not extend the prompt."""
        if isinstance(response, str):
            return response
        try:
            full = self.render(messages + [dict(response, role="assistant")], tools, False)
        except ChatTemplateError:
            full = ""
        if full.startswith(prompt_text) and len(full) > len(prompt_text):
            return full[len(prompt_text):]
        return render_body(response)


def message_ends(text: str, messages: list[dict], tools: list[dict] | None) -> list[int] | None:
    """Character offsets in ``text`` just past each message's content (and its tool
    calls' names), found in order; ``None`` if some message's content (or a tool's
    name) is missing, i.e. the template dropped it."""
    pos = 0
    ends = []
    if tools:
        for t in tools:
            name = (t.get("function") or t).get("name")
            if name:
                at = text.find(name, pos)
                if at < 0:
                    return None
        # tools may be rendered anywhere in the system part: no boundary for them
    for m in messages:
        pieces = [(m.get("content") or "").strip()]
        pieces += [(tc.get("function") or {}).get("name", "") for tc in m.get("tool_calls") or []]
        for piece in pieces:
            if not piece:
                continue
            at = text.find(piece, pos)
            if at < 0:
                return None
            pos = at + len(piece)
        ends.append(pos)
    return ends


def template_covers(text: str, messages: list[dict], tools: list[dict] | None) -> bool:
    """Whether a rendered prompt contains every message's content and tool call."""
    return message_ends(text, messages, tools) is not None
