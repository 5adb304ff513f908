"""Resident memory, TPOT at concurrency 1 and greedy agreement per weight format on one
model (default: the registered Q4_1 GGUF model). Each format runs in its own process (so
resident memory is its own); one JSON line per format on stdout.

    python scripts/quantized_bench.py [--model NAME] [--tokens 64] [--formats auto,none,...]

A format is ``QUANTIZATION[/DTYPE]``: ``auto`` (the GGUF file's own layout), ``none``
(float32, the dequantized reference), ``int4``, ``int8``, ``none/bfloat16``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

PROMPTS = ["The capital of France is", "def fibonacci(n):\n",
           "Once upon a time, a little fox", "Write a short poem about the sea.",
           "Explain what a hash table is in one paragraph."]


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2 ** 20


def one(model: str, fmt: str, tokens: int, ref: str | None) -> dict:
    import torch

    from prefixcache import LLM, SamplingParams

    torch.set_num_threads(1)
    quant, _, dtype = fmt.partition("/")
    llm = LLM(model, quantization=quant, dtype=dtype or "float32", num_pages=64,
              num_threads=1)
    resident = rss_mb()
    p = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    llm.generate([PROMPTS[0]], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
    tpot, ids = [], []
    for prompt in PROMPTS:  # concurrency 1: one request at a time
        t0 = time.perf_counter()
        out = llm.generate([prompt], p)[0]
        m = out.metrics
        first = m.first_token_time if m and m.first_token_time else t0
        end = m.finished_time if m and m.finished_time else time.perf_counter()
        tpot.append((end - first) / max(1, len(out.outputs[0].token_ids) - 1) * 1e3)
        ids.append(out.outputs[0].token_ids)
    row = {"format": fmt, "resident_mb": round(resident, 1),
           "tpot_ms": [round(min(tpot), 2), round(statistics.median(tpot), 2),
                       round(max(tpot), 2)], "token_ids": ids}
    if ref:  # teacher-forced: this format's top-1 after each prefix of the float output
        agree = total = 0
        tok = llm.engine.tokenizer
        assert tok is not None
        for prompt, want in zip(PROMPTS, json.loads(open(ref).read())):
            start = len(tok.encode(prompt))
            out = llm.generate([{"prompt_token_ids": tok.encode(prompt) + want}],
                               SamplingParams(max_tokens=1, temperature=0.0,
                                              prompt_logprobs=1))[0]
            for pos, t in enumerate(want[1:], start + 1):
                d = out.prompt_logprobs[pos]
                top = max(d.items(), key=lambda kv: kv[1].logprob)[0]
                agree += top == t
                total += 1
        row["teacher_forced_top1_agreement_pct"] = round(100 * agree / total, 1)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct-q4_1")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--formats", default="none,auto,int4,int8,none/bfloat16")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--ref", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.model, args.one, args.tokens, args.ref)))
        return
    rows: list[dict] = []
    ref = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    for fmt in args.formats.split(","):  # "none" first: the others are compared with it
        extra = ["--ref", ref.name] if rows else []
        out = subprocess.run([sys.executable, __file__, "--model", args.model, "--tokens",
                              str(args.tokens), "--one", fmt, *extra], capture_output=True,
                             text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "token_ids"}),
              file=sys.stderr, flush=True)
        if len(rows) == 1:
            ref.write(json.dumps(rows[0]["token_ids"]))
            ref.close()
    ref = next((r for r in rows if r["format"] == "none"), rows[0])
    for r in rows:
        same = total = 0
        for a, b in zip(r["token_ids"], ref["token_ids"]):
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
            same += first  # positions before the first divergence
            total += len(a)
        r["greedy_same_prefix_pct"] = round(100 * same / total, 1)
    for r in rows:
        print(json.dumps({k: v for k, v in r.items() if k != "token_ids"}), flush=True)


if __name__ == "__main__":
    main()
