"""Cold and warm TTFT at concurrency 1 through two or more OpenAI-compatible servers,
interleaved.

Each trial draws a fresh random prompt of ``--tokens`` token ids (nothing of it is cached
anywhere), then, server by server in an order that alternates between trials:

- **cold**: the prompt itself, ``max_tokens`` 1, streamed; TTFT = time from sending the
  request to its first text chunk, seen by this client (HTTP, tokenization-free: the prompt
  is token ids);
- **warm**: the first ``tokens - new`` ids of that prompt followed by ``new`` ids of its own
  (the cached share is ``(tokens - new) / tokens`` rounded down to the server's page size),
  sent right after the cold one.

Only one request is in flight at a time, so every server is idle while another is measured.
The servers must already be up (start them with the bench's own arguments); their
``cached_tokens`` in ``usage.prompt_tokens_details`` are recorded when they report them.

    python scripts/cold_ttft_ab.py --server ours=http://127.0.0.1:8011 \\
        --server vllm=http://127.0.0.1:8012 --model bench --tokens 2048 --trials 8 \\
        --out cold_ttft.json

Writes a JSON file with every trial and prints a Markdown table: per server the median
(min-max) of cold TTFT, warm TTFT and cold/warm per trial, and per pair of servers the
median (min-max) of the per-trial ratios of cold TTFT.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import httpx


def ttft(client: httpx.Client, url: str, model: str, ids: list[int]) -> tuple[float, int | None]:
    """(seconds to the first text chunk, cached_tokens or None) of one streamed request."""
    body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first: float | None = None
    cached: int | None = None
    with client.stream("POST", url + "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if first is None and chunk.get("choices"):
                first = time.perf_counter()
            usage = chunk.get("usage") or {}
            details = usage.get("prompt_tokens_details") or {}
            if details.get("cached_tokens") is not None:
                cached = int(details["cached_tokens"])
    if first is None:
        raise RuntimeError(f"{url}: no text chunk in the stream")
    return first - t0, cached


def spread(xs: list[float], fmt: str = "{:.3f}") -> str:
    return (fmt.format(statistics.median(xs)) + " (" + fmt.format(min(xs)) + "-"
            + fmt.format(max(xs)) + ")")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", action="append", required=True, metavar="NAME=URL")
    ap.add_argument("--model", required=True, help="the served model name")
    ap.add_argument("--tokens", type=int, default=2048, help="prompt length (token ids)")
    ap.add_argument("--new", type=int, default=64, help="warm request's uncached tail")
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=1, help="untimed trials first")
    ap.add_argument("--vocab", type=int, default=40000, help="ids drawn from [100, vocab)")
    ap.add_argument("--seed", type=int, default=None,
                    help="prompt draw (default: from the clock; recorded in --out)")
    ap.add_argument("--out", default=None, help="JSON file of every trial")
    args = ap.parse_args()
    servers = [tuple(s.split("=", 1)) for s in args.server]
    if any(len(s) != 2 for s in servers):
        ap.error("--server takes NAME=URL")
    if args.seed is None:
        args.seed = time.time_ns() % 2**32
    rng = random.Random(args.seed)
    draw = lambda n: [rng.randrange(100, args.vocab) for _ in range(n)]  # noqa: E731
    rows: list[dict] = []
    with httpx.Client(timeout=1800) as client:
        for trial in range(-args.warmup, args.trials):
            order = servers if trial % 2 == 0 else servers[::-1]
            for name, url in order:
                prompt = draw(args.tokens)  # a fresh prompt per server: nothing is shared
                cold, cold_cached = ttft(client, url, args.model, prompt)
                if cold_cached:
                    raise SystemExit(f"{name}: a cold prompt had {cold_cached} cached tokens "
                                     f"(a seed used before on this server? --seed {args.seed})")
                warm_ids = prompt[: args.tokens - args.new] + draw(args.new)
                warm, warm_cached = ttft(client, url, args.model, warm_ids)
                if trial >= 0:
                    rows.append({"trial": trial, "server": name, "cold_s": cold,
                                 "warm_s": warm, "cold_cached": cold_cached,
                                 "warm_cached": warm_cached})
    names = [n for n, _ in servers]
    by = {n: [r for r in rows if r["server"] == n] for n in names}
    print(f"{args.tokens}-token prompts, warm = {args.tokens - args.new} of them + {args.new} "
          f"new, {args.trials} trials, medians (min-max)\n")
    print("| server | cold TTFT (s) | warm TTFT (s) | cold / warm | cached (cold, warm) |")
    print("|---|---|---|---|---|")
    for n in names:
        rs = by[n]
        cached = {(r["cold_cached"], r["warm_cached"]) for r in rs}
        print(f"| {n} | {spread([r['cold_s'] for r in rs])} | "
              f"{spread([r['warm_s'] for r in rs], '{:.4f}')} | "
              f"{spread([r['cold_s'] / r['warm_s'] for r in rs], '{:.1f}')} | "
              f"{', '.join(str(c) for c in sorted(cached, key=str))} |")
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ratios = [rb["cold_s"] / ra["cold_s"] for ra, rb in zip(by[a], by[b])]
            wins = sum(x > 1 for x in ratios)
            print(f"\ncold TTFT {b} / {a} per trial: {spread(ratios, '{:.3f}')}, "
                  f"{a} faster in {wins} of {len(ratios)}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "trials": rows}, f, indent=1)


if __name__ == "__main__":
    main()
