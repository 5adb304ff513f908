"""Turn run summaries into a Markdown table, PNG plots and ``RESULTS.md``.

Summary keys (one JSON object per run, see :func:`prefixcache.bench.metrics.summarize`):
``workload, model, peer, mode, dtype, threads, concurrency, machine, block_size,
peer_detail, requests, errors, prompt_tokens, cached_tokens, hit_rate,
prefill_tokens_computed, prefill_computed_fraction, output_tokens, ttft_p50_s, ttft_p90_s,
ttft_p99_s, ttft_mean_s, ttft_cold_p50_s, ttft_warm_p50_s, cold_requests, warm_requests,
warm_hit_rate, tpot_p50_s, tpot_mean_s, e2e_p50_s, effective_prefill_tok_s, output_tok_s,
requests_per_s, wall_s, peak_rss_mib`` and, where they apply, ``ttft_cold_over_warm``,
``cross_tenant_hits`` / ``cross_tenant_tokens`` (multi-tenant), ``reference_hit_rate``
(agent: DeepSeek), ``cache_stats``, ``per_request``; ``first_errors`` (up to 3 distinct
error messages, ``"request id: message"``) and ``fit`` (``max_model_len, built, capped,
skipped``: what fitting the workload to the model did, see :mod:`prefixcache.bench.fit`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

REQUIRED_KEYS = ("workload", "model", "requests", "prompt_tokens", "cached_tokens", "hit_rate",
                 "prefill_tokens_computed", "ttft_p50_s", "ttft_p99_s")

PEER_ORDER = ["prefixcache", "prefixcache-nocache", "vllm", "llamacpp", "transformers"]


def _key(s: dict) -> tuple:
    p = PEER_ORDER.index(s["peer"]) if s["peer"] in PEER_ORDER else 99
    return (s["workload"], 0 if s["mode"] == "offline" else 1, p)


def _f(x, spec: str, scale: float = 1.0) -> str:
    return "–" if x is None else format(x * scale, spec)


def _pct(x) -> str:
    return "–" if x is None else f"{x:.1%}"


def label(s: dict) -> str:
    return f"{s['peer']} ({s['mode']})"


# --------------------------------------------------------------------------- table
def markdown_table(summaries: list[dict], failed=()) -> str:
    """One row per run, then one per failed peer (``failed``: see :func:`failures`) with
    its error; a run with failed requests shows their count in the ``reqs`` column and
    its first errors in :func:`errors_table`."""
    head = ("| workload | peer (mode) | C | reqs | hit rate | prefill computed / prompt "
            "| TTFT p50 / p90 / p99 (ms) | TTFT cold / warm p50 (ms) | TPOT p50 (ms) "
            "| eff. prefill tok/s | out tok/s | req/s | peak RSS (MiB) | cross-tenant hits |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for s in sorted(summaries, key=_key):
        computed = ("–" if s.get("prefill_tokens_computed") is None
                    else f"{s['prefill_tokens_computed']:,} / {s['prompt_tokens']:,}")
        cross = s.get("cross_tenant_hits", "")
        cross = "–" if cross is None else cross
        rows.append(
            f"| {s['workload']} | {label(s)} | {s['concurrency']} | {s['requests']}"
            f"{' (' + str(s['errors']) + ' err)' if s.get('errors') else ''}{_fitted(s)} "
            f"| {_pct(s.get('hit_rate'))}"
            f"{' (log)' if s.get('cached_tokens_source') == 'server log' else ''} | {computed} "
            f"| {_f(s.get('ttft_p50_s'), '.0f', 1e3)} / {_f(s.get('ttft_p90_s'), '.0f', 1e3)} / "
            f"{_f(s.get('ttft_p99_s'), '.0f', 1e3)} "
            f"| {_f(s.get('ttft_cold_p50_s'), '.0f', 1e3)} / "
            f"{_f(s.get('ttft_warm_p50_s'), '.0f', 1e3)} "
            f"| {_f(s.get('tpot_p50_s'), '.1f', 1e3)} "
            f"| {_f(s.get('effective_prefill_tok_s'), ',.0f')} "
            f"| {_f(s.get('output_tok_s'), '.1f')} | {_f(s.get('requests_per_s'), '.2f')} "
            f"| {_f(s.get('peak_rss_mib'), ',.0f')} | {cross} |")
    ncols = head.count("|") - 1
    for f in failures(failed):
        reason = _cell(f["reason"])
        rows.append(f"| – | {f['peer']} ({f['mode']}) | **{reason}** |" + " – |" * (ncols - 3))
    return "\n".join(rows) + "\n"


def _fitted(s: dict) -> str:
    """`` (2 capped, 1 skipped)`` when fitting the workload to the model changed it."""
    f = s.get("fit") or {}
    parts = [f"{f[k]} {k}" for k in ("capped", "skipped") if f.get(k)]
    return f" ({', '.join(parts)})" if parts else ""


def _cell(text: str, chars: int = 300) -> str:
    """``text``'s first line, cut, safe inside a Markdown table cell."""
    first = (text.splitlines() or [""])[0]
    return first[:chars].replace("|", "\\|")


def errors_table(summaries: list[dict]) -> str:
    """Runs with failed requests: how many, and their first error messages (``""`` when
    no run has any)."""
    bad = [s for s in sorted(summaries, key=_key) if s.get("errors")]
    if not bad:
        return ""
    rows = ["| workload | peer (mode) | failed requests | first errors |", "|---|---|---|---|"]
    rows += [f"| {s['workload']} | {label(s)} | {s['errors']} of {s['requests']} | "
             + "<br>".join(_cell(e) for e in s.get("first_errors") or []) + " |" for s in bad]
    return "\n".join(rows) + "\n"


# --------------------------------------------------------------------------- goals
@dataclass
class Goal:
    name: str
    target: str
    figure: str
    status: str  # "met" | "missed" | "not measured" | "failed to start" | "failed during ..."


def _find(summaries, workload, peer, modes=("offline", "serving")):
    for m in modes:
        for s in summaries:
            if (s["workload"] == workload and s["peer"] == peer and s["mode"] == m
                    and s["requests"] > s.get("errors", 0)):
                return s
    return None


def _serving_peer(summaries, workload, peer):
    # transformers has no server: its offline run stands in for it in serving comparisons
    modes = ("serving", "offline") if peer == "transformers" else ("serving",)
    return _find(summaries, workload, peer, modes)


def failures(failed=()) -> list[dict]:
    """``failed`` (runner ``Skip`` objects with ``failed=True``, or their dicts, as saved
    in ``runs/context.json``) as ``[{"peer", "mode", "reason"}]``."""
    rows = [f if isinstance(f, dict) else vars(f) for f in failed]
    return [{"peer": f["peer"], "mode": f["mode"], "reason": f["reason"]} for f in rows
            if f.get("failed", True)]


def _failure(failed: list[dict], peer: str, modes=("offline", "serving")) -> dict | None:
    return next((f for f in failed if f["peer"] == peer and f["mode"] in modes), None)


def _absent(name: str, target: str, failed: list[dict], who: list[tuple[str, tuple, str]],
            fallback: str) -> Goal:
    """The goal a missing run leaves: ``failed to start`` (or ``failed during ...``) with
    the error when one of ``who`` (peer, modes, display name) failed, else ``not
    measured`` with ``fallback``."""
    for peer, modes, shown in who:
        f = _failure(failed, peer, modes)
        if f:
            status, _, err = f["reason"].partition(": ")
            return Goal(name, target, f"{shown} {status}: {err.splitlines()[0] if err else ''}",
                        status)
    return Goal(name, target, fallback, "not measured")


def goals(summaries: list[dict], failed=()) -> list[Goal]:
    """The project's goals from the runs; ``failed``: see :func:`failures` (a goal whose
    peer failed reads ``failed to start``, with the error, never ``not measured``)."""
    failed = failures(failed)
    ours_any = [("prefixcache", ("offline", "serving"), "prefixcache")]
    out: list[Goal] = []
    # 1. warm vs cold TTFT at a high hit rate
    s = _find(summaries, "shared-prefix", "prefixcache")
    if s and s.get("ttft_cold_over_warm"):
        h = s.get("warm_hit_rate") or 0.0
        ideal = 1 / (1 - h) if h < 1 else float("inf")
        nc = _find(summaries, "shared-prefix", "prefixcache-nocache", (s["mode"],))
        extra = ""
        if nc and nc.get("ttft_warm_p50_s") and s.get("ttft_warm_p50_s"):
            extra = ("; same warm requests with caching off: "
                     f"{nc['ttft_warm_p50_s'] * 1e3:.0f} ms, "
                     f"{nc['ttft_warm_p50_s'] / s['ttft_warm_p50_s']:.1f}×")
        r = s["ttft_cold_over_warm"]
        figure = (f"{r:.1f}× ({label(s)}: cold p50 {s['ttft_cold_p50_s'] * 1e3:.0f} ms, "
                  f"warm p50 {s['ttft_warm_p50_s'] * 1e3:.0f} ms at {h:.1%} warm hit rate, "
                  f"ideal compute ratio {ideal:.0f}×{extra})")
        out.append(Goal("TTFT speedup, warm over cold, at ~96% hit rate (shared-prefix)",
                        "≥ 20× (ideal 25×)", figure, "met" if r >= 20 else "missed"))
    else:
        out.append(_absent("TTFT speedup, warm over cold (shared-prefix)", "≥ 20×", failed,
                           ours_any, "not run"))
    # 2. agent hit rate against DeepSeek
    s = _find(summaries, "agent", "prefixcache")
    if (s and s.get("hit_rate_on_reference_calls") is not None
            and s.get("reference_hit_rate") is not None):
        ok = s["hit_rate_on_reference_calls"] >= s["reference_hit_rate"]
        figure = (f"{s['hit_rate_on_reference_calls']:.1%} vs DeepSeek "
                  f"{s['reference_hit_rate']:.1%} over the {s['reference_calls']} DeepSeek calls "
                  f"({label(s)}; all {s['requests']} agent calls: {_pct(s['hit_rate'])})")
        out.append(Goal("Agent-loop hit rate vs DeepSeek's recorded rate (same calls)",
                        "≥ DeepSeek", figure, "met" if ok else "missed"))
    else:
        out.append(_absent("Agent-loop hit rate vs DeepSeek", "≥ DeepSeek", failed, ours_any,
                           "not run"))
    # 3. tenant isolation
    mt = [x for x in summaries if x["workload"] == "multi-tenant" and x["peer"] == "prefixcache"]
    if mt and all(x.get("cross_tenant_hits") is not None for x in mt):
        n = sum(x["cross_tenant_hits"] for x in mt)
        figure = ", ".join(f"{label(x)}: {x['cross_tenant_hits']} of {x['requests']} requests "
                           f"(hit rate {_pct(x['hit_rate'])})" for x in mt)
        out.append(Goal("Cross-tenant hits (multi-tenant)", "0", figure,
                        "met" if n == 0 else "missed"))
    else:
        out.append(_absent("Cross-tenant hits (multi-tenant)", "0", failed, ours_any, "not run"))
    # 4. serving comparisons
    ours_serving = ("prefixcache", ("serving",), "prefixcache")
    for wname in ("shared-prefix", "multi-turn"):
        ours = _find(summaries, wname, "prefixcache", ("serving",))
        v = _serving_peer(summaries, wname, "vllm")
        if ours and v:
            figure = "–"
            if ours["ttft_p50_s"]:
                figure = (f"{ours['ttft_p50_s'] * 1e3:.0f} ms vs {v['ttft_p50_s'] * 1e3:.0f} ms "
                          f"({_speed(v['ttft_p50_s'] / ours['ttft_p50_s'])})")
            out.append(Goal(f"{wname} serving: TTFT p50 vs vLLM-CPU", "≤ vLLM", figure,
                            "met" if ours["ttft_p50_s"] <= v["ttft_p50_s"] else "missed"))
        else:
            out.append(_absent(f"{wname} serving: TTFT p50 vs vLLM-CPU", "≤ vLLM", failed,
                               [ours_serving] if not ours else [("vllm", ("serving",), "vLLM-CPU")],
                               "not run" if not ours else "vLLM not run"))
        for peer, need, name in (("vllm", 1.0, "vLLM-CPU"),
                                 ("llamacpp", 5.0, "llama-cpp-python server"),
                                 ("transformers", 10.0, "transformers")):
            p = _serving_peer(summaries, wname, peer)
            if ours and p and p.get("requests_per_s"):
                r = ours["requests_per_s"] / p["requests_per_s"]
                figure = (f"{r:.2f}× ({ours['requests_per_s']:.2f} vs "
                          f"{p['requests_per_s']:.2f} req/s; {ours['output_tok_s']:.1f} vs "
                          f"{p['output_tok_s']:.1f} out tok/s)")
                out.append(Goal(f"{wname} serving: throughput vs {name}", f"≥ {need:g}×", figure,
                                "met" if r >= need else "missed"))
            else:
                modes = ("offline",) if peer == "transformers" else ("serving",)
                out.append(_absent(f"{wname} serving: throughput vs {name}", f"≥ {need:g}×",
                                   failed, [ours_serving] if not ours else [(peer, modes, name)],
                                   "not run" if not ours else f"{name} not run"))
    return out


def ratios_table(summaries: list[dict]) -> str:
    """Ours (serving) against each other peer, per workload: how many times lower our TTFT
    p50 is, and how many times higher our requests/s (``>1``: ours is better)."""
    peers = [p for p in PEER_ORDER
             if p != "prefixcache" and any(s["peer"] == p for s in summaries)]
    rows = ["| workload | " + " | ".join(f"vs {p}: TTFT p50 / req/s" for p in peers) + " |",
            "|---|" + "---|" * len(peers)]
    for wname in sorted({s["workload"] for s in summaries}):
        ours = _find(summaries, wname, "prefixcache", ("serving", "offline"))
        if not ours or not ours.get("ttft_p50_s"):
            continue
        cells = []
        for p in peers:
            other = (_serving_peer(summaries, wname, p) if ours["mode"] == "serving"
                     else _find(summaries, wname, p, ("offline",)))
            if p == "prefixcache-nocache":
                other = _find(summaries, wname, p, (ours["mode"],))
            if other and other.get("ttft_p50_s") and other.get("requests_per_s"):
                cells.append(f"{other['ttft_p50_s'] / ours['ttft_p50_s']:.1f}× / "
                             f"{ours['requests_per_s'] / other['requests_per_s']:.2f}×")
            else:
                cells.append("–")
        rows.append(f"| {wname} ({ours['mode']}) | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def goals_table(gs: list[Goal]) -> str:
    rows = ["| goal | target | measured | status |", "|---|---|---|---|"]
    rows += [f"| {g.name} | {g.target} | {g.figure} | **{g.status}** |" for g in gs]
    return "\n".join(rows) + "\n"


# --------------------------------------------------------------------------- plots
def plot_ttft_cold_warm(summaries: list[dict], out_dir: Path) -> list[Path]:
    """Per workload with both cold and warm requests: the TTFT distribution (empirical
    CDF, log time axis) of cold (dashed) and warm (solid) requests, one colour per peer,
    one panel per mode (offline, serving)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for wname in sorted({s["workload"] for s in summaries}):
        runs = [s for s in sorted(summaries, key=_key)
                if s["workload"] == wname and s.get("per_request")]
        if not any(s.get("cold_requests") and s.get("warm_requests") for s in runs):
            continue
        modes = [m for m in ("offline", "serving") if any(s["mode"] == m for s in runs)]
        fig, axes = plt.subplots(1, len(modes), figsize=(7.5 * len(modes), 4.8),
                                 squeeze=False, sharex=True)
        for ax, mode in zip(axes[0], modes):
            for s in (r for r in runs if r["mode"] == mode):
                color = f"C{PEER_ORDER.index(s['peer']) if s['peer'] in PEER_ORDER else 9}"
                for warm, style in ((False, "--"), (True, "-")):
                    xs = sorted(r["ttft_s"] for r in s["per_request"]
                                if r.get("ttft_s") is not None and r.get("error") is None
                                and bool(r.get("warm_expected")) == warm)
                    if xs:
                        ys = [0.0] + [(k + 1) / len(xs) for k in range(len(xs))]
                        ax.step([xs[0]] + xs, ys, where="post", linestyle=style, color=color,
                                label=f"{s['peer']} {'warm' if warm else 'cold'} (n={len(xs)})")
            ax.set_xscale("log")
            ax.set_ylim(0, 1.02)
            ax.set_xlabel("TTFT (s, log scale)")
            ax.set_ylabel("fraction of requests")
            conc = sorted({s["concurrency"] for s in runs if s["mode"] == mode})
            ax.set_title(f"{mode} (concurrency {'/'.join(map(str, conc))})", fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7, loc="lower right")
        fig.suptitle(f"{wname}: TTFT of cold (dashed) and warm (solid) requests")
        fig.tight_layout()
        p = out_dir / f"ttft_cold_warm_{wname}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


def hit_rate_by_turn(per_request: list[dict], *, reference: bool = False) -> dict[int, float]:
    """``{turn: sum cached / sum prompt}`` over requests of that turn/call index (with
    ``reference``: DeepSeek's recorded counts)."""
    num: dict[int, int] = {}
    den: dict[int, int] = {}
    for r in per_request:
        if r.get("error"):
            continue
        c, p = ((r.get("reference_cached_tokens"), r.get("reference_prompt_tokens")) if reference
                else (r.get("cached_tokens"), r.get("prompt_tokens")))
        if c is None or not p:
            continue
        num[r["turn"]] = num.get(r["turn"], 0) + c
        den[r["turn"]] = den.get(r["turn"], 0) + p
    return {t: num[t] / den[t] for t in sorted(den)}


def plot_hit_rate_per_turn(summaries: list[dict], out_dir: Path) -> list[Path]:
    """Multi-turn (per turn) and agent (per call): hit rate by index, one line per peer
    that reports cached tokens (peers that never hit are left out). The agent figure
    has a second panel restricted to the DeepSeek trajectories' calls, with DeepSeek's
    recorded production hit rate on the same calls."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for wname, xlabel in (("multi-turn", "turn"), ("agent", "call")):
        runs = [s for s in sorted(summaries, key=_key)
                if s["workload"] == wname and s.get("per_request")]
        panels = [("all sessions",
                   [(label(s), hit_rate_by_turn(s["per_request"])) for s in runs])]
        if wname == "agent" and runs:
            lines = [(label(s), hit_rate_by_turn([r for r in s["per_request"]
                                                  if r.get("reference_prompt_tokens")]))
                     for s in runs]
            ref = hit_rate_by_turn(runs[0]["per_request"], reference=True)
            if ref:
                panels.append(("DeepSeek trajectories: same calls as the recorded production run",
                               lines + [("DeepSeek production (recorded)", ref)]))
        panels = [(t, [(n, d) for n, d in ls if d and any(v > 0 for v in d.values())])
                  for t, ls in panels]
        panels = [(t, ls) for t, ls in panels if ls]
        if not panels:
            continue
        fig, axes = plt.subplots(1, len(panels), figsize=(8 * len(panels), 4.5), squeeze=False)
        for ax, (title, lines) in zip(axes[0], panels):
            for i, (name, d) in enumerate(lines):
                ref_line = name.startswith("DeepSeek")
                ax.plot(list(d), list(d.values()), ":" if ref_line else "-", marker="o",
                        markersize=3, label=name, color="k" if ref_line else f"C{i % 10}")
            ax.set_ylim(0, 1.02)
            ax.set_xlabel(f"{xlabel} index (0 = first)")
            ax.set_ylabel("hit rate (cached / prompt tokens)")
            ax.set_title(f"{wname}, {title}", fontsize=10)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8, loc="lower right")
        fig.suptitle(f"{wname}: prefix-cache hit rate per {xlabel}")
        fig.tight_layout()
        p = out_dir / f"hit_rate_per_{xlabel}_{wname}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


# --------------------------------------------------------------------------- files
def write_reports(summaries: list[dict], out_dir: Path, *, skipped=(),
                  context: dict | None = None, command: str | None = None) -> dict[str, Path]:
    """Write ``results.jsonl`` (summaries without per-request rows), ``results.md``
    (the table), ``plots/*.png`` and ``RESULTS.md`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plots_dir = out_dir / "plots"
    plots_dir.mkdir(exist_ok=True)
    with open(out_dir / "results.jsonl", "w") as f:
        for s in sorted(summaries, key=_key):
            f.write(json.dumps({k: v for k, v in s.items() if k != "per_request"}) + "\n")
    failed = failures(skipped) or failures((context or {}).get("failed") or [])
    table = markdown_table(summaries, failed) + errors_table(summaries)
    (out_dir / "results.md").write_text(table)
    plots = (plot_ttft_cold_warm(summaries, plots_dir)
             + plot_hit_rate_per_turn(summaries, plots_dir))
    gs = goals(summaries, failed)
    (out_dir / "RESULTS.md").write_text(results_md(summaries, gs, plots, out_dir, skipped=skipped,
                                                   context=context or {}, command=command,
                                                   failed=failed))
    return {"results.jsonl": out_dir / "results.jsonl", "results.md": out_dir / "results.md",
            "RESULTS.md": out_dir / "RESULTS.md", **{p.name: p for p in plots}}


def _speed(ratio: float) -> str:
    """``peer / ours`` latency as words: "1.17× faster" or "1.21× slower"."""
    return f"{ratio:.2f}× faster" if ratio >= 1 else f"{1 / ratio:.2f}× slower"


def _concurrency(summaries, mode: str, default) -> str:
    """The concurrency the runs of ``mode`` used (cold-burst aside), e.g. ``"4"``."""
    used = sorted({s["concurrency"] for s in summaries
                   if s["mode"] == mode and s["workload"] != "cold-burst"
                   and s["peer"] != "transformers"})
    return "/".join(map(str, used)) if used else str(default)


def results_md(summaries, gs: list[Goal], plots: list[Path], out_dir: Path, *, skipped=(),
               context: dict, command: str | None, failed=()) -> str:
    ctx = context
    first = summaries[0] if summaries else {}
    loads = [x for s in summaries for x in (s.get("load_average_1m") or [])]
    max_len = (max((s.get("max_model_len") or 0 for s in summaries), default=0)
               or ctx.get("max_model_len", "?"))
    lines = ["# prefixcache benchmark results", "",
             "Generated by `prefixcache bench`; do not edit by hand."
             + (f" Command: `{command}`." if command else ""), "",
             "## Setup", "",
             f"- model: `{ctx.get('model_name') or ctx.get('model', first.get('model'))}`"
             + (f" ({ctx['model_desc']})" if ctx.get("model_desc") else "")
             + (f"; weights sha256 `{ctx['model_sha256']}`, the same file for every peer "
                "(llama.cpp: converted to GGUF at the same dtype)"
                if ctx.get("model_sha256") else ""),
             f"- dtype: {ctx.get('dtype', first.get('dtype'))}; "
             f"threads per peer: {ctx.get('threads', first.get('threads'))}; "
             f"concurrency: serving {_concurrency(summaries, 'serving', ctx.get('concurrency'))}, "
             f"offline {_concurrency(summaries, 'offline', ctx.get('offline_concurrency', 1))} "
             "(cold-burst: all at once; transformers: serial)",
             f"- machine: {ctx.get('machine', first.get('machine'))}"
             + (f"; its 1-minute load average during the runs: "
                f"{min(loads):.1f}–{max(loads):.1f} "
                "(other work on the machine slows every peer)" if loads else ""),
             f"- our page size: {ctx.get('block_size', 16)} tokens; max context "
             f"{max_len} tokens; serving peers get the prompt rendered once by the bench "
             f"(`/v1/{ctx.get('api', 'completions')}`), greedy, fixed output length",
             ""]
    details: dict[str, dict] = {}
    for s in summaries:
        details.setdefault(label(s), s.get("peer_detail") or {})
    measured: dict[str, list[str]] = {}
    for s in summaries:
        if s.get("measured_at"):
            measured.setdefault(label(s), []).append(s["measured_at"])
    if details:
        lines += ["Peers:", ""]
        for name, d in details.items():
            short = {k: (round(v, 1) if isinstance(v, float) else v)
                     for k, v in d.items() if k != "command"}
            when = measured.get(name)
            lines.append(f"- {name}: " + ", ".join(f"{k}={v}" for k, v in short.items())
                         + (f"; measured {min(when)} to {max(when)}" if when else ""))
        lines.append("")
    absent = [s for s in skipped if not getattr(s, "failed", False)]
    if absent:
        lines += ["Skipped:", ""] + [f"- {s.peer} ({s.mode}): {s.reason.splitlines()[0]}"
                                     for s in absent] + [""]
    if failed:
        lines += ["**Failed:**", ""] + [f"- {f['peer']} ({f['mode']}): {_cell(f['reason'])}"
                                        for f in failures(failed)] + [""]
    fit = ctx.get("fit") or {}
    cut = {w: f for w, f in fit.items() if f.get("capped") or f.get("skipped")}
    if cut:
        limit = next(iter(cut.values()))["max_model_len"]
        lines += [f"Fitted to the model's {limit:,}-token context (every peer got the same "
                  "requests; see `prefixcache/bench/fit.py`):", ""]
        lines += [f"- {w}: {f['capped']} capped, {f['skipped']} skipped, of {f['built']}"
                  for w, f in cut.items()] + [""]
    lines += ["## Goals", "", goals_table(gs),
              "## Ours against each peer", "",
              "Our engine with prefix caching (serving, concurrency as above) against each peer "
              "on the same requests: the peer's TTFT p50 over ours, and our requests/s over the "
              "peer's (above 1×: ours is better). transformers runs serially in process.", "",
              ratios_table(summaries),
              "## All runs", "", markdown_table(summaries, failed), errors_table(summaries),
              "TTFT cold/warm: requests whose prefix nobody sent before them vs requests whose "
              "prefix an earlier request of the same tenant carried. Prefill computed: the "
              "engine's own counter where it has one (ours, vLLM: prompt − prefix-cache hits; "
              "llama.cpp: prompt − prefix-match tokens in its log, whose total is also its hit "
              "rate, marked (log)). Effective prefill tok/s counts cached tokens. Peak RSS: the "
              "peer's process tree (offline peers: the bench process).", "", "## Plots", ""]
    for p in plots:
        rel = p.relative_to(out_dir)
        lines += [f"![{p.stem}]({rel.as_posix()})", ""]
    return "\n".join(lines)
