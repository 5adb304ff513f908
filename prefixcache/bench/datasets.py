"""Readers for the benchmark's source data in ``shared/data`` (see each folder's SOURCE.md).

Every reader returns plain Python structures in OpenAI chat form (``{"role", "content"}``
dicts, assistant ``tool_calls`` as lists, tool schemas as OpenAI ``tools`` entries), so
the workload builders never see a source file format. Nothing here is copied into the
repository; the files are read where they lie.

The data root is :func:`prefixcache.paths.data_root` (``$PREFIXCACHE_DATA``, or
``<repo>/../shared/data`` in a source checkout).
"""
from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefixcache.paths import data_root


class DataMissing(FileNotFoundError):
    """A shared data folder or file is absent; the message names it."""


def data_path(*parts: str, root: Path | None = None) -> Path:
    """Path under the data root; raises :class:`DataMissing` naming the missing path."""
    if root is None:
        try:
            root = data_root()
        except FileNotFoundError as e:
            raise DataMissing(str(e)) from None
    p = root.joinpath(*parts)
    if not p.exists():
        raise DataMissing(f"benchmark data not found: {p} (set PREFIXCACHE_DATA to the "
                          f"shared/data folder)")
    return p


# --------------------------------------------------------------------------- prompts
def fabric_patterns(root: Path | None = None) -> dict[str, str]:
    """``{pattern name: system prompt text}`` for every fabric pattern, sorted by name."""
    base = data_path("prompts", "fabric_patterns", root=root)
    out = {}
    for d in sorted(base.iterdir()):
        f = d / "system.md"
        if d.is_dir() and f.is_file():
            out[d.name] = f.read_text(encoding="utf-8")
    return out


def gsm8k_fewshot_prefix(root: Path | None = None) -> str:
    """The 8-shot chain-of-thought GSM8K prefix (lm-eval ``gsm8k-cot``), rendered as
    ``"Q: {question}\\nA: {target}\\n\\n"`` per exemplar, in file order."""
    import yaml

    cfg = yaml.safe_load(data_path("prompts", "fewshot", "gsm8k-cot.yaml", root=root).read_text())
    shots = cfg["fewshot_config"]["samples"]
    return "".join(f"Q: {s['question']}\nA: {s['target']}\n\n" for s in shots)


def gsm8k_questions(root: Path | None = None) -> list[str]:
    path = data_path("gsm8k", "test.jsonl", root=root)
    return [json.loads(line)["question"] for line in path.read_text().splitlines() if line.strip()]


# --------------------------------------------------------------------------- oasst
def oasst_paths(root: Path | None = None) -> list[tuple[str, list[dict]]]:
    """One conversation path per OpenAssistant tree: ``(tree id, messages)``.

    From the root prompt, follow at each step the best-ranked reply (``rank`` 0, else the
    first) down to a leaf. Roles map ``prompter -> user``, ``assistant -> assistant``.
    """
    path = data_path("oasst1_trees", "en_100_tree.jsonl", root=root)
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        tree = json.loads(line)
        out.append((tree["message_tree_id"], oasst_best_path(tree["prompt"])))
    return out


def oasst_best_path(node: dict | None) -> list[dict]:
    msgs = []
    while node is not None:
        role = "user" if node["role"] == "prompter" else "assistant"
        msgs.append({"role": role, "content": node["text"]})
        replies = node.get("replies") or []
        node = (min(replies, key=lambda r: (r.get("rank") is None, r.get("rank") or 0))
                if replies else None)
    return msgs


# --------------------------------------------------------------------------- glaive
@dataclass
class ToolConversation:
    """A glaive conversation in OpenAI chat form plus its OpenAI ``tools`` list."""

    messages: list[dict]
    tools: list[dict] = field(default_factory=list)


def glaive_conversations(root: Path | None = None) -> list[ToolConversation]:
    path = data_path("glaive_toolcall", "glaive_toolcall_en_demo.json", root=root)
    raw = json.loads(path.read_text())
    return [glaive_to_openai(item) for item in raw]


def glaive_to_openai(item: dict) -> ToolConversation:
    """Map ShareGPT roles: ``human -> user``, ``gpt -> assistant``, ``function_call ->``
    assistant with one ``tool_calls`` entry, ``observation -> tool`` answering it."""
    tools = [{"type": "function", "function": t} for t in json.loads(item.get("tools") or "[]")]
    msgs: list[dict] = []
    n_calls = 0
    for turn in item["conversations"]:
        kind, value = turn["from"], turn["value"]
        if kind == "human":
            msgs.append({"role": "user", "content": value})
        elif kind == "gpt":
            msgs.append({"role": "assistant", "content": value})
        elif kind == "function_call":
            call = _loads_or(value, {"name": "unknown", "arguments": value})
            args = call.get("arguments", {})
            n_calls += 1
            msgs.append({"role": "assistant", "content": "", "tool_calls": [{
                "id": f"call_{n_calls}", "type": "function",
                "function": {"name": call.get("name", "unknown"),
                             "arguments": args if isinstance(args, str) else json.dumps(args)},
            }]})
        elif kind == "observation":
            msgs.append({"role": "tool", "tool_call_id": f"call_{n_calls}", "content": value})
        else:
            raise ValueError(f"glaive: unknown turn kind {kind!r}")
    return ToolConversation(msgs, tools)


# --------------------------------------------------------------------------- agents
@dataclass
class Trajectory:
    """An agent run: the final message list, and per assistant message (by index into
    ``messages``) the production usage DeepSeek recorded, where the file has it."""

    name: str
    source: str  # "mini-swe-agent/deepseek" | "mini-swe-agent" | "swe-agent"
    messages: list[dict]
    # message index -> {"prompt_tokens", "cached_tokens"}
    recorded: dict[int, dict] = field(default_factory=dict)


def agent_trajectories(root: Path | None = None) -> list[Trajectory]:
    """All SWE-agent and mini-swe-agent trajectories, DeepSeek runs first, by file name."""
    base = data_path("agent_trajectories", root=root)
    out = []
    for f in sorted((base / "mini-swe-agent" / "deepseek_pr816").glob("*.traj.json")):
        out.append(load_trajectory(f, "mini-swe-agent/deepseek"))
    for f in sorted((base / "mini-swe-agent" / "tests").glob("*.traj.json")):
        out.append(load_trajectory(f, "mini-swe-agent"))
    for f in sorted((base / "swe-agent").glob("*.traj")):
        out.append(load_trajectory(f, "swe-agent"))
    return out


def load_trajectory(path: Path, source: str) -> Trajectory:
    data = json.loads(Path(path).read_text())
    raw = data if isinstance(data, list) else (data.get("messages") or data.get("history"))
    msgs: list[dict] = []
    recorded: dict[int, dict] = {}
    for m in raw:
        msg = normalize_message(m)
        usage = None
        if isinstance(m, dict):
            usage = ((m.get("extra") or {}).get("response") or {}).get("usage")
        if msg["role"] == "assistant" and usage:
            details = usage.get("prompt_tokens_details") or {}
            recorded[len(msgs)] = {"prompt_tokens": usage.get("prompt_tokens"),
                                   "cached_tokens": details.get("cached_tokens")}
        msgs.append(msg)
    name = Path(path).name.split(".traj")[0]
    return Trajectory(name, source, _pair_tool_messages(msgs), recorded)


def _json_text(value: Any) -> str:
    """``value`` itself when it is already a string, else its JSON text."""
    return value if isinstance(value, str) else json.dumps(value)


def normalize_message(m: dict) -> dict:
    """Keep the OpenAI fields of a stored message (``role``, ``content``, ``tool_calls``,
    ``tool_call_id``); SWE-agent stores ``tool_calls`` / ``tool_call_ids`` as Python
    reprs, which are parsed here."""
    content = m.get("content")
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    out: dict[str, Any] = {"role": m["role"], "content": content or ""}
    calls = m.get("tool_calls")
    if isinstance(calls, str):
        calls = _literal_or(calls, None)
    if m["role"] == "assistant" and calls:
        out["tool_calls"] = [{
            "id": c.get("id") or f"call_{i}", "type": "function",
            "function": {"name": c["function"]["name"],
                         "arguments": _json_text(c["function"].get("arguments"))},
        } for i, c in enumerate(calls)]
    call_id = m.get("tool_call_id")
    if call_id is None and m.get("tool_call_ids"):
        ids = m["tool_call_ids"]
        ids = _literal_or(ids, [ids]) if isinstance(ids, str) else ids
        call_id = ids[0] if ids else None
    if m["role"] == "tool" and call_id:
        out["tool_call_id"] = call_id
    return out


def _pair_tool_messages(msgs: list[dict]) -> list[dict]:
    """A ``tool`` message that answers no preceding ``tool_calls`` becomes a ``user``
    message, so every list is valid for an OpenAI-compatible chat endpoint."""
    open_ids: set[str] = set()
    out = []
    for m in msgs:
        if m["role"] == "assistant":
            open_ids = {c["id"] for c in m.get("tool_calls", [])}
        if m["role"] == "tool" and m.get("tool_call_id") not in open_ids:
            m = {"role": "user", "content": m["content"]}
        out.append(m)
    return out


def _loads_or(text: str, default):
    try:
        return json.loads(text)
    except (ValueError, TypeError):
        return default


def _literal_or(text: str, default):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return default


# --------------------------------------------------------------------------- replay
def read_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for each non-blank line; a bad line raises ValueError
    naming the file and line."""
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not JSON: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{path}:{n}: expected a JSON object")
        yield n, obj
