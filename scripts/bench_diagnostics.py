"""The cost of a cache-miss diagnosis per request, on ``builtin:tiny`` (CPU).

The engine's :meth:`MissDiagnostics.diagnose` is timed alone (no model step): a tenant
holds a full response record (64 earlier requests of ``--tokens`` tokens each, one of them
sharing the prompt's first half), and each diagnosis compares a new prompt with all of
them (the best match), hashes the page after the hit, and decodes the excerpts. The
process CPU time is read around ``--calls`` diagnoses, repeated ``--rounds`` times;
median and spread are printed and written. A request that does not ask does none of this
(``diag_requests`` stays 0, checked by the tests).

    python scripts/bench_diagnostics.py --rounds 5 --out benchmarks/diagnostics/raw
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from prefixcache import LLM, SamplingParams
from prefixcache.engine.miss_diagnostics import DiagnosticsRequest

ONE = SamplingParams(max_tokens=1, temperature=0.0)


def toks(seed: int, n: int) -> list[int]:
    return [(1000 * seed + 7 * t + t * t) % 260 + 3 for t in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    llm = LLM("builtin:tiny", num_pages=2 * a.tokens // 16 + 8, block_size=16,
              max_model_len=a.tokens + 16)
    eng = llm.engine
    for k in range(64):  # the tenant's response record is full
        llm.generate({"prompt_token_ids": toks(k, a.tokens)}, ONE, cache_diagnostics=True)
    prompt = toks(0, a.tokens // 2) + toks(99, a.tokens - a.tokens // 2)
    req = eng.add_request("probe", prompt, ONE, diagnostics=DiagnosticsRequest())
    while not req.prefill_done:
        eng.step()
    per_call_us = []
    for _ in range(a.rounds):
        t0 = time.process_time()
        for _ in range(a.calls):
            d = eng.diagnostics.diagnose(req)
        per_call_us.append((time.process_time() - t0) / a.calls * 1e6)
    while eng.has_unfinished_requests():
        eng.step()
    res = {"tokens": a.tokens, "records": 64, "calls": a.calls, "rounds": a.rounds,
           "reason": d["reason"], "per_call_us": [round(x, 1) for x in per_call_us],
           "median_us": round(statistics.median(per_call_us), 1),
           "min_us": round(min(per_call_us), 1), "max_us": round(max(per_call_us), 1)}
    print(json.dumps(res))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "diagnose_cost.json").write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
