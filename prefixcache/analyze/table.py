"""The terminal report (rich tables) of an analysis report dict."""
from __future__ import annotations

import math
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

TURN_BUCKETS = ((0, 0), (1, 1), (2, 2), (3, 3), (4, 7), (8, 15), (16, 31), (32, 63),
                (64, 127), (128, None))


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def num(x: float | int | None) -> str:
    return "-" if x is None else f"{x:,}"


def money(x: float, currency: str = "USD") -> str:
    """Amounts with 4 decimals, or 3 significant digits below a cent."""
    sym = "$" if currency == "USD" else f"{currency} "
    sign = "-" if x < 0 else ""
    x = abs(x)
    if x == 0:
        return f"{sym}0"
    if x < 0.01:
        decimals = 2 - math.floor(math.log10(x))
        return f"{sign}{sym}{x:.{decimals}f}"
    return f"{sign}{sym}{x:,.4f}" if x < 100 else f"{sign}{sym}{x:,.2f}"


def _inputs(paths: list[str]) -> str:
    names = [Path(p).name for p in paths]
    if len(names) > 4:
        return f"{len(names)} files: " + ", ".join(names[:3]) + ", …"
    return ", ".join(names) or "-"


def _summary(r: dict) -> Table:
    t = Table(title="Prefix cache replay", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    cap = "unlimited" if r["capacity_tokens"] is None else f"{r['capacity_tokens']:,} tokens"
    if r.get("capacity_bytes"):
        cap += f" ({r['capacity_bytes']:,} bytes at {r['kv_bytes_per_token']:,} B/token)"
    rows = [
        ("inputs", _inputs(r.get("inputs") or [])),
        ("tokenizer / rendering", f"{r['tokenizer']} / {r['renderer']}"),
        ("requests", num(r["requests"])),
        ("prompt tokens", num(r["prompt_tokens"])),
        ("cached tokens", num(r["cached_tokens"])),
        ("hit rate", pct(r["hit_rate"])),
        ("hit rate, unlimited capacity", pct(r["hit_rate_unbounded"])),
        ("block size / capacity", f"{r['block_size']} / {cap} ({r['num_pages']:,} pages)"),
        ("responses published", "yes" if r["publish_responses"] else "no"),
        ("evictions / failed requests", f"{r['evictions']:,} pages / {r['failed_requests']}"),
    ]
    if r.get("ttl_seconds"):
        rows.append(("idle TTL / expired pages", f"{r['ttl_seconds']} s / {r['expired_pages']:,}"))
    if r.get("note"):
        rows.append(("note", r["note"]))
    for k, v in rows:
        t.add_row(k, v)
    return t


def _tenants(r: dict) -> Table:
    t = Table(title="Per tenant", title_justify="left")
    for c in ("tenant", "requests", "prompt tokens", "cached", "hit rate", "unlimited"):
        t.add_column(c, justify="left" if c == "tenant" else "right")
    for name, g in sorted(r["tenants"].items(), key=lambda kv: -kv[1]["prompt_tokens"]):
        t.add_row(name or "(none)", num(g["requests"]), num(g["prompt_tokens"]),
                  num(g["cached_tokens"]), pct(g["hit_rate"]), pct(g["hit_rate_unbounded"]))
    return t


def _turns(r: dict) -> Table:
    t = Table(title="Per turn (turn = assistant messages before the call)",
              title_justify="left")
    for c in ("turn", "requests", "prompt tokens", "cached", "hit rate", "unlimited"):
        t.add_column(c, justify="right")
    for lo, hi in TURN_BUCKETS:
        rows = [x for x in r["turns"] if x["turn"] >= lo and (hi is None or x["turn"] <= hi)]
        if not rows:
            continue
        p = sum(x["prompt_tokens"] for x in rows)
        c = sum(x["cached_tokens"] for x in rows)
        cu = sum(x["cached_tokens_unbounded"] for x in rows)
        label = str(lo) if lo == hi else (f"{lo}-{hi}" if hi is not None else f"{lo}+")
        t.add_row(label, num(sum(x["requests"] for x in rows)), num(p), num(c),
                  pct(c / p if p else 0), pct(cu / p if p else 0))
    return t


def _calls(r: dict, limit: int | None) -> Table:
    t = Table(title="Per call", title_justify="left")
    for c in ("request", "turn", "prompt", "cached", "hit", "unlimited", "recorded hit"):
        t.add_column(c, justify="left" if c == "request" else "right")
    for c in r["calls"][:limit]:
        rec = c.get("recorded")
        rec_s = (f"{pct(rec['cached_tokens'] / rec['prompt_tokens'])} of {rec['prompt_tokens']:,}"
                 if rec and rec["prompt_tokens"] else "-")
        t.add_row(c["request_id"], str(c["turn"]), num(c["prompt_tokens"]),
                  num(c["cached_tokens"]), pct(c["hit_rate"]),
                  pct(c["cached_tokens_unbounded"] / c["prompt_tokens"]
                      if c["prompt_tokens"] else 0), rec_s)
    return t


def _sweeps(r: dict) -> list[Table | Text]:
    sw = r.get("sweeps")
    if not sw:
        return []
    a = Table(title="Hit rate by block size", title_justify="left")
    for p in sw["block_size"]:
        a.add_column(str(p["block_size"]), justify="right")
    a.add_row(*[pct(p["hit_rate"]) for p in sw["block_size"]])
    ws = sw.get("working_set_pages")
    b = Table(title="Hit rate by capacity (tokens)" + (
        f"; the log's working set is {ws:,} pages" if ws is not None else ""),
        title_justify="left")
    b.add_column("capacity", justify="right")
    b.add_column("hit rate", justify="right")
    b.add_column("evictions", justify="right")
    b.add_column("requests too large", justify="right")
    for p in sw["capacity"]:
        cap = "unlimited" if p["capacity_tokens"] is None else num(p["capacity_tokens"])
        b.add_row(cap, pct(p["hit_rate"]), num(p["evictions"]), num(p["failed"]))
    out: list = [a, b]
    if sw.get("block_size_skipped"):
        out.insert(1, Text(f"Block sizes skipped (larger than the capacity of "
                           f"{r['capacity_tokens']:,} tokens): "
                           + ", ".join(map(str, sw["block_size_skipped"])), style="italic"))
    return out


def _breakers(r: dict, con: Console) -> None:
    br = r["breakers"]
    con.print(Text(f"Top cache breakers ({br['requests']} requests, {br['tokens_cost']:,} "
                   "cacheable tokens lost; ⟦ marks the divergence)", style="italic"))
    for i, g in enumerate(br["groups"], 1):
        e = g["example"]
        pos = f"token {e['divergence_token']:,}"
        if e.get("divergence_char") is not None:
            pos += f", char {e['divergence_char']:,}"
        con.print(Text(f"{i:>2}. {g['key']}: {g['count']:,} requests, "
                       f"{g['tokens_cost']:,} tokens lost", style="bold"))
        con.print(Text(f"    e.g. {e['request_id']} vs {e['partner_id']}: diverges at {pos}; "
                       f"{e['span_tokens']}-token span, then {e['shared_after']:,} shared, "
                       f"{e['tokens_cost']:,} lost"))
        con.print(Text(f"    this:    {e['context']!r}"))
        con.print(Text(f"    earlier: {e['partner_context']!r}"))


def _tree(r: dict) -> Table:
    tr = r["tree"]
    t = Table(title=(f"Prefix-sharing tree ({tr['block_size']}-token pages): "
                     f"{tr['nodes']:,} distinct pages, {tr['prompt_pages']:,} prompt pages "
                     f"(sharing x{tr['sharing_factor']:.1f}), {tr['roots']} roots, "
                     f"{tr['branch_points']} branch points, {tr['leaves']} leaves, depth "
                     f"max {tr['max_depth_tokens']:,} / mean {tr['mean_depth_tokens']:,.0f} "
                     "tokens"), title_justify="left")
    t.add_column("shared prefix", justify="right")
    t.add_column("requests", justify="right")
    t.add_column("tokens saved", justify="right")
    t.add_column("ends with")
    for p in tr["top_prefixes"]:
        t.add_row(f"{p['tokens']:,} tokens", num(p["requests"]), num(p["saved_tokens"]),
                  repr(p["text_end"][-60:]))
    return t


def _costs(r: dict) -> list[Table | Text]:
    costs = r.get("costs") or []
    if not costs:
        return []
    t = Table(title="Cost: flat price vs cache-aware (read ratio r, hit share h)",
              title_justify="left")
    t.add_column("sheet", no_wrap=True)
    for c in ("flat", "cache-aware", "savings", "h", "r", "flat/aware (input)",
              "1/(h·r+1−h)", "writes", "storage"):
        t.add_column(c, justify="right")
    for c in costs:
        cur = c["currency"]
        t.add_row(c["label"], money(c["flat"], cur), money(c["cache_aware"], cur),
                  money(c["savings"], cur), pct(c["hit_share"]), f"{c['read_ratio']:.3f}",
                  f"{c['input_ratio']:.2f}x", f"{c['formula_ratio']:.2f}x",
                  num(c["write_tokens"]), money(c["storage"], cur))
    out: list = [t]
    subs = dict.fromkeys(  # the same for every mode of a sheet: once per provider
        (c["provider"], x["requests"], x["model"] or "(no model)", x["row"], x["how"])
        for c in costs for x in c.get("substitutions", []))
    if subs:
        out.append(Text("Requests priced at another model's rates:\n" + "\n".join(
            f"  {prov}: {n:,} requests of {model} priced as {row} ({how})"
            for prov, n, model, row, how in subs)
            + "\n  (map a model to a row with --price-model LOG_MODEL=SHEET_MODEL)",
            style="italic"))
    tenants = sorted({k for c in costs for k in c["per_tenant"]})
    if len(tenants) > 1:
        s = Table(title="Savings per tenant", title_justify="left")
        s.add_column("sheet", no_wrap=True)
        for name in tenants:
            s.add_column(name or "(none)", justify="right")
        for c in costs:
            s.add_row(c["label"], *[money(c["per_tenant"].get(n, {}).get("savings", 0.0),
                                          c["currency"]) for n in tenants])
        out.append(s)
    rec = [c for c in costs if c.get("recorded")]
    if rec:
        u = Table(title="Recorded usage priced by the matching sheet", title_justify="left")
        u.add_column("sheet", no_wrap=True)
        for c in ("calls", "prompt", "cached", "writes", "output", "hit rate", "cost",
                  "cost in log"):
            u.add_column(c, justify="right")
        for c in rec:
            x = c["recorded"]
            u.add_row(c["label"], num(x["requests"]), num(x["prompt_tokens"]),
                      num(x["cached_tokens"]), num(x["write_tokens"]), num(x["output_tokens"]),
                      pct(x["hit_rate"]), money(x["cost"], c["currency"]),
                      money(x["logged_cost"], c["currency"]) if x["logged_cost"] is not None
                      else "-")
        out.append(u)
    return out


def _validation(r: dict) -> Table | None:
    v = r.get("validation")
    if not v:
        return None
    t = Table(title=f"Replay vs recorded cache hits ({', '.join(v['providers'])}, "
                    f"{v['calls']} calls, block size {v['block_size']})",
              show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    t.add_row("prompt tokens (replayed / recorded)",
              f"{v['replayed_prompt_tokens']:,} / {v['recorded_prompt_tokens']:,} "
              f"(x{v['token_ratio']:.3f})")
    t.add_row("hit rate (replayed / recorded)",
              f"{pct(v['replayed_hit_rate'])} / {pct(v['recorded_hit_rate'])}")
    t.add_row("per-call |difference|, mean", f"{100 * v['mean_abs_diff']:.1f} points")
    t.add_row("calls within 5 points", pct(v["within_5_points"]))
    t.add_row("replay higher / recorded higher (> 5 points)",
              f"{v['replayed_higher']} / {v['recorded_higher']}")
    return t


def print_report(r: dict, console: Console | None = None, calls: int | None = 0) -> None:
    """Print the report; ``calls``: how many per-call rows (``None``: all, 0: none)."""
    con = console or Console(width=None if sys.stdout.isatty() else 140)
    con.print(_summary(r))
    if len(r["tenants"]) > 1 or any(r["tenants"]):
        con.print(_tenants(r))
    con.print(_turns(r))
    if calls != 0:
        con.print(_calls(r, calls))
    for t in _sweeps(r):
        con.print(t)
    if r["breakers"]["groups"]:
        _breakers(r, con)
    else:
        con.print("No cache breakers found.")
    con.print(_tree(r))
    for t in _costs(r):
        con.print(t)
    v = _validation(r)
    if v is not None:
        con.print(v)
