"""Chat templates: Jinja sources rendered to prompt text by transformers'
``render_jinja_template`` (the function ``apply_chat_template`` runs: sandboxed,
``trim_blocks``/``lstrip_blocks``, loop controls, a non-escaping ``tojson``,
``raise_exception``, ``strftime_now``), so a template renders here exactly as in
transformers, for tokenizers that do not come from transformers too.

:data:`CHATML_TEMPLATE` is the builtin ChatML rendering (as Qwen and many open models
use), for tokenizers without a template of their own::

    <|im_start|>tools\\n{tool}\\n{tool}...<|im_end|>\\n       (only if there are tools)
    <|im_start|>{role}[:{name}]\\n{content}{tool calls}<|im_end|>\\n   (each message)
    <|im_start|>assistant\\n                                  (the generation prompt)

Each tool is its schema as JSON. Each tool call is ``<tool_call>\\n{"name": NAME,
"arguments": ARGS}\\n</tool_call>``; content and tool calls are joined by newlines.
It is compositional: rendering the tools alone, then each message alone, then the
generation prompt alone, and joining the texts gives the rendering of the whole.
"""
from __future__ import annotations

from typing import Any

CHATML_START, CHATML_END = "<|im_start|>", "<|im_end|>"
CHATML_SPECIALS = ("<|endoftext|>", CHATML_START, CHATML_END)
CHATML_GENERATION_PROMPT = CHATML_START + "assistant\n"
CHATML_TEMPLATE = (
    "{% if tools %}<|im_start|>tools{{ '\\n' }}"
    "{% for tool in tools %}{{ '\\n' if not loop.first else '' }}{{ tool | tojson }}"
    "{% endfor %}<|im_end|>{{ '\\n' }}{% endif %}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}"
    "{% if message['name'] %}:{{ message['name'] }}{% endif %}{{ '\\n' }}"
    "{% if message['content'] %}{{ message['content'] }}{% endif %}"
    "{% for call in message['tool_calls'] or [] %}"
    "{{ '\\n' if message['content'] or not loop.first else '' }}<tool_call>{{ '\\n' }}"
    "{{ {'name': call['function']['name'], 'arguments': call['function']['arguments']}"
    " | tojson }}{{ '\\n' }}</tool_call>"
    "{% endfor %}<|im_end|>{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{{ '\\n' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """A chat template is invalid, or refused a conversation (``raise_exception``)."""


def render_chat_template(template: str, messages: list[dict[str, Any]],
                         tools: list[dict[str, Any]] | None = None,
                         add_generation_prompt: bool = True, **special_tokens: Any) -> str:
    """Render ``messages`` (OpenAI-style dicts with ``role`` and ``content``) to the
    prompt text. ``special_tokens`` (``bos_token``, ``eos_token``...) are passed to the
    template as variables. The caller's messages are not modified.

    Raises:
        ChatTemplateError: the template is invalid or calls ``raise_exception`` (the
            message starts with ``chat template error``).
    """
    from transformers.utils.chat_template_utils import render_jinja_template

    schemas: Any = list(tools) if tools else None
    try:
        # returns (one text per conversation, generation indices)
        rendered: Any = render_jinja_template([messages], tools=schemas,
                                              chat_template=template,
                                              add_generation_prompt=add_generation_prompt,
                                              **special_tokens)
    except Exception as e:  # noqa: BLE001  (jinja raises anything; raise_exception())
        raise ChatTemplateError(f"chat template error: {e}") from None
    return rendered[0][0]

