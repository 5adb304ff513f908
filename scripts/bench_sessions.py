"""Replay real agent trajectories as concurrent sessions with tool pauses, sessions on
against plain LRU, under memory pressure (benchmarks/sessions/RESULTS.md).

Each trajectory of ``agent_trajectories/mini-swe-agent/deepseek_pr816`` is an agent loop:
call k's prompt is call k-1's prompt, the model's answer, then the tool's observation.
Here every message is cut to ``--chars-per-message`` characters (the transcripts then fit
the small model's context), the answer is the one the engine generates (so the next
prompt extends exactly what was computed, as in a real agent), and a session stops at
``--max-calls`` calls or when the next prompt would pass ``--context`` tokens. Tool
pauses are drawn from an exponential distribution (``--pause-mean-s``, seeded). The pool
is the working set (the sessions' largest transcripts together) divided by
``--pressure``. ``--background N`` keeps N unrelated cold one-shot requests running beside
the sessions (another tenant's traffic), the pressure sessions are meant to withstand.
Runs alternate OFF (``session_ttl_s=0``, plain LRU) and ON.

Forced evictions of live-session pages are counted the same way in both modes: a call's
prompt starts with the previous transcript, so every full page of it that the call did
not read from the cache was evicted during the pause.

    python scripts/bench_sessions.py --pressure 2 --rounds 2
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import time
from dataclasses import dataclass, field

import numpy as np

from prefixcache import SamplingParams
from prefixcache.config import EngineConfig
from prefixcache.engine.engine import LLMEngine
from prefixcache.paths import data_root

BS = 16


def load_trajectories(chars: int) -> list[list[tuple[str, str]]]:
    """Per trajectory, its messages as ``(role, text cut to chars)``."""
    root = os.path.join(data_root(), "agent_trajectories", "mini-swe-agent", "deepseek_pr816")
    out = []
    for path in sorted(glob.glob(os.path.join(root, "*.traj.json"))):
        with open(path) as f:
            msgs = json.load(f)["messages"]
        conv = []
        for m in msgs:
            text = m.get("content") or ""
            if not isinstance(text, str):
                text = json.dumps(text)
            for call in m.get("tool_calls") or ():
                text += json.dumps(call.get("function", {}))
            conv.append((m["role"], text[:chars]))
        out.append(conv)
    return out


def recorded_cache_ratio() -> float:
    """DeepSeek's recorded cached_tokens / prompt_tokens over the same trajectories."""
    root = os.path.join(data_root(), "agent_trajectories", "mini-swe-agent", "deepseek_pr816")
    prompt = cached = 0
    for path in sorted(glob.glob(os.path.join(root, "*.traj.json"))):
        with open(path) as f:
            for m in json.load(f)["messages"]:
                usage = (((m.get("extra") or {}).get("response") or {}).get("usage") or {})
                if usage:
                    prompt += usage["prompt_tokens"]
                    cached += (usage.get("prompt_tokens_details") or {}).get(
                        "cached_tokens", 0)
    return cached / prompt


@dataclass
class Session:
    """One replayed agent: the messages still to send and its transcript so far."""

    sid: str
    messages: list[tuple[str, str]]
    transcript: list[int] = field(default_factory=list)
    calls: int = 0
    due: float = 0.0
    running: str | None = None
    done_at: float | None = None
    started: float = 0.0
    prev_len: int = 0  # tokens of the previous transcript whose KV was computed


def next_chunk(s: Session, enc) -> list[int] | None:
    """Tokens appended before the next call: messages up to (and excluding) the next
    assistant message; ``None`` when the trajectory is over."""
    chunk: list[int] = []
    while s.messages and s.messages[0][0] != "assistant":
        role, text = s.messages.pop(0)
        chunk += enc(f"<{role}>{text}</{role}>")
    if not s.messages and not chunk:
        return None
    if s.messages:
        s.messages.pop(0)  # the recorded answer: the engine's own answer replaces it
    return chunk


def run(args, mode: str, pool_pages: int, trajs, seed: int) -> dict:
    cfg = EngineConfig(model="builtin:tiny", num_pages=pool_pages, block_size=BS,
                       max_model_len=args.context, num_threads=args.threads,
                       session_ttl_s=args.ttl_s if mode == "on" else 0.0,
                       max_pinned_fraction=args.pinned_fraction)
    eng = LLMEngine(cfg)
    enc = eng.tokenizer.encode
    rng = random.Random(seed)
    sessions = []
    for i in range(args.sessions):
        conv = list(trajs[i % len(trajs)])
        conv[0] = (conv[0][0], f"[agent {i}] " + conv[0][1])  # distinct sessions
        sessions.append(Session(f"s{i}", conv))
    ttft, lost, prompt_tok, cached_tok = [], 0, 0, 0
    t0 = time.perf_counter()
    for s in sessions:
        s.due = t0 + rng.uniform(0, args.pause_mean_s)
        s.started = s.due
    live: dict[str, Session] = {}
    bg_running: set[str] = set()
    bg_n = 0
    while any(s.done_at is None for s in sessions):
        now = time.perf_counter()
        while len(bg_running) < args.background:  # unrelated one-shot traffic
            rid = f"bg-{bg_n}"
            eng.add_request(rid, [rng.randrange(3, 250) for _ in range(args.background_tokens)],
                            SamplingParams(max_tokens=1), tenant="background")
            bg_running.add(rid)
            bg_n += 1
        for s in sessions:
            if s.done_at is not None or s.running is not None or s.due > now:
                continue
            chunk = next_chunk(s, enc)
            prompt = s.transcript + (chunk or [])
            if (chunk is None or s.calls >= args.max_calls
                    or len(prompt) + args.max_out >= args.context):
                s.done_at = now
                continue
            rid = f"{s.sid}-{s.calls}"
            out_n = args.max_out
            eng.add_request(rid, prompt, SamplingParams(max_tokens=out_n, temperature=0.0,
                                                        ignore_eos=True),
                            session_id=s.sid)
            s.running, s.calls = rid, s.calls + 1
            live[rid] = s
            s.transcript = prompt
        if not eng.has_unfinished_requests() and not args.background:
            pending = [s.due for s in sessions if s.done_at is None and s.running is None]
            if pending:
                time.sleep(max(0.0, min(pending) - time.perf_counter()))
            continue
        for out in eng.step():
            if not out.finished:
                continue
            if out.request_id in bg_running:
                bg_running.discard(out.request_id)
                continue
            s = live.pop(out.request_id)
            ttft.append(out.metrics.ttft or 0.0)
            n = len(s.transcript)
            prompt_tok += n
            cached_tok += out.num_cached_tokens
            if s.calls > 1:  # pages of the previous transcript that were not read
                prev_pages = min(s.prev_len // BS, (n - 1) // BS)
                lost += max(0, prev_pages - out.num_cached_tokens // BS)
            comp = out.outputs[0].token_ids
            s.prev_len = n + len(comp) - 1  # the last sampled token has no KV
            s.transcript = s.transcript + list(comp)
            s.running = None
            s.due = time.perf_counter() + rng.expovariate(1.0 / args.pause_mean_s)
    wall = time.perf_counter() - t0
    st = eng.stats()
    jobs = [s.done_at - s.started for s in sessions]
    return {"mode": mode, "pool_pages": pool_pages, "wall_s": wall,
            "job_mean_s": float(np.mean(jobs)), "calls": sum(s.calls for s in sessions),
            "lost_pages": lost, "session_pages_evicted": st["session_pages_evicted"],
            "prefill_tokens": st["prefill_tokens_computed"],
            "session_prefill_tokens": prompt_tok - cached_tok, "background_requests": bg_n,
            "hit_rate": cached_tok / max(1, prompt_tok),
            "ttft_p50_ms": 1000 * float(np.percentile(ttft, 50)),
            "ttft_p99_ms": 1000 * float(np.percentile(ttft, 99))}


def working_set(args, trajs) -> int:
    """Pages of the sessions' largest transcripts together (the context bound)."""
    return args.sessions * (args.context // BS)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sessions", type=int, default=6)
    p.add_argument("--pressure", type=float, nargs="+", default=[2.0, 4.0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--max-calls", type=int, default=12)
    p.add_argument("--max-out", type=int, default=24)
    p.add_argument("--chars-per-message", type=int, default=160)
    p.add_argument("--pause-mean-s", type=float, default=0.3)
    p.add_argument("--ttl-s", type=float, default=60.0)
    p.add_argument("--pinned-fraction", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--background", type=int, default=0,
                   help="unrelated one-shot requests kept running beside the sessions")
    p.add_argument("--background-tokens", type=int, default=256)
    p.add_argument("--out", default=None, help="write every run as JSON lines here")
    args = p.parse_args()
    trajs = load_trajectories(args.chars_per_message)
    ws = working_set(args, trajs)
    print(f"recorded DeepSeek cached/prompt ratio: {recorded_cache_ratio():.4f}")
    print(f"working set {ws} pages; sessions {args.sessions}")
    results = []
    for r in range(args.rounds):
        for pressure in args.pressure:
            order = ("off", "on") if r % 2 == 0 else ("on", "off")
            for mode in order:
                res = run(args, mode, int(ws / pressure), trajs, seed=r)
                res.update(pressure=pressure, round=r)
                results.append(res)
                print(json.dumps(res), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            for res in results:
                f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
