"""Running estimates of recompute and tier-load cost, and the load-or-recompute choice.

DESIGN: "a tier is used only when loading is estimated to beat recomputing". Both costs are
exponential moving averages of measured wall time: prefill seconds per token (from model
steps that computed prompt tokens) and, per tier, load seconds per page (from loads). Until a
tier has been measured, its hit is loaded (that is how it gets measured); until prefill has
been measured, loads are assumed to win.
"""
from __future__ import annotations

ALPHA = 0.2  # weight of the newest sample


class LoadEstimator:
    """Estimates for one engine.

    Args:
        policy: ``"auto"`` (compare the estimates) or ``"always"`` (always load).

    Raises:
        ValueError: another ``policy``."""

    def __init__(self, policy: str = "auto"):
        if policy not in ("auto", "always"):
            raise ValueError(f"policy must be auto or always, got {policy!r}")
        self.policy = policy
        self.prefill_s_per_token: float | None = None
        self.load_s_per_page: dict[str, float] = {}
        self.skipped_slower = 0  # tier hits not loaded because recompute was estimated faster

    def observe_prefill(self, seconds: float, tokens: int) -> None:
        """A step computed ``tokens`` tokens (some of them prompt tokens) in ``seconds``."""
        if tokens > 0:
            self.prefill_s_per_token = _ema(self.prefill_s_per_token, seconds / tokens)

    def observe_load(self, tier: str, seconds: float, pages: int) -> None:
        """``pages`` pages were loaded from ``tier`` into the pool in ``seconds``."""
        if pages > 0:
            self.load_s_per_page[tier] = _ema(self.load_s_per_page.get(tier), seconds / pages)

    def should_load(self, tier: str, pages: int, tokens: int) -> bool:
        """Whether loading ``pages`` pages from ``tier`` beats recomputing ``tokens``."""
        if self.policy == "always":
            return True
        load, prefill = self.load_s_per_page.get(tier), self.prefill_s_per_token
        if load is None or prefill is None or load * pages < prefill * tokens:
            return True
        self.skipped_slower += 1
        return False

    def as_dict(self) -> dict[str, float]:
        """The estimates in microseconds (``-1`` when not measured yet)."""
        out = {"est_prefill_us_per_token": _us(self.prefill_s_per_token),
               "tier_hits_skipped_slower": float(self.skipped_slower)}
        for tier in ("host", "disk", "redis"):
            out[f"est_{tier}_load_us_per_page"] = _us(self.load_s_per_page.get(tier))
        return out


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - ALPHA) * old + ALPHA * new


def _us(seconds: float | None) -> float:
    return -1.0 if seconds is None else seconds * 1e6
