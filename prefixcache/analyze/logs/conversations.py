"""Conversation datasets as request logs: one request per assistant turn.

**oasst1** (OpenAssistant message trees, JSONL of ``{"message_tree_id", "prompt":
MESSAGE}`` with ``replies`` nested): every assistant message is a call whose prompt is
the path from the root to its parent (``prompter`` -> ``user``). Sibling replies are
calls with the same prompt; all leaves of a tree share its root.

**sharegpt** (a JSON list of ``{"conversations": [{"from", "value"}], "tools"}``, as
in LLaMA-Factory's Glaive function-calling demo): ``human`` -> ``user``, ``gpt`` ->
``assistant``, ``function_call`` -> an assistant tool call (its value is
``{"name", "arguments"}``), ``observation`` -> ``tool``, ``system`` -> ``system``;
``tools`` (a JSON string or list of schemas) becomes the request's ``tools``. Every
``gpt`` or ``function_call`` turn is a call.

Neither has timestamps or tenants; each tree or conversation is a ``conversation``.
"""
from __future__ import annotations

import json
from pathlib import Path

from prefixcache.analyze.records import Request

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant",
                  "assistant": "assistant", "observation": "tool", "tool": "tool",
                  "system": "system", "function_call": "assistant"}


def load_oasst1(path: str | Path) -> list[Request]:
    path = Path(path)
    out: list[Request] = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            tree = json.loads(line)
            tid = str(tree.get("message_tree_id", len(out)))
            stack: list[tuple[dict, list[dict]]] = [(tree["prompt"], [])]
            while stack:
                node, history = stack.pop()
                role = "assistant" if node.get("role") == "assistant" else "user"
                msg = {"role": role, "content": node.get("text", "")}
                if role == "assistant":
                    out.append(Request(
                        request_id=f"{tid[:8]}/{str(node.get('message_id', len(out)))[:12]}",
                        messages=history, response=dict(msg), conversation=tid,
                        turn=sum(m["role"] == "assistant" for m in history),
                        source=str(path)))
                for child in reversed(node.get("replies") or []):
                    stack.append((child, history + [msg]))
    return out


def _tool_schemas(tools: object) -> list[dict] | None:
    if isinstance(tools, str):
        try:
            tools = json.loads(tools) if tools.strip() else []
        except ValueError:
            return None
    if not isinstance(tools, list) or not tools:
        return None
    return [t if "function" in t else {"type": "function", "function": t}
            for t in tools if isinstance(t, dict)]


def _sharegpt_message(turn: dict) -> dict:
    role = SHAREGPT_ROLES.get(turn.get("from", ""), "user")
    value = turn.get("value", "")
    if turn.get("from") != "function_call":
        return {"role": role, "content": value}
    try:
        call = json.loads(value)
    except ValueError:
        return {"role": "assistant", "content": value}
    args = call.get("arguments", {})
    return {"role": "assistant", "content": "", "tool_calls": [{
        "id": None, "type": "function", "function": {
            "name": call.get("name", ""),
            "arguments": args if isinstance(args, str) else json.dumps(args,
                                                                        ensure_ascii=False)}}]}


def load_sharegpt(path: str | Path, data: list | None = None) -> list[Request]:
    path = Path(path)
    if data is None:
        data = json.loads(path.read_text(encoding="utf-8"))
    out: list[Request] = []
    for n, conv in enumerate(data):
        msgs = [_sharegpt_message(t) for t in conv.get("conversations", [])
                if isinstance(t, dict)]
        if isinstance(conv.get("system"), str) and conv["system"]:
            msgs.insert(0, {"role": "system", "content": conv["system"]})
        tools = _tool_schemas(conv.get("tools"))
        cid = f"{path.stem}:{n}"
        k = 0
        for i, m in enumerate(msgs):
            if m["role"] == "assistant":
                out.append(Request(request_id=f"{cid}#{k}", messages=msgs[:i], tools=tools,
                                   response=m, conversation=cid, turn=k, source=str(path)))
                k += 1
    return out
