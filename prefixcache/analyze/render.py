"""Rendering a chat request to prompt text, as a serving stack would before tokenizing.

Two renderers:

**builtin** (ChatML, as Qwen and many open models use). A request renders as
segments, each one message, in this order::

    <|im_start|>tools\n{tool}\n{tool}...<|im_end|>\n      (only if the request has tools)
    <|im_start|>{role}\n{content}{tool calls}<|im_end|>\n  (each message)
    <|im_start|>assistant\n                                 (the generation prompt)

Each tool is its schema as JSON (``json.dumps``, one per line). Each tool call is
``<tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>`` with ``ARGS`` the
parsed arguments (the raw string when they are not JSON); content and tool calls are
joined by newlines. A message's ``name`` is
appended to the role (``user:alice``); ``tool_call_id`` is not rendered.
The recorded response is what the model would generate after the prompt: its content
and tool calls, then ``<|im_end|>\n``.

**tokenizer**: the tokenizer's own Jinja chat template, rendered by transformers'
``render_jinja_template`` (what ``apply_chat_template`` runs) with the tokenizer's
special tokens. A template may drop what it does not know (the shared Qwen2 template
drops ``tool`` messages and tool calls) or refuse roles; ``auto`` then falls back to
builtin for the whole log (see :func:`template_covers`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass


def _dump(obj: object) -> str:
    return json.dumps(obj, ensure_ascii=False)


def render_tool_call(tc: dict) -> str:
    fn = tc.get("function") or {}
    args = fn.get("arguments", "")
    try:
        parsed = json.loads(args) if isinstance(args, str) else args
    except ValueError:
        parsed = args
    return "<tool_call>\n" + _dump({"name": fn.get("name", ""), "arguments": parsed}) \
        + "\n</tool_call>"


def render_body(message: dict) -> str:
    """A message's content and its tool calls, separated by newlines."""
    parts = [message.get("content") or ""] if message.get("content") else []
    parts += [render_tool_call(tc) for tc in message.get("tool_calls") or []]
    return "\n".join(parts)


def render_message(message: dict) -> str:
    role = message.get("role", "user")
    if message.get("name"):
        role = f"{role}:{message['name']}"
    return f"<|im_start|>{role}\n{render_body(message)}<|im_end|>\n"


def render_tools(tools: list[dict]) -> str:
    return "<|im_start|>tools\n" + "\n".join(_dump(t) for t in tools) + "<|im_end|>\n"


GENERATION_PROMPT = "<|im_start|>assistant\n"


def builtin_segments(messages: list[dict], tools: list[dict] | None) -> list[str]:
    """The prompt as segments: tools block (if any), one per message, and the
    generation prompt last. Their concatenation is the prompt text."""
    segs = [render_tools(tools)] if tools else []
    segs.extend(render_message(m) for m in messages)
    segs.append(GENERATION_PROMPT)
    return segs


def builtin_response(response: dict | str) -> str:
    """The text the model generates for a recorded response (builtin renderer)."""
    if isinstance(response, str):
        return response + "<|im_end|>\n"
    return render_body(response) + "<|im_end|>\n"


class TemplateError(ValueError):
    """The tokenizer's chat template cannot render a request."""


@dataclass
class TemplateRenderer:
    """A tokenizer's Jinja chat template (see the module docstring)."""

    template: str
    template_vars: dict

    def render(self, messages: list[dict], tools: list[dict] | None,
               add_generation_prompt: bool) -> str:
        from transformers.utils.chat_template_utils import render_jinja_template

        try:
            out, _ = render_jinja_template(
                [messages], tools=tools or None, chat_template=self.template,
                add_generation_prompt=add_generation_prompt, **self.template_vars)
        except Exception as exc:  # jinja raises anything, templates raise_exception()
            raise TemplateError(str(exc)) from None
        return out[0]

    def response_text(self, messages: list[dict], tools: list[dict] | None,
                      prompt_text: str, response: dict | str) -> str:
        """What follows the prompt once the response is appended (the generated
        part), or the bare response text when the template does not extend the prompt."""
        if isinstance(response, str):
            return response
        try:
            full = self.render(messages + [dict(response, role="assistant")], tools, False)
        except TemplateError:
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
