"""Reading request logs into :class:`~prefixcache.analyze.records.Request` lists.

Formats: ``openai-jsonl`` (:mod:`.openai_jsonl`), ``swe-agent`` and ``mini-swe-agent``
(:mod:`.trajectories`), and two conversation datasets, ``oasst1`` and ``sharegpt``
(:mod:`.conversations`). ``auto`` picks one per file: ``.jsonl`` files are OpenAI
JSONL unless their first line is an oasst1 tree; a JSON object with ``trajectory`` and
``history`` is SWE-agent; a JSON list of messages, or an object with ``messages`` and
``info``/``trajectory_format``, is mini-swe-agent; a list of ``{"conversations"}`` is
ShareGPT; a JSON object or list of request bodies is OpenAI.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import cast

from prefixcache.analyze.logs.conversations import load_oasst1, load_sharegpt
from prefixcache.analyze.logs.openai_jsonl import LogFormatError, load_openai_jsonl, parse_record
from prefixcache.analyze.logs.trajectories import load_mini_swe_agent, load_swe_agent
from prefixcache.analyze.records import Request

FORMATS = ("auto", "openai-jsonl", "swe-agent", "mini-swe-agent", "oasst1", "sharegpt")

__all__ = ["FORMATS", "LogFormatError", "detect_format", "load_log", "load_logs"]


def detect_format(path: str | Path, data: object = None) -> str:
    """The format of one file (see the module docstring).

    Raises:
        LogFormatError: none of the formats fits.
    """
    path = Path(path)
    if path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            first = next((ln for ln in f if ln.strip()), "")
        return "oasst1" if '"message_tree_id"' in first else "openai-jsonl"
    if data is None:
        data = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data, dict):
        if "trajectory" in data and "history" in data:
            return "swe-agent"
        if "messages" in data and ("info" in data or "trajectory_format" in data):
            return "mini-swe-agent"
        if "messages" in data or "prompt" in data or "request" in data or "body" in data:
            return "openai-jsonl"
    if isinstance(data, list) and data and isinstance(data[0], dict):
        if "conversations" in data[0]:
            return "sharegpt"
        if "role" in data[0]:
            return "mini-swe-agent"
        if any(k in data[0] for k in ("messages", "prompt", "request", "body")):
            return "openai-jsonl"
    raise LogFormatError(f"{path}: cannot tell the log format; pass --format")


def _openai_json(path: Path, data: object) -> list[Request]:
    records = data if isinstance(data, list) else [data]
    out: list[Request] = []
    for i, rec in enumerate(records):
        out.extend(parse_record(rec, f"{path.stem}:{i + 1}", str(path)))
    return out


def load_log(path: str | Path, fmt: str = "auto") -> list[Request]:
    """All requests of one file, in file order.

    Raises:
        LogFormatError: unknown format, or a file that does not fit it.
        FileNotFoundError: no such file.
    """
    path = Path(path)
    if fmt not in FORMATS:
        raise LogFormatError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    data = None
    if path.suffix == ".jsonl" and fmt == "auto":
        fmt = detect_format(path)
    if fmt == "oasst1":
        return load_oasst1(path)
    if not (path.suffix == ".jsonl" and fmt == "openai-jsonl"):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise LogFormatError(f"{path}: not JSON ({exc})") from None
    if fmt == "auto":
        fmt = detect_format(path, data)
    if fmt == "openai-jsonl":
        return load_openai_jsonl(path) if data is None else _openai_json(path, data)
    if fmt == "sharegpt":
        if not isinstance(data, list):
            raise LogFormatError(f"{path}: a ShareGPT file is a JSON list")
        return load_sharegpt(path, data)
    if fmt == "swe-agent":
        if not isinstance(data, dict):
            raise LogFormatError(f"{path}: a SWE-agent .traj is a JSON object")
        return load_swe_agent(path, data)
    return load_mini_swe_agent(path, data)


def load_logs(paths: list[str | Path], fmt: str = "auto") -> list[Request]:
    """Requests of every file, ordered by timestamp when every request has one (ties
    and files keep their order), else in the order given.

    Raises:
        LogFormatError: as :func:`load_log`, or two requests share an id.
    """
    out: list[Request] = []
    for p in paths:
        out.extend(load_log(p, fmt))
    seen: set[str] = set()
    for r in out:
        if r.request_id in seen:
            raise LogFormatError(f"duplicate request id {r.request_id!r}")
        seen.add(r.request_id)
    if out and all(r.timestamp is not None for r in out):
        out.sort(key=lambda r: cast(float, r.timestamp))  # stable; all set (checked)
    return out
