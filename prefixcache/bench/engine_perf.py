"""``prefixcache bench-engine``: engine-level figures, measured side by side in one run.

Suites (``--suite``, repeatable; default all):

* ``prefill``: on a ~60M Llama (hidden 512, 8 layers, 8 heads, 4 KV heads,
  intermediate 1408, vocab 32000, random weights), the cold prefill of 2,048 tokens, ours
  (TTFT of a ``max_tokens=1`` request, prefix caching off) against transformers' forward
  of the same tokens (all logits, and ``logits_to_keep=1``); and the TTFT of a request
  whose first 1,984 tokens are cached against transformers' forward of its 64 new tokens
  over a precomputed cache (``DynamicCache``, cropped back after each run).
* ``cold-burst``: 8 identical cold 2,048-token requests at once against one
  alone: prefill tokens computed and time until the last first token, as ratios.
* ``decode``: TPOT against context for 1 and 8 sequences (ours, transformers
  with and without its KV cache), the engine's per-step host overhead breakdown, the
  single-sequence step against the weight-bandwidth bound; see
  :mod:`prefixcache.bench.decode_perf`. Writes ``tpot_vs_context.png`` beside the JSON.
* ``deterministic``: throughput of a mixed workload with ``deterministic=True``
  against the default mode, and the largest |Δ logit| between a warm and a cold run in the
  default mode (exactly 0 in deterministic mode).

Timings are medians of interleaved repeats after a warm-up; ratios compare runs made
in the same process, minutes apart at most. Results go to ``--out`` as JSON and Markdown.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from prefixcache.bench import decode_perf, decode_report
from prefixcache.engine.args import add_engine_args
from prefixcache.model.registry import DEFAULT_MODEL

RANDOM_MODEL = "llama-60m-random"
RANDOM_MODEL_NAME = "Llama ~60M random (hidden 512, 8 layers, 8/4 heads, 1408, vocab 32000)"
BENCH_CONFIG: dict[str, Any] = dict(
    hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
    num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5,
    tie_word_embeddings=False)


def bench_model_dir(root: Path) -> Path:
    """Save (once) the random-weight ~60M Llama used by these benchmarks."""
    import transformers

    path = root / RANDOM_MODEL
    if not (path / "config.json").exists():
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**BENCH_CONFIG))
        model.save_pretrained(path)
    return path


def _median_interleaved(fns: dict, repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            times[k].append(fn())
    return {k: statistics.median(v) for k, v in times.items()}


def _tokens(n: int, seed: int, vocab: int = 32000) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab, (n,), generator=g).tolist()


def _vocab_size(model_dir: Path) -> int:
    """Token ids drawn for prompts stay below this (32000, or a smaller model's vocab)."""
    return min(32000, int(json.loads((model_dir / "config.json").read_text())["vocab_size"]))


def suite_prefill(model_dir: Path, dtype: str, repeats: int) -> dict:
    import transformers

    from prefixcache.engine.llm import LLM
    from prefixcache.sampling_params import SamplingParams

    one = SamplingParams(max_tokens=1, temperature=0.0)
    cold_llm = LLM(str(model_dir), dtype=dtype, num_pages=512, enable_prefix_caching=False)
    warm_llm = LLM(str(model_dir), dtype=dtype, num_pages=2048)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=getattr(torch, dtype)).eval()
    vocab = _vocab_size(model_dir)
    prompt = _tokens(2048, 1, vocab)
    counter = iter(range(10 ** 6))

    def ours_cold():
        return cold_llm.generate([{"prompt_token_ids": prompt}], one)[0].ttft

    def ours_warm():
        # fresh 1,984 cached tokens each run: a new prefix, published, then extended
        i = next(counter)
        p = _tokens(1984, 1000 + i, vocab) + _tokens(64, 5000 + i, vocab)
        warm_llm.generate([{"prompt_token_ids": p[:1984] + [7]}], one)
        out = warm_llm.generate([{"prompt_token_ids": p}], one)[0]
        assert out.num_cached_tokens == 1984, out.num_cached_tokens
        return out.ttft

    ids = torch.tensor([prompt])

    @torch.no_grad()
    def hf_cold():
        t = time.perf_counter()
        hf(ids)
        return time.perf_counter() - t

    @torch.no_grad()
    def hf_cold_last():
        t = time.perf_counter()
        hf(ids, logits_to_keep=1)
        return time.perf_counter() - t

    with torch.no_grad():
        out = hf(ids[:, :1984], use_cache=True)
        cache = getattr(out, "cache", None) or out.past_key_values

    @torch.no_grad()
    def hf_warm():
        t = time.perf_counter()
        hf(ids[:, 1984:], cache=cache, use_cache=True, logits_to_keep=1)
        dt = time.perf_counter() - t
        cache.crop(-64)  # transformers 5: a negative count of tokens to remove
        return dt

    fns = dict(ours_cold=ours_cold, hf_cold_all_logits=hf_cold, hf_cold_last_logits=hf_cold_last,
               ours_warm_1984_64=ours_warm, hf_64_over_1984=hf_warm)
    _median_interleaved(fns, 1)  # warm-up
    t = _median_interleaved(fns, repeats)
    return {
        "seconds": t,
        "ours_cold_tok_s": 2048 / t["ours_cold"],
        "hf_cold_tok_s": 2048 / t["hf_cold_all_logits"],
        "hf_cold_last_logits_tok_s": 2048 / t["hf_cold_last_logits"],
        "cold_prefill_ratio_vs_hf": t["hf_cold_all_logits"] / t["ours_cold"],
        "cold_prefill_ratio_vs_hf_last_logits": t["hf_cold_last_logits"] / t["ours_cold"],
        "warm_ttft_over_hf_64": t["ours_warm_1984_64"] / t["hf_64_over_1984"],
        "ours_cold_over_warm": t["ours_cold"] / t["ours_warm_1984_64"],
        "goals": {"cold prefill >= 1.0x transformers tok/s":
                  t["hf_cold_all_logits"] / t["ours_cold"] >= 1.0,
                  "warm TTFT <= 1.15x transformers 64 over cache":
                  t["ours_warm_1984_64"] / t["hf_64_over_1984"] <= 1.15},
    }


def suite_cold_burst(model_dir: Path, dtype: str, repeats: int, n: int = 8,
                     prompt_len: int = 2048) -> dict:
    from prefixcache.engine.llm import LLM
    from prefixcache.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0)
    single, burst = [], []
    computed_single = computed_burst = 0.0  # stats() values are int | float
    for r in range(repeats + 1):
        prompt = _tokens(prompt_len, 100 + r, _vocab_size(model_dir))
        llm = LLM(str(model_dir), dtype=dtype, num_pages=1024)
        before = llm.stats()["prefill_tokens_computed"]
        t0 = time.perf_counter()
        llm.generate([{"prompt_token_ids": prompt}], params)
        one = time.perf_counter() - t0
        computed_single = llm.stats()["prefill_tokens_computed"] - before
        llm.reset_prefix_cache()
        before = llm.stats()["prefill_tokens_computed"]
        t0 = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": prompt}] * n, params)
        firsts = [o.metrics.first_token_time if o.metrics else None for o in outs]
        assert all(f is not None for f in firsts), "a burst request produced no token"
        last_first_token = max(f for f in firsts if f is not None) - t0
        computed_burst = llm.stats()["prefill_tokens_computed"] - before
        if r:  # the first round warms up
            single.append(one)
            burst.append(last_first_token)
    s, b = statistics.median(single), statistics.median(burst)
    return {"requests": n, "prompt_tokens": prompt_len,
            "prefill_tokens_single": computed_single, "prefill_tokens_burst": computed_burst,
            "compute_ratio": computed_burst / computed_single,
            "ttft_single_s": s, "last_first_token_burst_s": b, "time_ratio": b / s,
            "goals": {"compute <= 1.1x one request": computed_burst / computed_single <= 1.1,
                      "last first token <= 1.3x single TTFT": b / s <= 1.3}}


def suite_deterministic(model_dir: Path, dtype: str, repeats: int) -> dict:
    from prefixcache.engine.llm import LLM
    from prefixcache.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    vocab = _vocab_size(model_dir)
    prompts = [{"prompt_token_ids": _tokens(200 + 37 * i, 300 + i, vocab)} for i in range(8)]
    rates = {}
    for det in (False, True):
        llm = LLM(str(model_dir), dtype=dtype, num_pages=1024, enable_prefix_caching=False,
                  deterministic=det)
        llm.generate(prompts[:2], params)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params)
            times.append(time.perf_counter() - t0)
        toks = sum(len(p["prompt_token_ids"]) + len(o.outputs[0].token_ids)
                   for p, o in zip(prompts, outs))
        rates["deterministic" if det else "default"] = toks / statistics.median(times)

    deltas = {}
    for det in (False, True):
        llm = LLM(str(model_dir), dtype=dtype, num_pages=1024, deterministic=det)
        captured: list[torch.Tensor] = []
        real = llm.engine.runner.forward  # the step's forward function (either mode)

        def capture(batch, kv, real=real, captured=captured):
            logits = real(batch, kv)
            captured.append(logits.detach().clone())
            return logits

        llm.engine.runner.forward = capture
        prompt = _tokens(1000, 7, vocab)
        one = SamplingParams(max_tokens=1, temperature=0.0)
        llm.generate([{"prompt_token_ids": prompt}], one)
        cold = captured[-1][-1]
        llm.generate([{"prompt_token_ids": prompt}], one)  # 992 tokens cached
        warm = captured[-1][-1]
        deltas["deterministic" if det else "default"] = float((cold - warm).abs().max())
    return {"tokens_per_s": rates,
            "deterministic_over_default_throughput": rates["deterministic"] / rates["default"],
            "max_abs_dlogit_warm_vs_cold": deltas}


SUITES = {"prefill": suite_prefill, "cold-burst": suite_cold_burst,
          "deterministic": suite_deterministic, "decode": decode_perf.suite_decode}


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("bench-engine", help="engine figures: prefill vs transformers, "
                       "cold burst, deterministic mode cost")
    p.add_argument("--suite", action="append", choices=sorted(SUITES),
                   help="suite to run (repeatable; default all)")
    p.add_argument("--model", default=DEFAULT_MODEL, metavar="NAME|DIR",
                   help="a registered name, a .gguf file, a Hugging Face model directory, "
                        f"or {RANDOM_MODEL} (the random ~60M Llama, saved once under "
                        f"--model-cache); default: {DEFAULT_MODEL}")
    add_engine_args(p, include=("dtype",))
    p.add_argument("--threads", type=int, default=2,
                   help="torch CPU threads of every engine measured; default: 2")
    p.add_argument("--repeats", type=int, default=3, help="measurements per figure (runs)")
    p.add_argument("--model-cache", default=str(Path.home() / ".cache" / "prefixcache"),
                   help="where the random benchmark model is saved once")
    p.add_argument("--out", default="benchmarks/decode/raw",
                   help="directory for engine.json / engine.md")
    return p


def run(args: argparse.Namespace) -> int:
    if args.model == RANDOM_MODEL:
        model_dir, model_name = bench_model_dir(Path(args.model_cache)), RANDOM_MODEL_NAME
    else:
        from prefixcache.model.registry import model_dir as resolve_dir

        # a registered name or a .gguf file: its converted float32 copy, which
        # transformers reads too
        model_dir, model_name = resolve_dir(args.model), args.model
        if not (model_dir / "config.json").is_file():
            raise FileNotFoundError(f"--model: no config.json in {model_dir}")
    torch.set_num_threads(args.threads)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results_path = out_dir / "engine.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    meta = {"model": model_name,
            "dtype": args.dtype, "threads": args.threads, "machine": platform.machine(),
            "processor": platform.processor() or "unknown", "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d")}
    for name in args.suite or list(SUITES):
        print(f"running {name} ...", flush=True)
        res = SUITES[name](model_dir, args.dtype, args.repeats)
        res["meta"] = meta
        results[name] = res
        print(json.dumps(res, indent=2))
    results_path.write_text(json.dumps(results, indent=2))
    if "decode" in results:
        decode_report.plot_tpot(results["decode"], out_dir / "tpot_vs_context.png",
                                decode_report.server_series(out_dir))
    (out_dir / "engine.md").write_text(render_markdown(results))
    return 0


def render_markdown(results: dict) -> str:
    lines = ["# Engine benchmarks (`prefixcache bench-engine`)", ""]
    if "prefill" in results:
        r = results["prefill"]
        m, t = r["meta"], r["seconds"]
        lines += [f"## Prefill against transformers ({m['model']}, {m['dtype']}, "
                  f"{m['threads']} threads, {m['date']})", "",
                  "| measurement | ours | transformers | ratio |", "|---|---|---|---|",
                  f"| cold prefill 2,048 tokens (tok/s) | {r['ours_cold_tok_s']:.0f} | "
                  f"{r['hf_cold_tok_s']:.0f} (all logits) / {r['hf_cold_last_logits_tok_s']:.0f} "
                  f"(last logits) | {r['cold_prefill_ratio_vs_hf']:.2f}x / "
                  f"{r['cold_prefill_ratio_vs_hf_last_logits']:.2f}x |",
                  f"| 64 new tokens over 1,984 cached (ms) | {t['ours_warm_1984_64'] * 1e3:.1f} | "
                  f"{t['hf_64_over_1984'] * 1e3:.1f} | {r['warm_ttft_over_hf_64']:.2f}x |",
                  f"| cold / warm TTFT (ours) | {r['ours_cold_over_warm']:.1f}x | | |", ""]
    if "cold-burst" in results:
        r = results["cold-burst"]
        lines += [f"## Cold burst: {r['requests']} identical cold {r['prompt_tokens']}-token "
                  "requests at once", "",
                  "| measurement | one request | burst | ratio | goal |", "|---|---|---|---|---|",
                  f"| prefill tokens computed | {r['prefill_tokens_single']} | "
                  f"{r['prefill_tokens_burst']} | {r['compute_ratio']:.3f}x | <= 1.1x |",
                  f"| time to (last) first token | {r['ttft_single_s']:.3f} s | "
                  f"{r['last_first_token_burst_s']:.3f} s | {r['time_ratio']:.2f}x | <= 1.3x |", ""]
    if "deterministic" in results:
        r = results["deterministic"]
        lines += ["## Deterministic mode", "",
                  f"- throughput, deterministic / default: "
                  f"{r['deterministic_over_default_throughput']:.2f}x "
                  f"({r['tokens_per_s']['deterministic']:.0f} vs "
                  f"{r['tokens_per_s']['default']:.0f} tokens/s, 8 requests, 200-459 prompt "
                  "tokens, 16 output tokens each)",
                  f"- largest |Δ logit| warm vs cold (992 of 1,000 tokens cached): default "
                  f"{r['max_abs_dlogit_warm_vs_cold']['default']:.2e}, deterministic "
                  f"{r['max_abs_dlogit_warm_vs_cold']['deterministic']:.2e}", ""]
    if "decode" in results:
        lines += decode_report.render_markdown(results["decode"], results["decode"]["meta"])
    return "\n".join(lines)
