"""``prefixcache generate --model M "prompt" ...``: offline generation from the shell."""
from __future__ import annotations

import argparse
import json

ENGINE_FLAGS = ("block_size", "num_pages", "max_num_batched_tokens", "max_num_seqs",
                "device", "dtype", "num_threads")


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Flags shared by every command that builds an engine."""
    p.add_argument("--model", default="builtin:tiny",
                   help="Hugging Face model directory or builtin:tiny (default)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV page")
    p.add_argument("--num-pages", type=int, default=None, help="KV pool size in pages")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="token budget of one step")
    p.add_argument("--max-num-seqs", type=int, default=64, help="most requests running")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    p.add_argument("--num-threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    p.add_argument("--deterministic", action="store_true",
                   help="batch-invariant arithmetic: cold and warm runs are bit-identical")


def engine_kwargs(args: argparse.Namespace) -> dict:
    kw = {k: getattr(args, k) for k in ENGINE_FLAGS}
    kw["enable_prefix_caching"] = not args.no_prefix_caching
    kw["deterministic"] = args.deterministic
    return kw


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("generate", help="generate completions for prompts")
    add_engine_args(p)
    p.add_argument("prompts", nargs="+", help="prompt texts (all batched together)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--chat", action="store_true", help="wrap each prompt as a user message")
    p.add_argument("--tenant", default=None)
    p.add_argument("--cache-salt", default=None)
    p.add_argument("--json", action="store_true", help="print one JSON object per output")
    return p


def run(args: argparse.Namespace) -> int:
    from prefixcache import LLM, SamplingParams

    llm = LLM(args.model, **engine_kwargs(args))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            top_p=args.top_p, top_k=args.top_k, seed=args.seed, stop=args.stop)
    if args.chat:
        outs = llm.chat([[{"role": "user", "content": p}] for p in args.prompts], params,
                        tenant=args.tenant, cache_salt=args.cache_salt)
    else:
        outs = llm.generate(args.prompts, params, tenant=args.tenant, cache_salt=args.cache_salt)
    for out in outs:
        c = out.outputs[0]
        if args.json:
            print(json.dumps({"prompt": out.prompt, "text": c.text, "token_ids": c.token_ids,
                              "finish_reason": c.finish_reason,
                              "prompt_tokens": len(out.prompt_token_ids),
                              "cached_tokens": out.num_cached_tokens, "ttft_s": out.ttft}))
        else:
            print(f"--- {len(out.prompt_token_ids)} prompt tokens, {out.num_cached_tokens} cached, "
                  f"TTFT {out.ttft * 1000:.1f} ms, finish={c.finish_reason}")
            print(c.text)
    return 0
