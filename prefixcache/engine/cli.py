"""``prefixcache generate [--model M] "prompt" ...``: offline generation from the shell, on
the same default model as ``demo`` and ``serve`` (``DEFAULT_MODEL``).

Each prompt is sent as a user message through the model's chat template when it has one
(as ``ollama run`` does: an instruct model answers); ``--raw`` sends the text as is.
``--chat`` (the default now) is kept for old command lines."""
from __future__ import annotations

import argparse
import dataclasses
import json

from prefixcache.engine.args import add_engine_args, config_from_args
from prefixcache.model.registry import DEFAULT_MODEL


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("generate", help="generate completions for prompts")
    p.add_argument("prompts", nargs="+", help="prompt texts (all batched together)")
    add_engine_args(p.add_argument_group("engine"), defaults={"model": DEFAULT_MODEL})
    s = p.add_argument_group("sampling")
    s.add_argument("--max-tokens", type=int, default=32, metavar="TOKENS",
                   help="output tokens per prompt (tokens); default: 32")
    s.add_argument("--temperature", type=float, default=0.0,
                   help="softmax temperature (0 is greedy); default: 0")
    s.add_argument("--top-p", type=float, default=1.0,
                   help="nucleus probability mass (0-1]; default: 1.0")
    s.add_argument("--top-k", type=int, default=0, metavar="TOKENS",
                   help="most likely tokens kept (0 keeps every token); default: 0")
    s.add_argument("--sampling-seed", type=int, default=None,
                   help="seed of each request's own generator (default: the engine's, --seed)")
    s.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    o = p.add_argument_group("requests and output")
    mode = o.add_mutually_exclusive_group()
    mode.add_argument("--chat", action="store_true",
                      help="send each prompt as a user message through the chat template "
                           "(the default when the model has a template)")
    mode.add_argument("--raw", action="store_true",
                      help="send each prompt as is, without the chat template")
    o.add_argument("--tenant", default=None,
                   help="cache namespace of these requests (default: none, the shared one)")
    o.add_argument("--cache-salt", default=None, help="further per-request cache namespace")
    o.add_argument("--json", action="store_true", help="print one JSON object per output")
    return p


def run(args: argparse.Namespace) -> int:
    from prefixcache.engine.llm import LLM
    from prefixcache.sampling_params import SamplingParams

    llm = LLM(**dataclasses.asdict(config_from_args(args)))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            top_p=args.top_p, top_k=args.top_k, seed=args.sampling_seed,
                            stop=args.stop)
    has_template = bool(getattr(llm.tokenizer, "chat_template", None))
    if args.chat and not has_template:
        raise ValueError("--chat: this model has no chat template; send the text with --raw")
    if has_template and not args.raw:
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
                  f"TTFT {_ms(out.ttft)}, finish={c.finish_reason}")
            print(c.text)
    return 0


def _ms(seconds: float | None) -> str:
    """A duration for display: milliseconds, or ``-`` when there is none."""
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"
