"""``prefixcache demo``: the cache at work on the default model (a real chat model), in
under a minute.

A help-desk assistant with a long shared system prompt (``prefixcache/data/
demo_system_prompt.md``, about 500 tokens) answers several questions one after another:
the first pays for the prompt's prefill (cold), the others hit its cached pages (warm).
It prints the real answers, cold against warm time to first token, cached tokens per
request and the hit rate; then a burst of identical cold requests (a fresh ``cache_salt``)
sent at once, which pay for one prefill between them. ``--model builtin:tiny`` runs
without the model package (random weights: the answers are gibberish).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
from importlib import resources

from prefixcache.engine.args import add_engine_args, config_from_args, positive_int
from prefixcache.model.registry import DEFAULT_MODEL

QUESTIONS = ["When is the library open on Saturday?", "What does a lost card cost?",
             "How long can I borrow a book?", "Can I take today's newspaper home?",
             "What is the fine for a late book?", "Is the Wi-Fi free?"]
BURST_QUESTION = "How many items can one card hold?"


def system_prompt() -> str:
    """The demo's shared system prompt (the project's own text)."""
    return (resources.files("prefixcache") / "data" / "demo_system_prompt.md").read_text()


def one_line(text: str) -> str:
    """An answer for display: its whitespace runs (newlines included) as single spaces."""
    return " ".join(text.split())


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("demo", help=f"show cold vs warm TTFT on {DEFAULT_MODEL}")
    add_engine_args(p.add_argument_group("engine"), defaults={"model": DEFAULT_MODEL})
    p.add_argument("--prefix-repeat", type=positive_int, default=1,
                   help="copies of the system prompt in the shared prefix (copies)")
    p.add_argument("--burst", type=positive_int, default=4,
                   help="identical cold requests at once (requests)")
    p.add_argument("--max-tokens", type=positive_int, default=32, help="longest answer (tokens)")
    return p


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from prefixcache.engine.llm import LLM
    from prefixcache.sampling_params import SamplingParams

    console = Console()
    llm = LLM(**dataclasses.asdict(config_from_args(args)))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    llm.generate(["warm-up"], SamplingParams(max_tokens=2))  # first-call costs out of the way
    base = llm.stats()
    system = system_prompt() * args.prefix_repeat
    table = Table(title=f"a help desk with a shared system prompt, one question at a time "
                        f"({args.model})")
    for col in ("request", "question", "prompt tokens", "cached tokens", "TTFT ms"):
        table.add_column(col, justify="left" if col == "question" else "right")
    ttfts, answers = [], []
    for i, q in enumerate(QUESTIONS):
        out = llm.chat([{"role": "system", "content": system}, {"role": "user", "content": q}],
                       params)[0]
        assert out.ttft is not None, "every demo request produces a token"
        ttfts.append(out.ttft)
        name = "cold" if i == 0 else f"warm {i}"
        answers.append(f"[bold]{name}[/bold] {q} -> {one_line(out.outputs[0].text)}")
        table.add_row(name, q, str(len(out.prompt_token_ids)), str(out.num_cached_tokens),
                      f"{ttfts[-1] * 1000:.1f}")
    console.print(table)
    for line in answers:
        console.print(line, highlight=False)
    cold, warm = ttfts[0], statistics.median(ttfts[1:])
    s = llm.stats()
    queried = s["prefix_cache_queries"] - base["prefix_cache_queries"]
    hit = s["prefix_cache_hits"] - base["prefix_cache_hits"]
    console.print(f"cold TTFT {cold * 1000:.1f} ms, warm TTFT (median) {warm * 1000:.1f} ms: "
                  f"[bold]{cold / warm:.1f}x[/bold] faster; hit rate {hit / queried:.1%} "
                  f"({hit} of {queried} prompt tokens)")

    before = llm.stats()["prefill_tokens_computed"]
    burst_prompt = [{"role": "system", "content": system},
                    {"role": "user", "content": BURST_QUESTION}]
    # a fresh cache_salt: a namespace with nothing cached, so the burst starts cold
    outs = llm.chat([burst_prompt] * args.burst, params, cache_salt="demo-burst")
    computed = llm.stats()["prefill_tokens_computed"] - before
    n = len(outs[0].prompt_token_ids)
    console.print(f"burst of {args.burst} identical cold requests ({n} tokens each): "
                  f"{computed} prefill tokens computed, {computed / n:.2f}x one request "
                  f"(cached tokens {[o.num_cached_tokens for o in outs]})")
    console.print(f"[bold]burst[/bold] {BURST_QUESTION} -> {one_line(outs[0].outputs[0].text)}",
                  highlight=False)
    s = llm.stats()
    console.print(f"pages: {s['pages_total']} total, {s['pages_free']} free, "
                  f"{s['pages_cached']} cached, {s['pages_live']} live")
    return 0
