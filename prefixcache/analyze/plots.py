"""PNG plots of an analysis report (matplotlib, no display needed)."""
from __future__ import annotations

from pathlib import Path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(r: dict, out_dir: str | Path) -> list[Path]:
    """Write ``hit_rate_vs_block_size.png``, ``hit_rate_vs_capacity.png`` and
    ``hit_rate_per_call.png`` (those the report has data for); returns their paths."""
    plt = _plt()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    sw = r.get("sweeps")
    if sw and sw["block_size"]:
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [p["block_size"] for p in sw["block_size"]]
        ax.plot(xs, [100 * p["hit_rate"] for p in sw["block_size"]], marker="o")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("block size (tokens per page)")
        ax.set_ylabel("hit rate (%)")
        cap = r["capacity_tokens"]
        ax.set_title("Hit rate vs block size"
                     + (f" (capacity {cap:,} tokens)" if cap else " (unlimited capacity)"))
        ax.grid(True, alpha=0.3)
        written.append(_save(fig, out / "hit_rate_vs_block_size.png", plt))
    if sw and sw["capacity"]:
        fig, ax = plt.subplots(figsize=(6, 4))
        finite = [p for p in sw["capacity"] if p["capacity_tokens"] is not None]
        ax.plot([p["capacity_tokens"] for p in finite], [100 * p["hit_rate"] for p in finite],
                marker="o", label=f"block size {r['block_size']}")
        ax.axhline(100 * r["hit_rate_unbounded"], ls="--", color="gray", label="unlimited")
        ax.set_xscale("log")
        kv = r.get("kv_bytes_per_token")
        ax.set_xlabel("capacity (tokens)" + (f"; x {kv:,} B/token = bytes" if kv else ""))
        ax.set_ylabel("hit rate (%)")
        ax.set_title("Hit rate vs cache capacity")
        ax.grid(True, alpha=0.3)
        ax.legend()
        written.append(_save(fig, out / "hit_rate_vs_capacity.png", plt))
    calls = r.get("calls") or []
    if calls:
        fig, ax = plt.subplots(figsize=(8, 4))
        xs = list(range(len(calls)))
        ax.plot(xs, [100 * c["hit_rate"] for c in calls], lw=1, label="replayed")
        rec = [100 * c["recorded"]["cached_tokens"] / c["recorded"]["prompt_tokens"]
               if c.get("recorded") and c["recorded"]["prompt_tokens"] else None for c in calls]
        if any(x is not None for x in rec):
            ax.plot(xs, [x if x is not None else float("nan") for x in rec], lw=1,
                    label="recorded (provider usage)")
        ax.set_xlabel("call (log order)")
        ax.set_ylabel("hit rate (%)")
        ax.set_title(f"Per-call hit rate (block size {r['block_size']})")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right")
        written.append(_save(fig, out / "hit_rate_per_call.png", plt))
    return written


def _save(fig, path: Path, plt) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
