"""Forward-pass speed of PagedLlama against Hugging Face transformers (not a test).

Model: random Llama, hidden 512, 8 layers, 8 heads / 4 KV heads, intermediate 1408,
vocab 32000 (~56M parameters). Measures, in float32 (or --dtype) with --threads threads:
  * cold prefill of 2,048 tokens (tokens/s): ours (paged, shuffled pages, logits of the
    last token) vs HF (all-position logits, and logits_to_keep=1);
  * 64 new tokens over 1,984 cached ones (ms): ours vs HF over a precomputed DynamicCache;
  * one decode token over 2,048 (ms);
  * the same for ours in deterministic mode.
Runs are interleaved and repeated; the minimum is reported.

    PYTHONPATH=. .venv/bin/python scripts/model_forward_perf.py [--dtype bfloat16]
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from prefixcache.config import COMPUTE_BACKENDS  # noqa: E402
from prefixcache.model.config import ModelConfig  # noqa: E402
from prefixcache.model.deterministic import forward_deterministic  # noqa: E402
from prefixcache.model.forward_batch import ForwardBatch, SeqChunk  # noqa: E402
from prefixcache.model.llama import PagedLlama  # noqa: E402
from prefixcache.model.loader import make_backend  # noqa: E402
from prefixcache.model.weights import load_hf_weights  # noqa: E402


def batch_for(pages: list[int], start: int, end: int, bs: int) -> ForwardBatch:
    pos = torch.arange(start, end)
    table = torch.tensor(pages[:(end + bs - 1) // bs])
    slots = table[pos // bs] * bs + pos % bs
    ids = torch.randint(0, 32000, (end - start,), generator=torch.Generator().manual_seed(1))
    return ForwardBatch(ids, pos, slots, [SeqChunk(0, end - start, end, table)],
                        torch.tensor([end - start - 1]))


def timeit(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-deterministic", action="store_true")
    ap.add_argument("--compute-backend", default="auto", choices=COMPUTE_BACKENDS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.cache_utils import DynamicCache

    torch.manual_seed(0)
    hc = LlamaConfig(hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                     num_key_value_heads=4, intermediate_size=1408, vocab_size=32000,
                     max_position_embeddings=4096)
    hf = LlamaForCausalLM(hc).to(dtype).eval()
    cfg = ModelConfig.from_dict({**hc.to_dict(), "architectures": ["LlamaForCausalLM"]})
    ours = PagedLlama(cfg, "cpu", dtype, make_backend(args.compute_backend, "cpu", dtype))
    load_hf_weights(ours, hf.state_dict().__getitem__)
    bs, n, tail = 16, 2048, 64
    pages = list(range(n // bs + 8))
    random.Random(0).shuffle(pages)
    kv = ours.new_kv_pool(len(pages), bs)
    ids = torch.randint(0, 32000, (1, n), generator=torch.Generator().manual_seed(1))

    cold = batch_for(pages, 0, n, bs)
    cold.input_ids = ids[0]
    chunk = batch_for(pages, n - tail, n, bs)
    chunk.input_ids = ids[0, n - tail:]
    decode = batch_for(pages, n - 1, n, bs)
    decode.input_ids = ids[0, n - 1:]

    with torch.inference_mode():
        pre = hf(ids[:, :n - tail], use_cache=True)
        cache: DynamicCache = pre.cache

        def hf_chunk(keep=0):
            hf(ids[:, n - tail:], cache=cache, use_cache=True, logits_to_keep=keep)
            cache.crop(-tail)

        def hf_decode():
            hf(ids[:, n - 1:], cache=cache, use_cache=True)
            cache.crop(-1)

        runs = {
            "ours cold 2048": lambda: ours(cold, kv),
            "hf cold 2048 (all logits)": lambda: hf(ids, use_cache=False),
            "hf cold 2048 (logits_to_keep=1)": lambda: hf(ids, use_cache=False, logits_to_keep=1),
            "ours 64 over 1984": lambda: ours(chunk, kv),
            "hf 64 over 1984 (all logits)": lambda: hf_chunk(0),
            "hf 64 over 1984 (logits_to_keep=1)": lambda: hf_chunk(1),
        }
        if not args.no_deterministic:
            runs.update({"ours det cold 2048": lambda: forward_deterministic(ours, cold, kv),
                         "ours det 64 over 1984": lambda: forward_deterministic(ours, chunk, kv)})
        for fn in runs.values():  # warm up
            fn()
        wall: dict[str, list[float]] = {k: [] for k in runs}
        cpu: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(args.reps):  # interleaved, so drifting machine load hits all alike
            for name, fn in runs.items():
                w, c = time.perf_counter(), time.process_time()
                fn()
                wall[name].append(time.perf_counter() - w)
                cpu[name].append(time.process_time() - c)
        ours(cold, kv)  # decode runs over a filled 2,047-token context
        dec = {"ours decode @2048": lambda: ours(decode, kv), "hf decode @1985": hf_decode}
        if not args.no_deterministic:
            dec["ours det decode @2048"] = lambda: forward_deterministic(ours, decode, kv)
        for fn in dec.values():
            fn()
        for name in dec:
            wall[name], cpu[name] = [], []
        for _ in range(args.reps * 3):
            for name, fn in dec.items():
                w, c = time.perf_counter(), time.process_time()
                fn()
                wall[name].append(time.perf_counter() - w)
                cpu[name].append(time.process_time() - c)

    print(f"dtype={args.dtype} threads={args.threads} reps={args.reps} "
          f"(wall: min and median; cpu: median process CPU time, all threads)")
    for name in wall:
        w, c = sorted(wall[name]), sorted(cpu[name])
        extra = f"  {n / w[0]:6.0f} tok/s" if "cold" in name else ""
        print(f"{name:36s} wall {w[0] * 1e3:8.1f} / {w[len(w) // 2] * 1e3:8.1f} ms"
              f"  cpu {c[len(c) // 2] * 1e3:8.1f} ms{extra}")

    def ratio(a: str, b: str) -> str:
        r = sorted(x / y for x, y in zip(wall[a], wall[b]))
        return f"{r[len(r) // 2]:.2f}"

    print("median paired wall ratios (same rep, adjacent in time):")
    pairs = [("ours cold 2048", "hf cold 2048 (all logits)"),
             ("ours cold 2048", "hf cold 2048 (logits_to_keep=1)"),
             ("ours 64 over 1984", "hf 64 over 1984 (all logits)"),
             ("ours 64 over 1984", "hf 64 over 1984 (logits_to_keep=1)"),
             ("ours decode @2048", "hf decode @1985")]
    if not args.no_deterministic:
        pairs += [("ours det cold 2048", "ours cold 2048"),
                  ("ours det 64 over 1984", "ours 64 over 1984"),
                  ("ours det decode @2048", "ours decode @2048")]
    for a, b in pairs:
        print(f"  {a} / {b}: {ratio(a, b)}")


if __name__ == "__main__":
    main()
