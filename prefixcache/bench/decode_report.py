"""Rendering of bench-engine's ``decode`` suite (:mod:`prefixcache.bench.decode_perf`):
the Markdown section of ``engine.md`` and the TPOT-vs-context plot."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def server_series(out_dir: Path) -> list[dict]:
    """TPOT measured through servers (``scripts/tpot_server.py`` output files
    ``tpot_server_*.json`` in ``out_dir``): ``[{label, rows}]``."""
    import json

    return [json.loads(f.read_text()) for f in sorted(out_dir.glob("tpot_server_*.json"))]


def plot_tpot(res: dict, path: Path, servers: list[dict] | None = None) -> None:
    """TPOT (ms, log scale) against context, one line per implementation and batch; the
    ``servers`` series (per-token time through a server, streamed) dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))

    def series(rows: list[dict], label: str, **style) -> None:
        """One line per batch size of ``rows`` (ms, min-max bars)."""
        for n in sorted({r["seqs"] for r in rows}):
            pts = sorted((r["ctx"], r["median"] * 1e3, r["min"] * 1e3, r["max"] * 1e3)
                         for r in rows if r["seqs"] == n)
            x, y, lo, hi = zip(*pts)
            ax.errorbar(x, y, yerr=[[a - b for a, b in zip(y, lo)],
                                    [b - a for a, b in zip(y, hi)]], capsize=3,
                        label=f"{label}, {n} seq{'s' if n > 1 else ''}", **style)
    rows = res["tpot_vs_context"]
    for impl in sorted({r["impl"] for r in rows}):
        series([r for r in rows if r["impl"] == impl], impl, marker="o")
    for srv in servers or []:
        series(srv["rows"], f"{srv['label']} server", marker="s", ls="--")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("time per decode step (ms)")
    ax.set_title("Decode step vs context (median, min-max bars)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render_markdown(res: dict, meta: dict) -> list[str]:
    """The ``decode`` section of ``engine.md``."""
    lines = [f"## Decode speed ({meta['model']}, {meta['dtype']}, {meta['threads']} thread(s), "
             f"{meta['date']})", "",
             "Time per decode step (ms, median [min-max] of interleaved repeats):", "",
             "| context | " + " | ".join(f"{i}, {n}" for i, n in _impls(res)) + " |",
             "|---" * (1 + len(_impls(res))) + "|"]
    cell = {(r["impl"], r["seqs"], r["ctx"]): r for r in res["tpot_vs_context"]}
    for ctx in sorted({r["ctx"] for r in res["tpot_vs_context"]}):
        cells = []
        for i, n in _impls(res):
            r = cell.get((i, n, ctx))
            cells.append(f"{r['median'] * 1e3:.1f} [{r['min'] * 1e3:.0f}-{r['max'] * 1e3:.0f}]"
                         if r else "-")
        lines.append(f"| {ctx} | " + " | ".join(cells) + " |")
    b = res["step_breakdown"]
    med = b["median_s"]
    lines += ["", f"TPOT 8k / 512: {res['tpot_8k_over_512']['1']:.2f}x (1 seq), "
              f"{res['tpot_8k_over_512']['8']:.2f}x (8 seqs). Output tokens/s, 8 seqs / 1 "
              f"at 1k: {res['batched_8_over_1_tok_s']:.2f}x.", "",
              f"Step breakdown, {b['seqs']} sequences decoding at {b['ctx']} context "
              f"({b['steps_measured']} steps, medians):", "",
              "| part | ms | share |", "|---|---|---|"]
    for k, v in med.items():
        lines.append(f"| {k} | {v * 1e3:.2f} | {v / med['total']:.1%} |")
    bw = res["bandwidth_gbs"]
    lines += ["", f"Host share (everything but the forward): {b['host_share']:.1%}.", "",
              f"Read bandwidth, 1 thread: GEMV {bw['gemv']['median']:.1f} GB/s "
              f"[{bw['gemv']['min']:.1f}-{bw['gemv']['max']:.1f}], sum "
              f"{bw['sum']['median']:.1f} GB/s.", "",
              "| dtype | weight bytes | bound (bytes / GEMV bandwidth) | 1-seq step at 1k | "
              "step / bound |", "|---|---|---|---|---|"]
    for k, v in res["bandwidth_bound"].items():
        s = v["step_s"]
        lines.append(f"| {k} | {v['weight_bytes'] / 1e6:.0f} MB | {v['bound_s'] * 1e3:.1f} ms | "
                     f"{s['median'] * 1e3:.1f} ms [{s['min'] * 1e3:.1f}-{s['max'] * 1e3:.1f}] | "
                     f"{s['median'] / v['bound_s']:.2f}x |")
    lines += _ab_table(res.get("packed_ab"), "Decoder linears prepacked (default) against "
                       "plain `F.linear`, 1k context", ("sequences", "packed", "F.linear"),
                       lambda r: f"{r['seqs']}", "packed", "f_linear")
    lines += _ab_table(res.get("kernel_ab"), "Decode attention reading pages in place (the "
                       "CPU kernel, default) against gathering them for SDPA",
                       ("sequences x context", "in place", "gathered"),
                       lambda r: f"{r['seqs']} x {r['ctx']}", "in_place", "gathered")
    lines += _ab_table(res.get("prefill_ab"), "Prefill attention reading pages in place "
                       "(the CPU kernel, default) against torch's SDPA",
                       ("new tokens over context", "in place", "SDPA"),
                       lambda r: f"{r['new']} over {r['ctx']}", "in_place", "torch")
    lines += _ab_table(res.get("fused_ab"), "The decoder layer's elementwise ops fused "
                       "(RoPE and the KV write, SiLU times up, RMSNorm's scaling; the same "
                       "bits, default) against torch ops",
                       ("step", "fused", "torch ops"),
                       lambda r: (f"{r['seqs']} x {r['ctx']} decode" if "seqs" in r
                                  else f"{r['new']} over {r['ctx']} prefill"), "fused", "torch")
    lines += _ab_table(res.get("small_gemm_ab"), "Decode linears of 1-8 rows on the "
                       "weight-streaming kernel (default) against oneDNN's packed kernel "
                       "(`F.linear` at one row), 1k context",
                       ("sequences", "streaming", "oneDNN"), lambda r: f"{r['seqs']}",
                       "small", "onednn")
    lines += _ab_table(res.get("huge_pages_ab"), "Weights on transparent huge pages "
                       "(default) against 4 KiB pages",
                       ("sequences x context", "huge pages", "4 KiB pages"),
                       lambda r: f"{r['seqs']} x {r['ctx']}", "huge", "small_pages")
    lines += _ab_table(res.get("split_ab"), "Prefill after a cached prefix, kernel off: "
                       "attention split at the prefix (two flash calls merged by "
                       "log-sum-exp) against one masked SDPA call",
                       ("new tokens over context", "split", "masked"),
                       lambda r: f"{r['new']} over {r['ctx']}", "split", "masked")
    lines += ["", "Goals: " + "; ".join(f"{k}: {'met' if ok else 'missed'}"
                                        for k, ok in res["goals"].items()), ""]
    return lines


def _ab_table(rows: list[dict] | None, title: str, heads: tuple[str, str, str],
              label: Callable[[dict], str], default: str, other: str) -> list[str]:
    """A paired A/B table (ms per step, median [min-max]; the per-round ratio other /
    default), or nothing without rows."""
    if not rows:
        return []
    out = ["", f"{title} (ms per step, median [min-max]; ratio per round):", "",
           f"| {heads[0]} | {heads[1]} | {heads[2]} | {heads[2]} / {heads[1]} |",
           "|---|---|---|---|"]
    for r in rows:
        q = r["ratio"]
        out.append(f"| {label(r)} | {_ms(r[default])} | {_ms(r[other])} | "
                   f"{q['median']:.2f}x [{q['min']:.2f}-{q['max']:.2f}] |")
    return out


def _ms(r: dict) -> str:
    return f"{r['median'] * 1e3:.1f} [{r['min'] * 1e3:.0f}-{r['max'] * 1e3:.0f}]"


def _impls(res: dict) -> list[tuple[str, int]]:
    return sorted({(r["impl"], r["seqs"]) for r in res["tpot_vs_context"]})
