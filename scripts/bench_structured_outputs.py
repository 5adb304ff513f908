"""Cost of structured outputs on one model: TPOT with and without a grammar, and the
compile time of the grammars.

* ``compile``: each schema compiled by a fresh grammar engine (a cache miss), ``--rounds``
  times; also the engine's one-time vocabulary read (``GrammarEngine`` construction).
* ``tpot``: one request at a time, greedy, the same chat prompt: first under the JSON
  schema (it stops where the value ends, ``K`` tokens), then unconstrained with
  ``max_tokens=K`` and ``ignore_eos``, so both decode the same number of tokens. A/B
  interleaved, ``--rounds`` rounds after one warm-up pair. The prompt's pages are cached
  after the first run (both arms hit equally); TPOT = (last token - first token) / (K - 1).
* ``mask``: the per-step work the grammar adds, alone: filling one request's bitmask and
  applying it to one row of logits (``--mask-reps`` repetitions).

    python scripts/bench_structured_outputs.py --rounds 5 --out benchmarks/structured_outputs/raw
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from prefixcache import LLM, SamplingParams  # noqa: E402
from prefixcache.model import registry  # noqa: E402
from prefixcache.model.grammar import (  # noqa: E402
    GrammarEngine,
    allocate_bitmask,
    apply_bitmask,
)
from prefixcache.sampling_params import StructuredOutputsParams  # noqa: E402

SCHEMAS = {
    "city": {"type": "object", "properties": {"city": {"type": "string"},
                                              "country": {"type": "string"}},
             "required": ["city", "country"]},
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "format": "email"},
        "hobbies": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "address": {"type": "object", "properties": {
            "street": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["street", "zip"]}},
        "required": ["name", "age", "hobbies", "address"]},
}
PROMPT = ("Give a JSON object describing a fictional person with the keys name, age, "
          "email, hobbies and address (street, zip). Reply with JSON only.")


def summary(xs: list[float]) -> dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "n": len(xs)}


def bench_compile(llm: LLM, rounds: int) -> dict:
    eng = llm.engine
    out: dict = {"engine_init_s": []}
    for _ in range(rounds):
        t0 = time.perf_counter()
        fresh = GrammarEngine(eng.tokenizer, eng.model_config.vocab_size,
                              eng.outputs.eos_token_ids, max_threads=torch.get_num_threads())
        out["engine_init_s"].append(time.perf_counter() - t0)
        for name, schema in SCHEMAS.items():
            for kind, spec in (("json", StructuredOutputsParams(json=schema)),):
                t0 = time.perf_counter()
                fresh.compile(spec)
                out.setdefault(f"{kind}:{name}_s", []).append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        fresh.compile(StructuredOutputsParams(json=SCHEMAS["person"]))  # a cache hit
        out.setdefault("cache_hit_s", []).append(time.perf_counter() - t0)
    return {k: summary(v) for k, v in out.items()}


def _tpot(out) -> float:
    m, n = out.metrics, len(out.outputs[0].token_ids)
    return (m.last_token_time - m.first_token_time) / (n - 1)


def bench_tpot(llm: LLM, rounds: int) -> dict:
    ids = llm.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}])
    spec = StructuredOutputsParams(json=SCHEMAS["person"])
    res: dict[str, list[float]] = {"schema": [], "none": [], "tokens": []}
    for r in range(rounds + 1):  # round 0 warms up
        a = llm.generate({"prompt_token_ids": ids}, SamplingParams(
            max_tokens=256, temperature=0.0, structured_outputs=spec))[0]
        k = len(a.outputs[0].token_ids)
        b = llm.generate({"prompt_token_ids": ids}, SamplingParams(
            max_tokens=k, temperature=0.0, ignore_eos=True))[0]
        assert a.outputs[0].finish_reason == "stop" and len(b.outputs[0].token_ids) == k
        if r:
            res["schema"].append(_tpot(a) * 1e3)
            res["none"].append(_tpot(b) * 1e3)
            res["tokens"].append(k)
    ratio = [s / n for s, n in zip(res["schema"], res["none"])]
    return {"schema_tpot_ms": summary(res["schema"]), "none_tpot_ms": summary(res["none"]),
            "ratio_schema_over_none": summary(ratio), "tokens": res["tokens"]}


def bench_mask(llm: LLM, reps: int) -> dict:
    eng = llm.engine
    vocab = eng.model_config.vocab_size
    m = eng.grammar.matcher(StructuredOutputsParams(json=SCHEMAS["person"]))
    m.advance(llm.tokenizer.encode('{"name": "Ada', add_special_tokens=False))
    bitmask = allocate_bitmask(1, vocab)
    logits = torch.randn(1, vocab)
    fill, apply = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        m.fill_bitmask(bitmask, 0)
        t1 = time.perf_counter()
        apply_bitmask(logits, bitmask, [0])
        fill.append((t1 - t0) * 1e6)
        apply.append((time.perf_counter() - t1) * 1e6)
    return {"fill_bitmask_us": summary(fill), "apply_bitmask_us": summary(apply)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=registry.DEFAULT_MODEL)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mask-reps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=None, help="torch threads")
    ap.add_argument("--out", type=Path, default=None, help="folder for results.json")
    args = ap.parse_args()
    llm = LLM(args.model, block_size=16, num_pages=256, num_threads=args.threads)
    result = {
        "model": args.model, "rounds": args.rounds, "threads": torch.get_num_threads(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "python": platform.python_version(), "torch": torch.__version__,
        "compile": bench_compile(llm, args.rounds),
        "tpot": bench_tpot(llm, args.rounds),
        "mask": bench_mask(llm, args.mask_reps),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
