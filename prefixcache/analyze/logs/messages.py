"""Chat messages as logs store them, reduced to what a provider is sent.

Logs keep extra fields on messages (timestamps, raw responses, agent names); only
``role``, ``content``, ``name``, ``tool_calls`` and ``tool_call_id`` reach the prompt.
Tool calls stored as a string (SWE-agent keeps a Python ``repr``) are parsed back.
"""
from __future__ import annotations

import ast
import hashlib
import json
from datetime import datetime

SENT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def as_dict(value: object) -> dict:
    """``value`` if it is a dict, else a new empty dict (log fields that may be absent
    or malformed)."""
    return value if isinstance(value, dict) else {}


def content_text(content: object) -> str:
    """Message content as text: strings as they are; content parts joined, text parts
    by their text and other parts (images, files) as ``<image:HASH>`` placeholders, so
    the same image gives the same tokens."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    out.append(part["text"])
                else:
                    kind = part.get("type", "part")
                    digest = hashlib.blake2b(json.dumps(part, sort_keys=True).encode(),
                                             digest_size=6).hexdigest()
                    out.append(f"<{kind}:{digest}>")
        return "".join(out)
    return str(content)


def parse_tool_calls(raw: object) -> list[dict]:
    """Tool calls as a list of ``{"id", "type", "function": {"name", "arguments"}}``.

    Accepts a list, a JSON string, or a Python-literal string; anything else gives [].
    """
    if isinstance(raw, str):
        text = raw.strip()
        if not text:
            return []
        try:
            raw = json.loads(text)
        except ValueError:
            try:
                raw = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                return []
    if not isinstance(raw, list):
        return []
    out = []
    for tc in raw:
        if not isinstance(tc, dict):
            continue
        fn = tc.get("function") or {}
        args = fn.get("arguments", "")
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        out.append({"id": tc.get("id"), "type": tc.get("type", "function"),
                    "function": {"name": fn.get("name", ""), "arguments": args}})
    return out


def clean_message(m: dict) -> dict | None:
    """The sent part of a message; ``None`` for roles a provider is never sent."""
    role = m.get("role")
    if role not in SENT_ROLES:
        return None
    out: dict = {"role": role, "content": content_text(m.get("content"))}
    calls = parse_tool_calls(m.get("tool_calls"))
    if calls:
        out["tool_calls"] = calls
    for key in ("name", "tool_call_id"):
        if isinstance(m.get(key), str):
            out[key] = m[key]
    return out


def clean_messages(messages: list) -> list[dict]:
    return [c for c in (clean_message(m) for m in messages if isinstance(m, dict)) if c]


def parse_timestamp(v: object) -> float | None:
    """Seconds since the epoch from a number (seconds, or milliseconds when above 1e11)
    or an ISO 8601 string; ``None`` otherwise."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v) / 1000.0 if v > 1e11 else float(v)
    if isinstance(v, str):
        try:
            return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
        except ValueError:
            try:
                return parse_timestamp(float(v))
            except ValueError:
                return None
    return None


def count_assistant(messages: list[dict]) -> int:
    return sum(1 for m in messages if m.get("role") == "assistant")
