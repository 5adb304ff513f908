"""Agent trajectories: one request per model call, rebuilt from the stored messages.

**SWE-agent** ``.traj`` (``{"trajectory": [step...], "history": [...], "info"}``):
when steps carry their own ``messages`` (the history after that step), call *k*'s
prompt is that list up to its last assistant message and the response is that
message; otherwise every assistant message of ``history`` is a call whose prompt is
everything before it. Only messages of the main agent (the first message's ``agent``)
are kept. SWE-agent may rewrite old observations at request time (its
``history_processors``, e.g. ``last_n_observations``); the stored history does not show
that, so it is not replayed.

**mini-swe-agent** ``.traj.json``: either a plain list of messages, or
``{"messages": [...], "info", "instance_id", "trajectory_format"}``. Each assistant
message is a call. Its ``extra.response.usage`` (when present) is the recorded usage
and ``extra.timestamp`` the time. Runs that call tools do not store the tool schema;
mini-swe-agent sends its ``bash`` tool with every call, so :data:`MINI_SWE_BASH_TOOL`
is added as the request's ``tools``.
"""
from __future__ import annotations

import json
from pathlib import Path

from prefixcache.analyze.logs.messages import (
    as_dict,
    clean_message,
    clean_messages,
    parse_timestamp,
)
from prefixcache.analyze.records import Request
from prefixcache.analyze.usage import normalize_usage

# The schema mini-swe-agent (v2, tool-calling models) sends as ``tools``.
MINI_SWE_BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Execute a bash command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string",
                                       "description": "The bash command to execute"}},
            "required": ["command"],
        },
    },
}


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".traj.json", ".traj", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def _calls(messages: list[dict]) -> list[int]:
    return [i for i, m in enumerate(messages) if m.get("role") == "assistant"]


def load_swe_agent(path: str | Path, data: dict | None = None) -> list[Request]:
    path = Path(path)
    data = data if data is not None else json.loads(path.read_text(encoding="utf-8"))
    stem = _stem(path)
    history = data.get("history") or []
    main_agent = history[0].get("agent") if history else None

    def keep(msgs: list) -> list[dict]:
        return [m for m in msgs if isinstance(m, dict)
                and (main_agent is None or m.get("agent", main_agent) == main_agent)]

    steps = data.get("trajectory") or []
    pairs: list[tuple[list, dict]] = []  # (prompt messages, response message)
    if steps and all(isinstance(s.get("messages"), list) for s in steps):
        for s in steps:
            msgs = keep(s["messages"])
            idx = _calls(msgs)
            if idx:
                pairs.append((msgs[: idx[-1]], msgs[idx[-1]]))
    else:
        msgs = keep(history)
        pairs = [(msgs[:i], msgs[i]) for i in _calls(msgs)]
    out = []
    for k, (prompt, resp) in enumerate(pairs):
        out.append(Request(
            request_id=f"{stem}#{k}", messages=clean_messages(prompt),
            response=clean_message(resp), conversation=stem, turn=k, source=str(path)))
    return out


def load_mini_swe_agent(path: str | Path, data: object = None) -> list[Request]:
    path = Path(path)
    data = data if data is not None else json.loads(path.read_text(encoding="utf-8"))
    stem = _stem(path)
    model = None
    if isinstance(data, dict):
        messages = data.get("messages") or []
        stem = str(data.get("instance_id") or stem)
        cfg = ((data.get("info") or {}).get("config") or {}).get("model") or {}
        model = cfg.get("model_name")
    else:
        messages = data
    messages = [m for m in messages if isinstance(m, dict)]
    tools = [MINI_SWE_BASH_TOOL] if any(m.get("tool_calls") for m in messages) else None
    out = []
    for k, i in enumerate(_calls(messages)):
        m = messages[i]
        extra = as_dict(m.get("extra"))
        resp = as_dict(extra.get("response"))
        out.append(Request(
            request_id=f"{stem}#{k}", messages=clean_messages(messages[:i]), tools=tools,
            response=clean_message(m), usage=normalize_usage(resp.get("usage")),
            conversation=stem, turn=k, timestamp=parse_timestamp(extra.get("timestamp")),
            model=resp.get("model") or model, source=str(path),
            extra={"recorded_cost": extra["cost"]} if isinstance(
                extra.get("cost"), (int, float)) else {}))
    return out
