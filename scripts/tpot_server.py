"""TPOT against context, measured through an OpenAI-compatible server (ours or a peer's).

For each context length: one request caches a random prefix of ``ctx - 8`` tokens; then
1 and 8 concurrent streaming requests, each the prefix plus 8 tokens of its own, decode
``--tokens`` tokens (greedy, ``ignore_eos``). TPOT of a request = (last token time - first
token time) / (tokens - 1); the figure is the median over requests and ``--repeats``
rounds, with min and max. Prefix caching makes the setup cheap (the prefix is computed
once per context) while every decode step still attends over the whole context of each
sequence. Rounds of the same context run back to back; run two servers' measurements
interleaved by calling this script alternately.

    python scripts/tpot_server.py --url http://127.0.0.1:8000 --model m --out tpot.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time

import httpx


async def stream_one(client: httpx.AsyncClient, url: str, model: str, ids: list[int],
                     tokens: int) -> list[float]:
    body = {"model": model, "prompt": ids, "max_tokens": tokens, "stream": True,
            "temperature": 0, "ignore_eos": True}
    times: list[float] = []
    async with client.stream("POST", url + "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if line.startswith("data:") and line.strip() != "data: [DONE]":
                chunk = json.loads(line[5:])
                if chunk.get("choices") and chunk["choices"][0].get("text") is not None:
                    times.append(time.perf_counter())
    return times


async def measure(url: str, model: str, contexts: list[int], seqs: list[int], tokens: int,
                  repeats: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    async with httpx.AsyncClient(timeout=1800) as client:
        for ctx in contexts:
            prefix = [rng.randrange(100, 40000) for _ in range(ctx - 8)]
            await stream_one(client, url, model, prefix, 1)  # computes and caches it
            for n in seqs:
                tpots: list[float] = []
                for _ in range(repeats):
                    prompts = [prefix + [rng.randrange(100, 40000) for _ in range(8)]
                               for _ in range(n)]
                    runs = await asyncio.gather(*(stream_one(client, url, model, p, tokens)
                                                  for p in prompts))
                    for t in runs:
                        if len(t) >= 2:
                            tpots.append((t[-1] - t[0]) / (len(t) - 1))
                rows.append({"ctx": ctx, "seqs": n, "median": statistics.median(tpots),
                             "min": min(tpots), "max": max(tpots), "requests": len(tpots)})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True, help="the served model name")
    ap.add_argument("--label", default="", help="name of the engine in the output")
    ap.add_argument("--contexts", default="512,1024,2048,4096,8000")
    ap.add_argument("--seqs", default="1,8")
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rows = asyncio.run(measure(a.url, a.model, [int(c) for c in a.contexts.split(",")],
                               [int(s) for s in a.seqs.split(",")], a.tokens, a.repeats,
                               a.seed))
    with open(a.out, "w") as f:
        json.dump({"label": a.label or a.url, "tokens": a.tokens, "repeats": a.repeats,
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
