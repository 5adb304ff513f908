"""Peak and steady resident memory of a model load, each case in its own process.

    python scripts/load_memory.py [--model NAME] [--cases auto,builtin,...] [--cold]

A case is ``QUANTIZATION[/DTYPE]`` on ``--model`` or ``builtin`` (``builtin:tiny``, the
runtime without weights). Per case, one JSON line: ``steady_mb`` (RSS after ``LLM(...)``
returned and one short request ran, ``num_pages=64``), ``peak_mb`` (the process's
``ru_maxrss``), ``load_s``, and ``weight_mb`` (bytes of the model's weight tensors: float
parameters plus quantized layers and embedding codes). ``--cold`` points
``PREFIXCACHE_CACHE_DIR`` at an empty directory (a first load: the GGUF cache is built).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2 ** 20


def one(model: str, case: str) -> dict:
    import resource
    import time

    import torch

    from prefixcache import LLM, SamplingParams

    torch.set_num_threads(1)
    quant, _, dtype = case.partition("/")
    name = "builtin:tiny" if quant == "builtin" else model
    t0 = time.perf_counter()
    llm = LLM(name, quantization="auto" if quant == "builtin" else quant,
              dtype=dtype or "float32", num_pages=64, num_threads=1)
    load_s = time.perf_counter() - t0
    llm.generate(["The capital of France is"], SamplingParams(max_tokens=4, temperature=0.0))
    net = llm.engine.loaded.model
    held = sum(p.numel() * p.element_size() for p in net.parameters()
               if p.device.type != "meta")  # meta: a shape replaced by a quantized layer
    for h in [*(x for layer in net.decoder_layers for x in layer.linears()), net._lm_head]:
        held += getattr(h, "nbytes", 0)
    if net.embed_codes is not None:
        c = net.embed_codes
        held += c.codes.nbytes + c.scale.nbytes + c.offset.nbytes
    return {"case": case, "steady_mb": round(rss_mb(), 1),
            "peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "load_s": round(load_s, 1), "weight_mb": round(held / 2 ** 20, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct-q4_1")
    ap.add_argument("--cases", default="builtin,auto,none,int4,int8")
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.model, args.one)), flush=True)
        return
    for case in args.cases.split(","):
        env = dict(os.environ)
        with tempfile.TemporaryDirectory() as tmp:
            if args.cold:
                env["PREFIXCACHE_CACHE_DIR"] = tmp
            out = subprocess.run([sys.executable, __file__, "--model", args.model,
                                  "--one", case], env=env, capture_output=True, text=True)
            if out.returncode:
                print(json.dumps({"case": case, "error": out.stderr[-2000:]}), flush=True)
                continue
            print(out.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
