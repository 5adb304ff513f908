"""Replayed hit rates against the hit rates a provider recorded for the same calls."""
from __future__ import annotations

from prefixcache.analyze.records import TokenizedRequest
from prefixcache.analyze.replay import ReplayResult

CLOSE = 0.05  # "close": within 5 percentage points


def compare_recorded(requests: list[TokenizedRequest], result: ReplayResult) -> dict | None:
    """Per-call comparison over the calls that carry recorded usage (``None`` if none).

    Rates are per call: cached / prompt tokens, each side in its own tokens.
    """
    rows = [(u, c) for tr, c in zip(requests, result.calls)
            if (u := tr.request.usage) is not None and u.prompt_tokens > 0]
    if not rows:
        return None
    diffs, higher, lower = [], 0, 0
    rec_p = rec_c = rep_p = rep_c = 0
    for u, c in rows:
        rec = u.cached_tokens / u.prompt_tokens
        rep = c.cached_tokens / c.prompt_tokens if c.prompt_tokens else 0.0
        diffs.append(rep - rec)
        higher += rep > rec + CLOSE
        lower += rep < rec - CLOSE
        rec_p += u.prompt_tokens
        rec_c += u.cached_tokens
        rep_p += c.prompt_tokens
        rep_c += c.cached_tokens
    n = len(rows)
    return {
        "calls": n,
        "providers": sorted({u.provider for u, _ in rows}),
        "block_size": result.block_size,
        "recorded_prompt_tokens": rec_p, "replayed_prompt_tokens": rep_p,
        "token_ratio": rep_p / rec_p if rec_p else 0.0,
        "recorded_cached_tokens": rec_c, "replayed_cached_tokens": rep_c,
        "recorded_hit_rate": rec_c / rec_p if rec_p else 0.0,
        "replayed_hit_rate": rep_c / rep_p if rep_p else 0.0,
        "mean_abs_diff": sum(abs(d) for d in diffs) / n,
        "mean_diff": sum(diffs) / n,
        "within_5_points": sum(abs(d) <= CLOSE for d in diffs) / n,
        "replayed_higher": higher, "recorded_higher": lower,
    }
