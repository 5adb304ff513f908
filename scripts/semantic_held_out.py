"""The semantic layer on its held-out near-miss set, at the default threshold.

    python scripts/semantic_held_out.py [--threads 1]

Reads ``tests/gateway/semantic/data/held_out_pairs.tsv`` (kind, text a, text b; every
kind but ``paraphrase`` is a near-miss) and, for each pair, stores text a's answer in a
fresh scope of ``SemanticCache(MiniLMEmbedder())`` (the default threshold and second
check) and looks up text b. Prints, per kind and in all, the pairs served, with a 95%
Wilson interval: for near-misses that is the false-hit rate, for paraphrases the hit rate.
Also printed: what the threshold alone would serve, and what the second check alone
accepts (whatever the cosine), so each part's share is visible.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from prefixcache.gateway.semantic.cache import DEFAULT_THRESHOLD, SemanticCache
from prefixcache.gateway.semantic.calibration import wilson
from prefixcache.gateway.semantic.embedder import MiniLMEmbedder
from prefixcache.gateway.semantic.verify import AcceptAll

ROOT = Path(__file__).resolve().parents[1]
HELD_OUT = ROOT / "tests" / "gateway" / "semantic" / "data" / "held_out_pairs.tsv"


def load(path: Path = HELD_OUT) -> list[tuple[str, str, str]]:
    """``(kind, a, b)`` rows of the held-out file (comment lines skipped)."""
    rows = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            kind, a, b = line.split("\t")
            rows.append((kind, a, b))
    return rows


def served(cache: SemanticCache, rows: list[tuple[str, str, str]]) -> list[bool]:
    """Whether b is answered with a's stored answer, each pair in its own scope."""
    out = []
    for i, (_, a, b) in enumerate(rows):
        scope = f"held-out-{i}".encode()
        cache.store(scope, a, a.encode())
        hit = cache.lookup(scope, b)
        out.append(hit is not None and hit.value == a.encode())
    return out


def _rate(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{k}/{n} = {100 * k / n:.1f}% (95% CI {100 * lo:.1f}-{100 * hi:.1f}%)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    rows = load()
    emb = MiniLMEmbedder(threads=args.threads)
    full = served(SemanticCache(emb), rows)
    cosine_only = served(SemanticCache(emb, verifier=AcceptAll()), rows)
    check = SemanticCache(emb).verifier
    check_only = [check.check(b, a).ok for _, a, b in rows]
    print(f"held-out set: {HELD_OUT.relative_to(ROOT)}, threshold {DEFAULT_THRESHOLD}")
    print("| kind | pairs | served (threshold + check) | threshold alone | check alone |")
    print("|---|---|---|---|---|")
    kinds = sorted({k for k, _, _ in rows} - {"paraphrase"})
    for name, pick in [*[(k, {k}) for k in kinds], ("all near-misses", set(kinds)),
                       ("paraphrase", {"paraphrase"})]:
        idx = [i for i, r in enumerate(rows) if r[0] in pick]
        n = len(idx)
        print(f"| {name} | {n} | {_rate(sum(full[i] for i in idx), n)} | "
              f"{sum(cosine_only[i] for i in idx)} | {sum(check_only[i] for i in idx)} |")
    leaked = [(k, a, b) for (k, a, b), s in zip(rows, full) if s and k != "paraphrase"]
    for k, a, b in leaked:
        print(f"FALSE HIT ({k}): {a!r} answered {b!r}")
    return 1 if leaked else 0


if __name__ == "__main__":
    raise SystemExit(main())
