"""JSONL logs of OpenAI-format request bodies (chat or completions).

Each line is one of:

- a bare request body: ``{"model", "messages": [...], "tools": [...]}`` or
  ``{"model", "prompt": ...}``;
- a record wrapping it: ``{"request" | "body": {...}, "response": {...},
  "tenant", "timestamp", "request_id", "conversation", "turn"}`` (the OpenAI Batch
  API's input and output lines have this shape too: ``custom_id``, ``body``,
  ``response.body``).

Optional fields, looked up on the record first and then on the body:
``tenant`` (also ``metadata.tenant``), ``timestamp`` (also ``created``; seconds,
milliseconds or ISO 8601), ``request_id`` (also ``custom_id``, ``id``), ``conversation``
(also ``conversation_id``, ``session_id``), ``turn``, ``cache_salt``, and the recorded
``response`` (a Chat Completions / Completions / Anthropic Messages response object, or
plain text) with its ``usage``, or a top-level ``usage``.

A completions ``prompt`` may be text, token ids, or a list of either (one request
each). Token-id prompts are used as they are, whatever the tokenizer.
"""
from __future__ import annotations

import json
from pathlib import Path

from prefixcache.analyze.logs.messages import (
    as_dict,
    clean_messages,
    content_text,
    count_assistant,
    parse_timestamp,
    parse_tool_calls,
)
from prefixcache.analyze.records import Request
from prefixcache.analyze.usage import normalize_usage


class LogFormatError(ValueError):
    """A log line that is not a request this reader understands."""


def _first(keys: tuple[str, ...], *dicts: dict) -> object:
    for d in dicts:
        if isinstance(d, dict):
            for k in keys:
                if d.get(k) is not None:
                    return d[k]
    return None


def response_message(resp: object) -> dict | str | None:
    """The assistant output of a recorded response: a message dict, text, or None."""
    if isinstance(resp, str):
        return resp
    if not isinstance(resp, dict):
        return None
    body = resp.get("body")
    if isinstance(body, dict) and "status_code" in resp:  # Batch output
        resp = body
    choices = resp.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        c = choices[0]
        if isinstance(c.get("message"), dict):
            m = c["message"]
            out: dict[str, object] = {"role": "assistant",
                                      "content": content_text(m.get("content"))}
            calls = parse_tool_calls(m.get("tool_calls"))
            if calls:
                out["tool_calls"] = calls
            return out
        if isinstance(c.get("text"), str):
            return c["text"]
    if isinstance(resp.get("content"), list):  # Anthropic Messages response
        text, calls = [], []
        for block in resp["content"]:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text":
                text.append(block.get("text", ""))
            elif block.get("type") == "tool_use":
                calls.append({"id": block.get("id"), "type": "function", "function": {
                    "name": block.get("name", ""),
                    "arguments": json.dumps(block.get("input", {}), ensure_ascii=False)}})
        out = {"role": "assistant", "content": "".join(text)}
        if calls:
            out["tool_calls"] = calls
        return out
    return None


def _usage_of(record: dict, resp: object):
    if isinstance(resp, dict):
        body = resp["body"] if isinstance(resp.get("body"), dict) else resp
        u = normalize_usage(body.get("usage")) or normalize_usage(body.get("usageMetadata"))
        if u:
            return u
    return normalize_usage(record.get("usage"))


def parse_record(record: dict, default_id: str, source: str = "") -> list[Request]:
    """The request(s) of one log record (several for a list-of-prompts completion).

    Raises:
        LogFormatError: the record has neither ``messages`` nor ``prompt``.
    """
    if not isinstance(record, dict):
        raise LogFormatError("not a JSON object")
    body = record.get("request") or record.get("body") or record
    if not isinstance(body, dict) or ("messages" not in body and "prompt" not in body):
        raise LogFormatError("no 'messages' or 'prompt' in the request body")
    meta = as_dict(body.get("metadata"))
    rid = _first(("request_id", "custom_id", "id"), record, body) or default_id
    tenant = _first(("tenant",), record, body, meta)
    conversation = _first(("conversation", "conversation_id", "session_id"), record,
                          body, meta)
    ts = parse_timestamp(_first(("timestamp", "created", "time"), record, body))
    resp = record.get("response")
    common = dict(
        tenant=None if tenant is None else str(tenant),
        cache_salt=_first(("cache_salt",), body, record),
        conversation=None if conversation is None else str(conversation),
        timestamp=ts, model=body.get("model"), source=source,
        response=response_message(resp), usage=_usage_of(record, resp))
    tools = body.get("tools") if isinstance(body.get("tools"), list) else None
    if "messages" in body:
        if not isinstance(body["messages"], list):
            raise LogFormatError("'messages' must be a list of message objects")
        msgs = clean_messages(body["messages"])
        turn = record.get("turn")
        turn = int(turn) if isinstance(turn, int) else count_assistant(msgs)
        return [Request(request_id=str(rid), messages=msgs, tools=tools, turn=turn,
                        **common)]
    prompt = body["prompt"]
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt
                                   and all(isinstance(t, int) for t in prompt)):
        prompts = [prompt]
    elif isinstance(prompt, list) and all(isinstance(p, (str, list)) for p in prompt):
        prompts = prompt
    else:
        raise LogFormatError("'prompt' must be text, token ids or a list of those")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, list) and not all(isinstance(t, int) for t in p):
            raise LogFormatError("a token-id prompt holds a non-integer")
        r = Request(request_id=str(rid) if len(prompts) == 1 else f"{rid}-{i}",
                    prompt=p, turn=0, **common)
        if len(prompts) > 1:
            r.usage = None  # a batch's usage covers all its prompts
        out.append(r)
    return out


def load_openai_jsonl(path: str | Path) -> list[Request]:
    """Read every request of a JSONL file (blank lines skipped).

    Raises:
        LogFormatError: a line is not JSON or not a request, with its line number.
    """
    path = Path(path)
    out: list[Request] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                out.extend(parse_record(record, f"{path.stem}:{lineno}", str(path)))
            except (ValueError, LogFormatError) as exc:
                raise LogFormatError(f"{path}:{lineno}: {exc}") from None
    return out
