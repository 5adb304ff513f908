"""Checks of OpenAI-style chat messages, shared by the server and the offline ``LLM``.

The rules are those of ``POST /v1/chat/completions`` (``server/protocol.py``): a
non-empty list of objects; ``role`` one of :data:`MESSAGE_ROLES`; ``content`` a string,
a list of text parts ``{"type": "text", "text": "..."}``, or absent/``None``; ``name``
and ``tool_call_id`` strings; ``tool_calls`` a list of objects.
"""
from __future__ import annotations

from typing import Any

MESSAGE_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


class MessageError(ValueError):
    """A chat message is invalid; ``param`` names the field (``messages[0].role``)."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message


def check_messages(messages: Any) -> None:
    """Raise :class:`MessageError` naming the first invalid field of ``messages``."""
    if not isinstance(messages, list) or not messages:
        raise MessageError("messages", "must be a non-empty list of messages")
    for i, m in enumerate(messages):
        check_message(m, f"messages[{i}]")


def check_message(m: Any, at: str) -> None:
    """Check one message; ``at`` is its place (``messages[2]``) for the error."""
    if not isinstance(m, dict):
        raise MessageError(at, "must be an object with role and content")
    role = m.get("role")
    if role not in MESSAGE_ROLES:
        raise MessageError(f"{at}.role", f"must be one of {', '.join(MESSAGE_ROLES)}; "
                           f"got {role!r}")
    check_content(m.get("content"), f"{at}.content")
    for key in ("name", "tool_call_id"):
        if m.get(key) is not None and not isinstance(m[key], str):
            raise MessageError(f"{at}.{key}", f"must be a string, got {m[key]!r}")
    calls = m.get("tool_calls")
    if calls is not None and not (isinstance(calls, list)
                                  and all(isinstance(c, dict) for c in calls)):
        raise MessageError(f"{at}.tool_calls", "must be a list of objects")


def check_content(content: Any, at: str) -> None:
    """``content``: a string, ``None``, or a list of text parts."""
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise MessageError(at, f"must be a string or an array of content parts, got "
                           f"{type(content).__name__}")
    for j, part in enumerate(content):
        if not (isinstance(part, dict) and part.get("type") == "text"
                and isinstance(part.get("text"), str)):
            raise MessageError(f"{at}[{j}]", "only text content parts ({'type': 'text', "
                               "'text': ...}) are supported")
