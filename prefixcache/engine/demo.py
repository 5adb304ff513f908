"""``prefixcache demo``: the cache at work on the built-in model, in under a minute.

Sends requests that share a long prefix (a system prompt) one after another and prints
cold against warm time to first token, cached tokens and hit rate; then a burst of
identical cold requests sent at once, which pay for one prefill between them.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics

from prefixcache.engine.args import add_engine_args, config_from_args

SYSTEM = ("You are a careful assistant for a library. Answer questions about opening hours, "
          "loans, renewals, fines, inter-library requests and the reading rooms. Keep each "
          "answer short, cite the rule you used, and say when a question is outside these "
          "rules. ")
QUESTIONS = ["How long can I keep a book?", "Can I renew a loan twice?",
             "What is the fine for a late DVD?", "Are the reading rooms open on Sunday?",
             "How do I request a book from another library?", "Can children borrow films?",
             "Is there a limit on loans per card?", "Can I reserve a study room?"]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("demo", help="show cold vs warm TTFT on the built-in model")
    add_engine_args(p.add_argument_group("engine"))
    p.add_argument("--prefix-repeat", type=int, default=8,
                   help="copies of the system prompt in the shared prefix (length)")
    p.add_argument("--burst", type=int, default=4, help="identical cold requests at once")
    return p


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from prefixcache import LLM, SamplingParams

    console = Console()
    llm = LLM(**dataclasses.asdict(config_from_args(args)))
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    llm.generate(["warm-up"], params)  # first-call costs (allocator, kernels) out of the way
    base = llm.stats()
    prefix = SYSTEM * args.prefix_repeat
    table = Table(title=f"shared prefix, one request at a time ({args.model})")
    for col in ("request", "prompt tokens", "cached tokens", "TTFT ms"):
        table.add_column(col, justify="right")
    ttfts = []
    for i, q in enumerate(QUESTIONS):
        out = llm.chat([{"role": "system", "content": prefix}, {"role": "user", "content": q}],
                       params)[0]
        ttfts.append(out.ttft)
        table.add_row("cold" if i == 0 else f"warm {i}", str(len(out.prompt_token_ids)),
                      str(out.num_cached_tokens), f"{out.ttft * 1000:.1f}")
    console.print(table)
    cold, warm = ttfts[0], statistics.median(ttfts[1:])
    s = llm.stats()
    q = s["prefix_cache_queries"] - base["prefix_cache_queries"]
    h = s["prefix_cache_hits"] - base["prefix_cache_hits"]
    console.print(f"cold TTFT {cold * 1000:.1f} ms, warm TTFT (median) {warm * 1000:.1f} ms: "
                  f"[bold]{cold / warm:.1f}x[/bold] faster; hit rate {h / q:.1%} "
                  f"({h} of {q} prompt tokens)")

    before = llm.stats()["prefill_tokens_computed"]
    burst_prompt = [{"role": "system", "content": prefix[::-1]},
                    {"role": "user", "content": "Summarize the rules."}]
    outs = llm.chat([burst_prompt] * args.burst, params)
    computed = llm.stats()["prefill_tokens_computed"] - before
    n = len(outs[0].prompt_token_ids)
    console.print(f"burst of {args.burst} identical cold requests ({n} tokens each): "
                  f"{computed} prefill tokens computed, {computed / n:.2f}x one request "
                  f"(cached tokens {[o.num_cached_tokens for o in outs]})")
    s = llm.stats()
    console.print(f"pages: {s['pages_total']} total, {s['pages_free']} free, "
                  f"{s['pages_cached']} cached, {s['pages_live']} live")
    return 0
