"""``prefixcache analyze LOG...``: what a request log would hit, where it breaks the
cache, and what it costs, with no model run.

Examples:

    prefixcache analyze requests.jsonl
    prefixcache analyze --tokenizer qwen2 --block-size 64 \\
        ../shared/data/agent_trajectories/mini-swe-agent/deepseek_pr816/*.traj.json \\
        --json report.json --plots plots/
    prefixcache analyze log.jsonl --capacity-bytes 40e9 --model-config path/to/model \\
        --prices openai:gpt-4o --prices anthropic --prices my_sheet.json
    prefixcache analyze log.jsonl --prices openai --price-model my-finetune=gpt-4.1-mini
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from prefixcache.analyze.encode import TEMPLATE_MODES
from prefixcache.analyze.logs import FORMATS


def _int(text: str) -> int:
    """Integers, also written as ``4e9`` or ``4_000_000``."""
    try:
        v = float(text.replace("_", "")) if any(c in text for c in "eE._") else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if v != int(v):
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    return int(v)


def _pos_int(text: str) -> int:
    v = _int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return v


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "analyze", help="replay a request log through the prefix cache; hit rates, "
        "cache breakers and cost", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logs", nargs="+", metavar="LOG", help="log files: JSONL of OpenAI "
                   "request bodies, SWE-agent .traj, mini-swe-agent .traj.json, oasst1 "
                   "trees (JSONL) or ShareGPT conversations (JSON)")
    p.add_argument("--format", choices=FORMATS, default="auto",
                   help="log format (auto: from each file's name and first record)")
    p.add_argument("--tokenizer", default="approx", metavar="PATH",
                   help="tokenizer.json, a tokenizer folder, 'qwen2'/'gpt2' (shared data), "
                   "'approx' (default: no file; BPE-like counts) or 'bytes'")
    p.add_argument("--template", choices=TEMPLATE_MODES, default="auto",
                   help="chat rendering: the tokenizer's chat template if it renders every "
                   "message (auto), always builtin ChatML, or always the tokenizer's")
    p.add_argument("--block-size", type=_pos_int, default=16, metavar="N",
                   help="tokens per page")
    cap = p.add_mutually_exclusive_group()
    cap.add_argument("--capacity-tokens", type=_pos_int, metavar="N",
                     help="cache capacity in tokens (default: unlimited)")
    cap.add_argument("--capacity-bytes", type=_pos_int, metavar="N",
                     help="cache capacity in bytes (needs --kv-bytes-per-token or "
                     "--model-config)")
    p.add_argument("--kv-bytes-per-token", type=_pos_int, metavar="BYTES",
                   help="KV cache bytes per token, for --capacity-bytes and the cost "
                   "(default: none; from --model-config)")
    p.add_argument("--model-config", metavar="PATH",
                   help="a model's config.json (or folder): KV bytes per token from it")
    p.add_argument("--kv-dtype", default=None, help="KV dtype for --model-config "
                   "(default: the config's dtype, else bfloat16)")
    p.add_argument("--ttl", type=float, metavar="SECONDS",
                   help="expire cached pages idle this long, seconds (needs timestamps; "
                   "default: never)")
    p.add_argument("--no-responses", action="store_true",
                   help="do not publish recorded responses after their prompts")
    p.add_argument("--prices", action="append", metavar="NAME|PATH[:MODEL]",
                   help="price sheet (repeatable): openai, anthropic, deepseek, gemini, "
                   "self-hosted, a JSON file, or 'all' (default); :MODEL prices every "
                   "request at that row instead of its own model's")
    p.add_argument("--price-model", action="append", metavar="LOG_MODEL=SHEET_MODEL",
                   help="price requests of LOG_MODEL at the sheet's SHEET_MODEL row "
                   "(repeatable; default: each request's own model when the sheet has it, "
                   "else the sheet's default row, named in the report)")
    p.add_argument("--no-cost", action="store_true", help="skip the cost report")
    p.add_argument("--accelerator-hour", type=float, metavar="USD",
                   help="self-hosted: accelerator price per hour")
    p.add_argument("--prefill-tps", type=float, metavar="N",
                   help="self-hosted: measured prefill tokens per second")
    p.add_argument("--decode-tps", type=float, metavar="N",
                   help="self-hosted: measured decode tokens per second")
    p.add_argument("--top-breakers", type=int, default=10, metavar="K",
                   help="cache breakers listed (requests)")
    p.add_argument("--no-sweeps", action="store_true",
                   help="skip the block-size and capacity sweeps")
    p.add_argument("--calls", nargs="?", type=int, const=-1, default=0, metavar="N",
                   help="print the per-call table (first N calls; all without N)")
    p.add_argument("--json", metavar="PATH", help="write the full report as JSON")
    p.add_argument("--plots", metavar="DIR", help="write PNG plots into DIR")
    p.add_argument("--quiet", action="store_true", help="no terminal report")
    return p


def _overrides(args) -> dict | None:
    o = {}
    if args.accelerator_hour is not None:
        o["accelerator_hour"] = args.accelerator_hour
    if args.prefill_tps is not None:
        o["prefill_tokens_per_second"] = args.prefill_tps
    if args.decode_tps is not None:
        o["decode_tokens_per_second"] = args.decode_tps
    if o:
        o.pop("input", None)
    return o or None


def _capacity_error(args, cap: int, kv: int | None) -> str:
    """The capacity-below-one-page error, in the user's own flags."""
    if args.capacity_tokens is not None:
        asked = f"--capacity-tokens {args.capacity_tokens}"
    else:
        asked = (f"--capacity-bytes {args.capacity_bytes} at {kv} KV bytes per token "
                 f"({cap} tokens)")
    return f"{asked} is less than one page (--block-size {args.block_size})"


def run(args) -> int:
    from prefixcache.analyze.analysis import AnalyzeOptions, analyze_requests
    from prefixcache.analyze.capacity import capacity_tokens, kv_bytes_per_token_from_config
    from prefixcache.analyze.logs import LogFormatError, load_logs
    from prefixcache.analyze.model_rows import check_model_map, parse_model_map
    from prefixcache.analyze.pricing import PriceSheetError, load_price_specs
    from prefixcache.text.chat_template import ChatTemplateError
    from prefixcache.text.loading import TokenizerError, load_tokenizer

    def fail(msg: str) -> int:
        print(f"prefixcache analyze: error: {msg}", file=sys.stderr)
        return 2

    try:
        kv = args.kv_bytes_per_token
        if args.model_config:
            kv = kv_bytes_per_token_from_config(args.model_config, args.kv_dtype)
        cap = capacity_tokens(args.capacity_tokens, args.capacity_bytes, kv)
        if cap is not None and cap < args.block_size:
            return fail(_capacity_error(args, cap, kv))
        overrides = _overrides(args)
        price_models = parse_model_map(args.price_model)
        if not args.no_cost:  # fail early on a bad sheet or mapping
            check_model_map(price_models, [s for s, _ in load_price_specs(args.prices)])
        requests = load_logs(args.logs, args.format)
        if not requests:
            return fail("the log holds no requests")
        tokenizer = load_tokenizer(args.tokenizer)
        opts = AnalyzeOptions(
            block_size=args.block_size, capacity_tokens=cap, kv_bytes_per_token=kv,
            publish_responses=not args.no_responses, ttl_seconds=args.ttl,
            template=args.template, prices=args.prices, price_overrides=overrides,
            price_models=price_models,
            top_breakers=args.top_breakers, sweeps=not args.no_sweeps,
            costs=not args.no_cost, inputs=[str(x) for x in args.logs])
        report = analyze_requests(requests, tokenizer, opts)
    except (OSError, ValueError, LogFormatError, TokenizerError, PriceSheetError,
            ChatTemplateError) as exc:
        return fail(str(exc))
    if not args.quiet:
        from prefixcache.analyze.table import print_report

        print_report(report, calls=None if args.calls == -1 else args.calls)
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n",
                        encoding="utf-8")
    if args.plots:
        from prefixcache.analyze.plots import write_plots

        for p in write_plots(report, args.plots):
            if not args.quiet:
                print(f"wrote {p}")
    return 0
