"""n parallel samples of one prompt against n separate requests, offline API.

Three ways to get ``n`` samples of one cold prompt, interleaved over rounds (each run in
its own cache namespace, so each starts cold):

- ``group``: one request with ``SamplingParams(n=N)`` (one prefill, the prompt's pages
  shared, the partial page copied);
- ``separate``: ``N`` requests with the same prompt, prefix caching on (one leads, the
  others follow its in-flight pages and compute the last partial page themselves);
- ``no-cache``: ``N`` requests with prefix caching off (``N`` prefills).

Prints one JSON line per run and a Markdown table of medians (prefill tokens computed,
pages copied by forks, wall seconds). Usage:

    python scripts/bench_parallel_samples.py --model smollm2-135m-instruct-q4_1 \
        --prompt-tokens 1000 --n 8 --max-tokens 16 --rounds 3
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from prefixcache import LLM, SamplingParams


def run_case(llm: LLM, case: str, prompt: list[int], n: int, max_tokens: int,
             salt: str) -> dict:
    before = llm.stats()
    t0 = time.perf_counter()
    if case == "group":
        params = SamplingParams(n=n, max_tokens=max_tokens, seed=1, ignore_eos=True)
        outs = llm.generate({"prompt_token_ids": prompt}, params, cache_salt=salt)
        samples = len(outs[0].outputs)
    else:
        params_list = [SamplingParams(max_tokens=max_tokens, seed=1 + i, ignore_eos=True)
                       for i in range(n)]
        outs = llm.generate([{"prompt_token_ids": prompt}] * n, params_list, cache_salt=salt)
        samples = len(outs)
    wall = time.perf_counter() - t0
    after = llm.stats()
    return {"case": case, "samples": samples, "wall_s": round(wall, 3),
            "prefill_tokens": after["prefill_tokens_computed"]
            - before["prefill_tokens_computed"],
            "decode_tokens": after["decode_tokens_computed"] - before["decode_tokens_computed"],
            "fork_shared_pages": after["fork_shared_pages"] - before["fork_shared_pages"],
            "fork_copied_pages": after["fork_copied_pages"] - before["fork_copied_pages"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:tiny")
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--num-pages", type=int, default=1024)
    args = ap.parse_args()
    cached = LLM(args.model, num_pages=args.num_pages)
    plain = LLM(args.model, num_pages=args.num_pages, enable_prefix_caching=False)
    vocab = cached.engine.model_config.vocab_size
    rng = random.Random(0)
    prompt = [rng.randrange(10, vocab) for _ in range(args.prompt_tokens)]
    # warm up both engines (memory, kernels) outside the measured runs
    for llm in (cached, plain):
        run_case(llm, "separate", prompt[:64], 2, 2, "warmup")
    rows: list[dict] = []
    for r in range(args.rounds):
        cases = ["group", "separate", "no-cache"]
        if r % 2:
            cases.reverse()
        for case in cases:
            llm = plain if case == "no-cache" else cached
            row = run_case(llm, case, prompt, args.n, args.max_tokens, f"round{r}-{case}")
            row["round"] = r
            print(json.dumps(row), flush=True)
            rows.append(row)
    print(f"\nmodel {args.model}, prompt {args.prompt_tokens} tokens, n={args.n}, "
          f"{args.max_tokens} tokens per sample, median of {args.rounds} rounds\n")
    print("| case | prefill tokens computed | pages shared / copied by forks | wall s |")
    print("|---|---|---|---|")
    for case in ("group", "separate", "no-cache"):
        mine = [x for x in rows if x["case"] == case]
        print(f"| {case} | {statistics.median(x['prefill_tokens'] for x in mine):.0f} | "
              f"{statistics.median(x['fork_shared_pages'] for x in mine):.0f} / "
              f"{statistics.median(x['fork_copied_pages'] for x in mine):.0f} | "
              f"{statistics.median(x['wall_s'] for x in mine):.2f} |")
    cached.close()
    plain.close()


if __name__ == "__main__":
    main()
