"""Paired A/B of whole prefill steps: the packed linears' row pieces (the default) against
one oneDNN call per step's rows (what every distinct step size cost a kernel in oneDNN's
caches before).

    python scripts/packed_rows_ab.py smollm2-135m-instruct-q4_1 3 45/1024 777/777 2047/2047

Arguments: the model, the paired rounds, then ``new/ctx`` prefill cases (``new`` tokens
after ``ctx - new`` cached ones). Prints one JSON row per case: step seconds of each arm
and the ratio ``one_call / pieces`` of each round (> 1: the pieces are faster).
"""
from __future__ import annotations

import json
import sys
from functools import partial

import torch

from prefixcache.bench.decode_perf import _paired, _prefill_step
from prefixcache.model import packed_linear
from prefixcache.model.loader import load_model


def main() -> None:
    torch.set_num_threads(1)
    model = load_model(sys.argv[1], "cpu", torch.float32).model
    pieces = packed_linear.row_pieces

    def run(b, kv, on: bool) -> None:
        packed_linear.row_pieces = pieces if on else (lambda rows: [(0, rows, rows)])
        model(b, kv)

    with torch.inference_mode():
        for case in sys.argv[3:]:
            new, ctx = (int(v) for v in case.split("/"))
            b, kv = _prefill_step(model, new, ctx, 16)
            row = {"new": new, "ctx": ctx,
                   **_paired(partial(run, b, kv, True), partial(run, b, kv, False),
                             int(sys.argv[2]), ("pieces", "one_call"))}
            print(json.dumps(row), flush=True)
            del kv
    packed_linear.row_pieces = pieces


if __name__ == "__main__":
    main()
