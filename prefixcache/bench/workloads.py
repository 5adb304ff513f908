"""Benchmark workloads: each one is a list of :class:`BenchRequest` in submission order.

Requests that share a ``session`` are sent one after another (turn ``k + 1`` only after
turn ``k`` finished), the way a chat user or an agent loop waits for the answer; requests
of different sessions run concurrently up to the run's concurrency. Sizes default to what
a 2-core CPU finishes in about a minute per peer; :class:`WorkloadConfig` scales them up.

Workloads (all built from ``shared/data``; see each folder's SOURCE.md):

- ``shared-prefix``: ``num_prefixes`` long system prompts (fabric patterns) x
  ``questions_per_prefix`` user questions (OpenAssistant root prompts), shuffled: the
  SGLang generated-shared-prefix shape.
- ``few-shot``: the 8-shot GSM8K chain-of-thought prefix + ``fewshot_questions`` test
  questions, as raw completion prompts.
- ``multi-turn``: OpenAssistant conversation paths and glaive tool-call conversations,
  replayed turn by turn with the recorded assistant messages as history.
- ``agent``: SWE-agent and mini-swe-agent trajectories, replayed call by call with the
  growing message list; DeepSeek's recorded ``cached_tokens`` ride along as reference.
- ``cold-burst``: ``burst_size`` identical cold requests sent at once.
- ``multi-tenant``: the shared-prefix workload sent by ``tenants`` tenants (identical
  prompts, so any leak between tenants would show as a hit).
- ``replay``: a user's JSONL log of OpenAI request bodies (see :func:`parse_replay`).
"""
from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prefixcache.bench import datasets

WORKLOADS = ("shared-prefix", "few-shot", "multi-turn", "agent", "cold-burst",
             "multi-tenant", "no-reuse", "replay")
# `--workload all` runs these (no-reuse is a baseline run on request; replay needs
# --requests FILE).
DEFAULT_WORKLOADS = WORKLOADS[:-2]


@dataclass
class BenchRequest:
    """One request of a workload.

    Attributes:
        id: unique within the workload.
        session: requests with the same session are sent sequentially, in ``turn`` order.
        turn: 0-based index within the session (conversation turn, agent call).
        group: the shareable prefix this request belongs to (system prompt, few-shot
            prefix, conversation); used for cold/warm labels and per-group plots.
        messages / tools: OpenAI chat form; or ``prompt`` (text or token ids) for raw
            completions. Exactly one of ``messages`` and ``prompt`` is set.
        tenant: who sends it (multi-tenant, replay); ``None`` for the default tenant.
        max_tokens: output tokens to generate.
        arrival_s: earliest send time relative to the run start (replay timestamps).
        warm_expected: the structural label: ``False`` for a request whose prefix nobody
            sent before it (first of its group / session, all of a cold burst), ``True``
            when an earlier request of the same tenant carries its prefix. ``None``: the
            runner labels it from token overlap.
        reference: DeepSeek's recorded ``{"prompt_tokens", "cached_tokens"}`` (agent).
    """

    id: str
    session: str
    turn: int = 0
    group: str = ""
    messages: list[dict] | None = None
    tools: list[dict] | None = None
    prompt: str | list[int] | None = None
    tenant: str | None = None
    max_tokens: int = 16
    arrival_s: float | None = None
    warm_expected: bool | None = None
    reference: dict | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class WorkloadConfig:
    """Sizes of each workload. Defaults fit a 2-core CPU; raise them to scale up."""

    seed: int = 0
    max_tokens: int = 16
    # shared-prefix
    num_prefixes: int = 4
    questions_per_prefix: int = 8
    prefix_min_chars: int = 6000
    prefix_max_chars: int = 9000
    question_max_chars: int = 400
    # few-shot
    fewshot_questions: int = 32
    # multi-turn
    oasst_conversations: int = 8
    glaive_conversations: int = 8
    min_user_turns: int = 2
    # agent
    agent_sources: tuple[str, ...] = ("mini-swe-agent/deepseek", "mini-swe-agent", "swe-agent")
    agent_max_calls: int | None = None
    # multi-turn and agent stop a session before its first request longer than this
    max_prompt_tokens: int = 8192
    # cold-burst
    burst_size: int = 8
    # multi-tenant
    tenants: int = 4
    tenant_prefixes: int = 2
    tenant_questions: int = 4
    # no-reuse: distinct prompts of about this many tokens (nothing to reuse)
    no_reuse_requests: int = 8
    no_reuse_prompt_tokens: int = 512
    no_reuse_max_tokens: int | None = None  # output tokens; None: max_tokens
    # replay
    requests_file: str | None = None


Measure = Callable[[BenchRequest], int]


def approx_tokens(req: BenchRequest) -> int:
    """A tokenizer-free length estimate (4 characters per token), for when no tokenizer
    is at hand."""
    if req.prompt is not None:
        return len(req.prompt) if isinstance(req.prompt, list) else len(req.prompt) // 4
    chars = sum(len(m.get("content") or "") + 8 for m in req.messages or [])
    chars += sum(len(str(t)) for t in req.tools or [])
    return chars // 4


def build_workload(name: str, cfg: WorkloadConfig | None = None, *, measure: Measure | None = None,
                   data_root: Path | None = None) -> list[BenchRequest]:
    """The requests of workload ``name``. ``measure`` counts a request's prompt tokens
    (the runner passes the model's tokenizer); it bounds sessions by
    ``cfg.max_prompt_tokens``."""
    cfg = cfg or WorkloadConfig()
    measure = measure or approx_tokens
    builders = {
        "shared-prefix": lambda: shared_prefix(cfg, data_root),
        "few-shot": lambda: few_shot(cfg, data_root),
        "multi-turn": lambda: multi_turn(cfg, measure, data_root),
        "agent": lambda: agent(cfg, measure, data_root),
        "cold-burst": lambda: cold_burst(cfg, data_root),
        "multi-tenant": lambda: multi_tenant(cfg, data_root),
        "no-reuse": lambda: no_reuse(cfg, measure, data_root),
        "replay": lambda: replay(cfg),
    }
    if name not in builders:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    return builders[name]()


# --------------------------------------------------------------------------- shared-prefix
def pick_system_prompts(patterns: dict[str, str], n: int, min_chars: int,
                        max_chars: int) -> list[tuple[str, str]]:
    """``n`` distinct system prompts: among the patterns whose length is within
    ``[min_chars, max_chars]`` (sorted by name), evenly spaced ones first, skipping any
    that shares a quarter or more of its text as a common prefix with one already picked
    (variants such as ``analyze_paper`` / ``analyze_paper_simple``); if too few qualify,
    the others closest in length to the range."""
    inside = sorted(k for k, v in patterns.items() if min_chars <= len(v) <= max_chars)

    def distance(k: str) -> tuple[int, str]:
        return min(abs(len(patterns[k]) - min_chars), abs(len(patterns[k]) - max_chars)), k

    outside = sorted((k for k in patterns if k not in inside), key=distance)
    m = len(inside)
    spaced = ([inside[round(i * (m - 1) / (n - 1))] if n > 1 else inside[0]
               for i in range(min(n, m))] if m else [])
    order = list(dict.fromkeys(spaced + inside + outside))
    picked: list[str] = []
    for k in order:
        if len(picked) == n:
            break
        text = patterns[k]
        if all(len(os.path.commonprefix([text, patterns[p]]))
               < 0.25 * min(len(text), len(patterns[p])) for p in picked):
            picked.append(k)
    return [(k, patterns[k]) for k in picked]


def user_questions(root: Path | None, max_chars: int) -> list[str]:
    """Human-written first questions of the OpenAssistant trees, at most ``max_chars``."""
    return [msgs[0]["content"] for _, msgs in datasets.oasst_paths(root)
            if len(msgs[0]["content"]) <= max_chars]


def shared_prefix_requests(system_prompts: list[tuple[str, str]], questions: list[str],
                           per_prefix: int, *, seed: int, max_tokens: int,
                           workload: str = "shared-prefix",
                           tenant: str | None = None, shuffle: bool = True) -> list[BenchRequest]:
    """``len(system_prompts) * per_prefix`` independent requests; question ``j`` of prefix
    ``i`` is ``questions[(i * per_prefix + j) % len(questions)]``."""
    reqs = []
    for i, (name, system) in enumerate(system_prompts):
        for j in range(per_prefix):
            q = questions[(i * per_prefix + j) % len(questions)]
            rid = f"{tenant + '/' if tenant else ''}{name}/{j}"
            reqs.append(BenchRequest(id=rid, session=rid, turn=0, group=name, tenant=tenant,
                                     messages=[{"role": "system", "content": system},
                                               {"role": "user", "content": q}],
                                     max_tokens=max_tokens))
    if shuffle:
        random.Random(seed).shuffle(reqs)
    return label_first_of_group(reqs)


def label_first_of_group(reqs: list[BenchRequest]) -> list[BenchRequest]:
    """``warm_expected = False`` for the first request of each (tenant, group), else True."""
    seen = set()
    for r in reqs:
        key = (r.tenant, r.group)
        r.warm_expected = key in seen
        seen.add(key)
    return reqs


def shared_prefix(cfg: WorkloadConfig, root: Path | None = None) -> list[BenchRequest]:
    systems = pick_system_prompts(datasets.fabric_patterns(root), cfg.num_prefixes,
                                  cfg.prefix_min_chars, cfg.prefix_max_chars)
    questions = user_questions(root, cfg.question_max_chars)
    return shared_prefix_requests(systems, questions, cfg.questions_per_prefix, seed=cfg.seed,
                                  max_tokens=cfg.max_tokens)


# --------------------------------------------------------------------------- few-shot
def few_shot_requests(prefix: str, questions: list[str], *, max_tokens: int) -> list[BenchRequest]:
    reqs = [BenchRequest(id=f"gsm8k/{i}", session=f"gsm8k/{i}", group="gsm8k-cot-8shot",
                         prompt=f"{prefix}Q: {q}\nA:", max_tokens=max_tokens)
            for i, q in enumerate(questions)]
    return label_first_of_group(reqs)


def few_shot(cfg: WorkloadConfig, root: Path | None = None) -> list[BenchRequest]:
    return few_shot_requests(datasets.gsm8k_fewshot_prefix(root),
                             datasets.gsm8k_questions(root)[: cfg.fewshot_questions],
                             max_tokens=cfg.max_tokens)


# --------------------------------------------------------------------------- multi-turn
def conversation_requests(session: str, messages: list[dict], *,
                          tools: list[dict] | None = None, system: str | None = None,
                          max_tokens: int, measure: Measure = approx_tokens,
                          max_prompt_tokens: int | None = None, max_calls: int | None = None,
                          references: dict[int, dict] | None = None,
                          group: str | None = None) -> list[BenchRequest]:
    """Replay a recorded conversation: one request per assistant message ``i``, whose
    prompt is ``messages[:i]`` (so the recorded assistant messages are the history). The
    session stops before the first prompt longer than ``max_prompt_tokens`` tokens, or
    after ``max_calls`` requests."""
    head = [{"role": "system", "content": system}] if system else []
    reqs: list[BenchRequest] = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant" or i == 0:
            continue
        if max_calls is not None and len(reqs) >= max_calls:
            break
        req = BenchRequest(id=f"{session}#{len(reqs)}", session=session, turn=len(reqs),
                           group=group or session, messages=head + [dict(x) for x in messages[:i]],
                           tools=tools or None, max_tokens=max_tokens,
                           warm_expected=len(reqs) > 0,
                           reference=(references or {}).get(i))
        if max_prompt_tokens is not None and measure(req) > max_prompt_tokens:
            break
        reqs.append(req)
    return reqs


def multi_turn(cfg: WorkloadConfig, measure: Measure = approx_tokens,
               root: Path | None = None) -> list[BenchRequest]:
    """``oasst_conversations`` OpenAssistant paths and ``glaive_conversations`` glaive
    conversations with at least ``min_user_turns`` user turns, in file order, interleaved."""
    oasst: list[list[BenchRequest]] = []
    for tree_id, msgs in datasets.oasst_paths(root):
        if len(oasst) >= cfg.oasst_conversations:
            break
        if sum(m["role"] == "user" for m in msgs) >= cfg.min_user_turns:
            reqs = conversation_requests(f"oasst/{tree_id[:8]}", msgs, max_tokens=cfg.max_tokens,
                                         measure=measure, max_prompt_tokens=cfg.max_prompt_tokens)
            if reqs:
                oasst.append(reqs)
    glaive: list[list[BenchRequest]] = []
    for k, conv in enumerate(datasets.glaive_conversations(root)):
        if len(glaive) >= cfg.glaive_conversations:
            break
        if sum(m["role"] == "user" for m in conv.messages) >= cfg.min_user_turns:
            reqs = conversation_requests(f"glaive/{k}", conv.messages, tools=conv.tools,
                                         max_tokens=cfg.max_tokens, measure=measure,
                                         max_prompt_tokens=cfg.max_prompt_tokens)
            if reqs:
                glaive.append(reqs)
    return interleave_sessions(oasst + glaive)


def interleave_sessions(sessions: list[list[BenchRequest]]) -> list[BenchRequest]:
    """Round-robin by turn: every session's turn 0, then every turn 1, ... (the order in
    which a fair client would issue them)."""
    out: list[BenchRequest] = []
    depth = max((len(s) for s in sessions), default=0)
    for t in range(depth):
        out.extend(s[t] for s in sessions if t < len(s))
    return out


# --------------------------------------------------------------------------- agent
def agent(cfg: WorkloadConfig, measure: Measure = approx_tokens,
          root: Path | None = None) -> list[BenchRequest]:
    sessions = []
    for traj in datasets.agent_trajectories(root):
        if traj.source not in cfg.agent_sources:
            continue
        reqs = conversation_requests(f"{traj.source}/{traj.name}", traj.messages,
                                     max_tokens=cfg.max_tokens, measure=measure,
                                     max_prompt_tokens=cfg.max_prompt_tokens,
                                     max_calls=cfg.agent_max_calls, references=traj.recorded)
        if reqs:
            sessions.append(reqs)
    return interleave_sessions(sessions)


def reference_hit_rate(reqs: list[BenchRequest]) -> float | None:
    """DeepSeek's production hit rate over the requests that carry a recorded usage:
    sum of recorded ``cached_tokens`` / sum of recorded ``prompt_tokens``."""
    refs = [r.reference for r in reqs if r.reference and r.reference.get("prompt_tokens")]
    if not refs:
        return None
    return sum(x.get("cached_tokens") or 0 for x in refs) / sum(x["prompt_tokens"] for x in refs)


# --------------------------------------------------------------------------- cold-burst
def cold_burst_requests(system: tuple[str, str], question: str, n: int, *,
                        max_tokens: int) -> list[BenchRequest]:
    msgs = [{"role": "system", "content": system[1]}, {"role": "user", "content": question}]
    return [BenchRequest(id=f"burst/{i}", session=f"burst/{i}", group=system[0],
                         messages=[dict(m) for m in msgs], max_tokens=max_tokens,
                         warm_expected=False) for i in range(n)]


def cold_burst(cfg: WorkloadConfig, root: Path | None = None) -> list[BenchRequest]:
    system = pick_system_prompts(datasets.fabric_patterns(root), 1, cfg.prefix_min_chars,
                                 cfg.prefix_max_chars)[0]
    question = user_questions(root, cfg.question_max_chars)[0]
    return cold_burst_requests(system, question, cfg.burst_size, max_tokens=cfg.max_tokens)


# --------------------------------------------------------------------------- multi-tenant
def multi_tenant_requests(system_prompts: list[tuple[str, str]], questions: list[str],
                          per_prefix: int, tenants: int, *, seed: int,
                          max_tokens: int) -> list[BenchRequest]:
    """Every tenant sends the same shared-prefix requests (each tenant's own order is
    shuffled with ``seed + t``); tenants are interleaved round-robin."""
    per_tenant = [shared_prefix_requests(system_prompts, questions, per_prefix, seed=seed + t,
                                         max_tokens=max_tokens, workload="multi-tenant",
                                         tenant=f"tenant{t}")
                  for t in range(tenants)]
    out: list[BenchRequest] = []
    for k in range(max(len(x) for x in per_tenant)):
        out.extend(x[k] for x in per_tenant if k < len(x))
    return out


def multi_tenant(cfg: WorkloadConfig, root: Path | None = None) -> list[BenchRequest]:
    systems = pick_system_prompts(datasets.fabric_patterns(root), cfg.tenant_prefixes,
                                  cfg.prefix_min_chars, cfg.prefix_max_chars)
    questions = user_questions(root, cfg.question_max_chars)
    return multi_tenant_requests(systems, questions, cfg.tenant_questions, cfg.tenants,
                                 seed=cfg.seed, max_tokens=cfg.max_tokens)


# --------------------------------------------------------------------------- no-reuse
def no_reuse_requests(words: list[str], n: int, prompt_tokens: int, *, seed: int,
                      max_tokens: int, measure: Measure = approx_tokens) -> list[BenchRequest]:
    """``n`` raw-completion prompts of at most ``prompt_tokens`` tokens (by ``measure``;
    whole words, so a few tokens short at most), each ``"<i>: "`` then ``words``
    in its own shuffled order: no two share more than their first token or so, so a
    prefix cache has nothing to reuse (the baseline of batching alone).

    Raises:
        ValueError: ``words`` is empty, or ``prompt_tokens`` < 1.
    """
    if not words or prompt_tokens < 1:
        raise ValueError(f"no-reuse: needs words and prompt_tokens >= 1 (got {len(words)} "
                         f"words, prompt_tokens={prompt_tokens})")
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        pool = list(words)
        while len(pool) < prompt_tokens:  # a word is at least one token
            pool += words
        rng.shuffle(pool)
        rid, n_words = f"no-reuse/{i}", prompt_tokens
        text = f"{i}: " + " ".join(pool[:n_words])
        for k in range(64):  # drop words in proportion to the excess until it fits
            have = measure(BenchRequest(id=f"{rid}~{k}", session=rid, prompt=text,
                                        max_tokens=max_tokens))
            if have <= prompt_tokens or n_words <= 1:
                break
            n_words -= max(1, n_words * (have - prompt_tokens) // have)
            text = f"{i}: " + " ".join(pool[:n_words])
        reqs.append(BenchRequest(id=rid, session=rid, group=rid, prompt=text,
                                 max_tokens=max_tokens, warm_expected=False))
    return reqs


def no_reuse(cfg: WorkloadConfig, measure: Measure = approx_tokens,
             root: Path | None = None) -> list[BenchRequest]:
    words = " ".join(user_questions(root, cfg.question_max_chars)).split()
    return no_reuse_requests(words, cfg.no_reuse_requests, cfg.no_reuse_prompt_tokens,
                             seed=cfg.seed, measure=measure,
                             max_tokens=cfg.no_reuse_max_tokens or cfg.max_tokens)


# --------------------------------------------------------------------------- replay
REPLAY_META_KEYS = ("tenant", "timestamp", "session", "body")


def parse_replay(path: str | Path, *, default_max_tokens: int = 16) -> list[BenchRequest]:
    """Read a JSONL request log. Each line is either an OpenAI request body
    (``/v1/chat/completions`` with ``messages`` [+ ``tools``], or ``/v1/completions``
    with ``prompt`` as text or token ids), optionally with top-level ``tenant`` (str),
    ``timestamp`` (seconds, any origin) and ``session`` (str: requests of one session are
    sent in file order, each after the previous finished); or ``{"body": {...}, "tenant",
    "timestamp", "session"}``. ``max_tokens`` / ``max_completion_tokens`` from the body are
    kept, else ``default_max_tokens``. Arrival offsets are timestamps minus the smallest."""
    reqs: list[BenchRequest] = []
    turns: dict[str, int] = {}
    for n, obj in datasets.read_jsonl(Path(path)):
        if isinstance(obj.get("body"), dict):
            body = obj["body"]
        else:
            body = {k: v for k, v in obj.items() if k not in REPLAY_META_KEYS}
        messages, prompt = body.get("messages"), body.get("prompt")
        if (messages is None) == (prompt is None):
            raise ValueError(f"{path}:{n}: a request needs exactly one of 'messages' and 'prompt'")
        token_ids = isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
        if prompt is not None and not (isinstance(prompt, str) or token_ids):
            raise ValueError(f"{path}:{n}: 'prompt' must be a string or a list of token ids")
        if messages is not None and not (
                isinstance(messages, list)
                and all(isinstance(m, dict) and "role" in m for m in messages)):
            raise ValueError(f"{path}:{n}: 'messages' must be a list of {{role, content}} objects")
        ts = obj.get("timestamp")
        if ts is not None and not isinstance(ts, (int, float)):
            raise ValueError(f"{path}:{n}: 'timestamp' must be a number of seconds")
        session = str(obj["session"]) if obj.get("session") is not None else f"line{n}"
        turn = turns.get(session, 0)
        turns[session] = turn + 1
        max_tokens = (body.get("max_tokens") or body.get("max_completion_tokens")
                      or default_max_tokens)
        reqs.append(BenchRequest(id=f"line{n}", session=session, turn=turn, group=session,
                                 messages=messages, tools=body.get("tools"), prompt=prompt,
                                 tenant=obj.get("tenant"), max_tokens=int(max_tokens),
                                 arrival_s=float(ts) if ts is not None else None,
                                 warm_expected=True if turn > 0 else None))
    stamps = [r.arrival_s for r in reqs if r.arrival_s is not None]
    if stamps:
        t0 = min(stamps)
        reqs = [replace(r, arrival_s=r.arrival_s - t0 if r.arrival_s is not None else None)
                for r in reqs]
    return reqs


def replay(cfg: WorkloadConfig) -> list[BenchRequest]:
    if not cfg.requests_file:
        raise ValueError("the replay workload needs --requests FILE "
                         "(a JSONL log of OpenAI request bodies)")
    return parse_replay(cfg.requests_file, default_max_tokens=cfg.max_tokens)

